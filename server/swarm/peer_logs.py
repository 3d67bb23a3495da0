"""The logs of the server's peer processes, capped on disk.

A peer process writes its log (hivemind's and ours) to a pipe; a thread of the server copies it into
``<name>.log``, which is rotated at ``max_bytes`` with ``backups`` older files kept (``<name>.log.1`` is the
newest of them). Some of those lines are written on a stranger's request: every refused averaging call logs a
warning, and anyone who can reach a peer's port can make as many calls as they like. Capped, a peer's logs never
take more than ``(backups + 1) * max_bytes`` of disk, whatever comes in.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import IO

logger = logging.getLogger(__name__)

MAX_BYTES = 10 * 2**20  # SWARMHUB_PEER_LOG_MAX_MB
BACKUPS = 2
CHUNK = 64 * 1024


class CappedLog:
    """An append-only file rotated at ``max_bytes`` (a write that would pass the cap starts a new file)."""

    def __init__(self, path: Path, max_bytes: int = MAX_BYTES, backups: int = BACKUPS):
        self.path, self.max_bytes, self.backups = Path(path), max(1, max_bytes), max(0, backups)
        self._file = open(self.path, "ab")  # noqa: SIM115 - closed by close()
        self._size = self._file.tell()

    def write(self, data: bytes) -> None:
        while data:
            if self._size >= self.max_bytes:
                self._rotate()
            piece = data[: self.max_bytes - self._size]
            self._file.write(piece)
            self._file.flush()
            self._size += len(piece)
            data = data[len(piece) :]

    def _rotate(self) -> None:
        self._file.close()
        for index in range(self.backups, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{index}")
            newer = self.path.with_name(f"{self.path.name}.{index - 1}") if index > 1 else self.path
            if index == self.backups and older.exists():
                older.unlink()
            if newer.exists():
                os.replace(newer, older)
        if self.backups == 0:
            self.path.unlink(missing_ok=True)
        self._file = open(self.path, "ab")  # noqa: SIM115 - closed by close()
        self._size = 0

    def close(self) -> None:
        self._file.close()


def copy_to_log(stream: IO[bytes], path: Path, max_bytes: int = MAX_BYTES, backups: int = BACKUPS) -> threading.Thread:
    """Copy ``stream`` (a child's stdout or stderr, binary) into a :class:`CappedLog` at ``path`` until it closes,
    in a daemon thread (returned, started)."""

    def run() -> None:
        log = CappedLog(path, max_bytes, backups)
        try:
            while True:
                data = stream.read1(CHUNK) if hasattr(stream, "read1") else stream.read(CHUNK)
                if not data:
                    return
                log.write(data)
        except (OSError, ValueError) as exc:  # the pipe or the disk failed: the peer goes on, unlogged
            logger.warning("stopped copying a peer's log into %s: %r", path, exc)
        finally:
            log.close()

    thread = threading.Thread(target=run, daemon=True, name=f"log-{path.name}")
    thread.start()
    return thread
