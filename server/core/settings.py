"""Server settings: one typed object per process, passed into ``create_app(settings)``."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Literal

from platformdirs import user_data_dir
from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SWARMHUB_", extra="ignore")

    environment: Literal["development", "production", "test"] = "development"
    data_dir: Path = Field(default_factory=lambda: Path(user_data_dir("swarmhub")))
    database_url: str = ""  # empty: a SQLite file in data_dir
    public_url: str = ""  # how browsers and workers reach us; empty: taken from each request
    swarm_enabled: bool = True  # run a bootstrap + monitor peer per running experiment
    swarm_host: str = "127.0.0.1"  # interface the swarm peers listen on (0.0.0.0 to accept the internet)
    swarm_ports: str = ""  # "40000-40099": TCP ports the swarm peers take (open them in the firewall); empty: random
    swarm_announce_host: str = ""  # public IP or DNS name workers dial (behind NAT/docker); empty: what peers listen on
    swarm_token_minutes: float = Field(default=60.0, gt=0, le=60)  # swarm access tokens live at most an hour
    # Every replica on one database must use the same lease: a replica that dies is replaced within one lease
    # and one reconcile interval (each replica's reconcile renews its leases and takes expired ones)
    swarm_lease_seconds: float = Field(default=15.0, ge=2, le=600)
    swarm_reconcile_seconds: float = Field(default=5.0, gt=0, le=60)
    cookie_secure: bool = False  # set in production behind HTTPS
    # minimal: Argon2id at its least cost, for test suites only
    password_hashing: Literal["standard", "minimal"] = "standard"  # noqa: S105 - a choice of parameters
    session_days: int = 14
    device_code_minutes: int = 10
    active_window_seconds: int = 30  # a worker that reported within this window counts as active
    # An open report socket checks its login again this often: a token revoked (or expired) meanwhile closes it
    login_recheck_seconds: float = Field(default=30.0, gt=0, le=3600)
    live_interval_seconds: float = Field(default=0.25, gt=0, le=60)  # at most one dashboard push per interval
    stats_cache_seconds: int = Field(default=300, ge=0, le=86400)  # /api/stats/ exports: regenerated at most this often
    # Reverse proxies (addresses or networks, comma-separated) whose X-Forwarded-For is believed
    # (server/core/proxies.py)
    trusted_proxies: str = ""
    live_max_per_address: int = Field(default=32, ge=1)  # live dashboard sockets one client address holds (per process)
    live_max_per_experiment: int = Field(default=5000, ge=1)  # live sockets on one experiment's dashboard (per process)
    redis_url: str = ""  # redis://host:6379/0: live updates fan out and rate limits are shared across processes
    redis_channel: str = "swarmhub:live"  # pub/sub channel, rate-limit key prefix: one per deployment sharing a Redis
    metrics_token: str = ""  # when set, GET /metrics (Prometheus) needs "Authorization: Bearer <it>"
    # A folder holding swarmhub-{version}-py3-none-any.whl, the worker this hub serves volunteers; empty: built once
    # from the source tree the server runs from (server/http/worker_package.py)
    worker_wheel_dir: Path | None = None
    corpus_max_mb: float = Field(default=64.0, gt=0, le=4096)  # the largest training text an organizer may upload
    # The largest archive of images an organizer may upload (MiB), for a task that trains on images
    corpus_images_max_mb: float = Field(default=1024.0, gt=0, le=16384)
    corpus_dir: Path | None = None  # a folder of *.txt files organizers may pick as training text (server-side)
    checkpoints_kept: int = Field(default=3, ge=1, le=1000)  # model checkpoints kept on disk per experiment
    body_max_mb: float = Field(default=1.0, gt=0, le=4096)  # the largest request body (MiB) but corpus uploads
    # What one account may hold (administrators are exempt): each running experiment costs the server a bootstrap
    # peer, ports, and maybe an auxiliary and a checkpoint peer; each corpus costs disk.
    quota_running_experiments: int = Field(default=2, ge=0)  # experiments one account runs at once
    quota_experiments_per_day: int = Field(default=10, ge=0)  # experiments one account creates in 24 hours
    quota_server_peers: int = Field(default=4, ge=0)  # auxiliary and checkpoint peers run for one account's experiments
    quota_corpus_mb: float = Field(default=2048.0, ge=0)  # training text (MiB) stored for one account's experiments
    quota_teams_per_day: int = Field(default=3, ge=0)  # teams one account creates in 24 hours

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies(cls, value: str) -> str:
        from swarmhub.server.core.proxies import parse_networks

        try:
            parse_networks(value)
        except ValueError as exc:
            raise ValueError(f"SWARMHUB_TRUSTED_PROXIES: {exc}") from None
        return value

    @field_validator("swarm_host")
    @classmethod
    def _listen_host(cls, value: str) -> str:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(
                f"SWARMHUB_SWARM_HOST={value!r} is not an IP address: the interface the swarm peers listen on, "
                "such as 127.0.0.1 or 0.0.0.0"
            ) from None
        return value

    @field_validator("swarm_ports")
    @classmethod
    def _ports(cls, value: str) -> str:
        port_range(value)
        return value

    @field_validator("swarm_announce_host")
    @classmethod
    def _announce_host(cls, value: str) -> str:
        if value and not _is_public_host(value):
            raise ValueError(
                f"SWARMHUB_SWARM_ANNOUNCE_HOST={value!r} is not an IP address or a DNS name: the address workers "
                "dial the swarm peers at, such as 203.0.113.7 or hub.example.org (no scheme, no port)"
            )
        return value

    @model_validator(mode="after")
    def _defaults(self) -> Settings:
        if not self.database_url:
            self.database_url = f"sqlite:///{self.data_dir / 'swarmhub.db'}"
        if self.environment == "production" and not self.cookie_secure:
            raise ValueError("production needs SWARMHUB_COOKIE_SECURE=true (serve it over HTTPS)")
        if self.swarm_announce_host and not self.swarm_ports:
            # hivemind cannot announce a port it does not know in advance, and a NAT must forward known ports
            raise ValueError("SWARMHUB_SWARM_ANNOUNCE_HOST needs SWARMHUB_SWARM_PORTS (the ports forwarded to us)")
        if self.password_hashing != "standard" and self.environment != "test":  # noqa: S105
            raise ValueError("SWARMHUB_PASSWORD_HASHING=minimal is for SWARMHUB_ENVIRONMENT=test only")
        if self.swarm_lease_seconds < 2 * self.swarm_reconcile_seconds:
            # a lease renewed once per reconcile must outlive one late reconcile
            raise ValueError("SWARMHUB_SWARM_LEASE_SECONDS must be at least twice SWARMHUB_SWARM_RECONCILE_SECONDS")
        return self

    @property
    def swarm_port_range(self) -> range | None:
        """The ports the swarm peers take, or None for random ones."""
        return port_range(self.swarm_ports)


_DNS_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def _is_public_host(host: str) -> bool:
    try:
        return not ipaddress.ip_address(host).is_unspecified
    except ValueError:
        pass
    labels = host.removesuffix(".").split(".")
    return (
        len(host) <= 253
        and all(_DNS_LABEL.fullmatch(label) for label in labels)
        and not labels[-1].isdigit()  # 300.1.2.3 is a broken IP address, not a name
    )


def port_range(text: str) -> range | None:
    """``"40000-40099"`` (or one port, ``"40000"``) as a range; None when empty. ValueError when malformed."""
    text = text.strip()
    if not text:
        return None
    match = re.fullmatch(r"(\d{1,5})\s*(?:-\s*(\d{1,5}))?", text)
    low, high = (int(match[1]), int(match[2] or match[1])) if match else (0, -1)
    if not match or not 1 <= low <= high <= 65535:
        raise ValueError(
            f"SWARMHUB_SWARM_PORTS={text!r} is not a port range: FIRST-LAST with 1 <= FIRST <= LAST <= 65535, "
            "such as 40000-40099 (empty: random ports)"
        )
    return range(low, high + 1)


def tcp_maddr(host: str, port: int) -> str:
    """The multiaddr of TCP ``port`` at ``host`` (an IPv4 or IPv6 address, or a DNS name)."""
    try:
        version = ipaddress.ip_address(host).version
    except ValueError:
        return f"/dns/{host.removesuffix('.')}/tcp/{port}"
    return f"/ip{version}/{host}/tcp/{port}"
