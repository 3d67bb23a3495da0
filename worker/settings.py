"""The worker's settings: one typed object, built by the CLI from the environment (prefix ``SWARMHUB_``).

Nothing here reads the environment at import time: ``WorkerSettings()`` does, when the CLI constructs it.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from platformdirs import user_cache_dir, user_config_dir, user_state_dir
from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

APP_NAME = "swarmhub"


class WorkerSettings(BaseSettings):
    """``SWARMHUB_SERVER`` and ``SWARMHUB_TOKEN`` override the stored credentials when set."""

    model_config = SettingsConfigDict(env_prefix="SWARMHUB_", extra="ignore")

    server: str | None = Field(default=None, description="Server URL, e.g. https://swarm.example.org")
    token: SecretStr | None = Field(default=None, description="API token (overrides the stored one)")
    # platformdirs honours XDG_CONFIG_HOME / XDG_STATE_HOME; the factories run at construction, not import.
    config_dir: Path = Field(default_factory=lambda: Path(user_config_dir(APP_NAME)))
    state_dir: Path = Field(default_factory=lambda: Path(user_state_dir(APP_NAME)), description="Logs")
    cache_dir: Path = Field(
        default_factory=lambda: Path(user_cache_dir(APP_NAME)), description="Downloaded corpora (safe to delete)"
    )

    @field_validator("server", mode="before")
    @classmethod
    def _blank_server_is_unset(cls, value: object) -> object:
        if isinstance(value, str):
            value = value.strip()
            return value.rstrip("/") or None
        return value

    @field_validator("token", mode="before")
    @classmethod
    def _blank_token_is_unset(cls, value: object) -> object:
        if isinstance(value, str) and not value.strip():
            return None
        return value.strip() if isinstance(value, str) else value

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    def identity_path(self, server_url: str, username: str, slug: str) -> Path:
        """This machine's peer key for one user and experiment (see ``swarm_access``)."""
        host = urlsplit(server_url).netloc.replace(":", "_") or "server"
        return self.state_dir / "identities" / host / username / f"{slug}.key"

    def corpus_dir(self, server_url: str, slug: str) -> Path:
        """Where the corpus files of one experiment are cached (checked against their sha256 on every use)."""
        host = urlsplit(server_url).netloc.replace(":", "_") or "server"
        return self.cache_dir / "corpora" / host / slug

    def spool_dir(self, server_url: str, username: str, slug: str) -> Path:
        """Where this user's unacknowledged metric reports for one experiment wait (see ``spool``)."""
        host = urlsplit(server_url).netloc.replace(":", "_") or "server"
        return self.state_dir / "spool" / host / username / slug
