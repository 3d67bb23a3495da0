"""Server settings: one typed object per process, passed into ``create_app(settings)``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from platformdirs import user_data_dir
from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SWARMHUB_", extra="ignore")

    environment: Literal["development", "production", "test"] = "development"
    data_dir: Path = Field(default_factory=lambda: Path(user_data_dir("swarmhub")))
    database_url: str = ""  # empty: a SQLite file in data_dir
    public_url: str = ""  # how browsers and workers reach us; empty: taken from each request
    swarm_enabled: bool = True  # run a bootstrap + monitor peer per running experiment
    swarm_host: str = "127.0.0.1"  # interface the swarm peers listen on (0.0.0.0 to accept the internet)
    swarm_token_minutes: float = Field(default=60.0, gt=0, le=60)  # swarm access tokens live at most an hour
    cookie_secure: bool = False  # set in production behind HTTPS
    session_days: int = 14
    device_code_minutes: int = 10
    active_window_seconds: int = 30  # a worker that reported within this window counts as active
    live_interval_seconds: float = 1.0  # dashboards get at most one push per interval per experiment
    redis_url: str = ""  # redis://host:6379/0: live dashboard updates fan out across server processes
    redis_channel: str = "swarmhub:live"  # the pub/sub channel (one per deployment sharing a Redis)
    metrics_token: str = ""  # when set, GET /metrics (Prometheus) needs "Authorization: Bearer <it>"

    @model_validator(mode="after")
    def _defaults(self) -> Settings:
        if not self.database_url:
            self.database_url = f"sqlite:///{self.data_dir / 'swarmhub.db'}"
        if self.environment == "production" and not self.cookie_secure:
            raise ValueError("production needs SWARMHUB_COOKIE_SECURE=true (serve it over HTTPS)")
        return self
