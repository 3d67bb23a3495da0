"""The files the background service shares: what its ``join`` child writes about its progress
(``--progress-file``), and what the runner writes of its own state for ``swarmhub service status``. Each is written
whole (renamed into place), so a reader never sees half of one."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ValidationError


class JoinProgress(BaseModel):
    """What a ``join --progress-file`` child writes about every two seconds."""

    experiment: str
    step: int
    samples: int
    samples_per_second: float
    loss: float
    peers: int
    unacked_reports: int | None = None
    last_ack_at: datetime | None = None  # when the server last acknowledged a metric report
    updated_at: datetime


class ServiceState(BaseModel):
    """What the background worker is doing, for ``swarmhub service status``."""

    state: Literal["running", "paused", "waiting", "stopped"]
    reason: str | None = None
    experiment: str | None = None
    chosen: str | None = None  # why this experiment: its place in the list, a share's slice, or the most needed
    pid: int | None = None  # the runner's
    restarts: int = 0
    last_exit_code: int | None = None
    progress: JoinProgress | None = None
    updated_at: datetime


def write_json_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def read_state(path: Path) -> ServiceState | None:
    try:
        return ServiceState.model_validate_json(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValidationError, ValueError):
        return None


def read_progress(path: Path) -> JoinProgress | None:
    try:
        return JoinProgress.model_validate_json(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValidationError, ValueError):
        return None
