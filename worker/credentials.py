"""The volunteer's stored login: ``{server, token, username}`` in ``<config_dir>/credentials.json``.

The file is created with mode 0600 (its folder 0700) and replaced atomically, so a crash never leaves a
half-written or world-readable token behind. ``SWARMHUB_TOKEN`` / ``SWARMHUB_SERVER`` override it.
The token is held as a :class:`~pydantic.SecretStr`: it is never printed or logged.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, SecretStr, ValidationError

from swarmhub.worker.settings import WorkerSettings

FILE_NAME = "credentials.json"


class StoredCredentials(BaseModel):
    server: str
    token: SecretStr
    username: str | None = None


@dataclass(frozen=True)
class ResolvedCredentials:
    """Credentials after the environment overrides; ``source`` says where the token came from."""

    server: str | None
    token: SecretStr | None
    username: str | None
    source: str  # "env", "file" or "none"


def credentials_path(config_dir: Path) -> Path:
    return Path(config_dir) / FILE_NAME


def store_credentials(config_dir: Path, creds: StoredCredentials) -> Path:
    """Write the credentials file with mode 0600, atomically (temp file in the same folder, then replace)."""
    directory = Path(config_dir)
    if not directory.exists():
        directory.mkdir(parents=True, mode=0o700)
        os.chmod(directory, 0o700)  # mkdir's mode is filtered by the umask
    path = credentials_path(directory)
    tmp = directory / f".{FILE_NAME}.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)  # O_CREAT only applies the mode to a new file: never reuse a leftover
    payload = {"server": creds.server, "token": creds.token.get_secret_value(), "username": creds.username}
    flags = os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)  # exactly 0600 whatever the umask
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            fd = -1
            json.dump(payload, handle)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    return path


def load_credentials(config_dir: Path) -> StoredCredentials | None:
    """The stored credentials, or None when there are none (a corrupt file counts as none)."""
    try:
        text = credentials_path(config_dir).read_text(encoding="utf-8")
        return StoredCredentials.model_validate_json(text)
    except (FileNotFoundError, ValidationError, ValueError):
        return None


def delete_credentials(config_dir: Path) -> bool:
    """Remove the credentials file; True when there was one."""
    try:
        credentials_path(config_dir).unlink()
    except FileNotFoundError:
        return False
    return True


def resolve_credentials(settings: WorkerSettings) -> ResolvedCredentials:
    """Stored credentials with ``SWARMHUB_SERVER`` / ``SWARMHUB_TOKEN`` taking precedence field by field."""
    stored = load_credentials(settings.config_dir)
    server = settings.server or (stored.server if stored else None)
    if settings.token is not None:
        return ResolvedCredentials(server=server, token=settings.token, username=None, source="env")
    if stored is not None:
        # A token stored for one server is never sent to another one named by SWARMHUB_SERVER.
        if settings.server and settings.server != stored.server:
            return ResolvedCredentials(server=server, token=None, username=None, source="none")
        return ResolvedCredentials(server=server, token=stored.token, username=stored.username, source="file")
    return ResolvedCredentials(server=server, token=None, username=None, source="none")
