"""The worker's metric spool: every report is on disk before it is sent, until the server acknowledges it.

One folder per server, user and experiment; in it, per worker run, ``{worker_id}.jsonl`` (one message a line,
in order) and ``{worker_id}.acked`` (the highest sequence number the server acknowledged). A worker that
crashes, loses power or is killed leaves its unacknowledged reports there, and the next ``swarmhub join`` of
that experiment sends them first (to the run they belong to; the server stores each exactly once).

The spool is bounded: past ``max_messages`` unacknowledged reports it drops the oldest and says how many.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGES = 10_000


class Spool:
    def __init__(self, folder: Path, worker_id: str, max_messages: int = DEFAULT_MAX_MESSAGES):
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.folder = folder
        self.worker_id = worker_id
        self.max_messages = max_messages
        self.path = folder / f"{worker_id}.jsonl"
        self.acked_path = folder / f"{worker_id}.acked"
        self.dropped = 0
        self._lines = sum(1 for _ in self.path.open()) if self.path.exists() else 0
        self._acked = self._read_acked()
        self._handle = self.path.open("a", encoding="utf-8")

    def _read_acked(self) -> int:
        try:
            return int(self.acked_path.read_text().strip())
        except (OSError, ValueError):
            return -1

    def append(self, seq: int, data: str) -> None:
        self._handle.write(data + "\n")
        self._handle.flush()
        self._lines += 1
        if self._lines > 2 * self.max_messages:
            self._compact()

    def ack(self, seq: int) -> None:
        if seq <= self._acked:
            return
        self._acked = seq
        tmp = self.acked_path.with_suffix(".acked.tmp")
        tmp.write_text(str(seq))
        os.replace(tmp, self.acked_path)

    def unacked(self) -> list[tuple[int, str]]:
        """The messages the server has not acknowledged, in order (a torn last line is skipped)."""
        pending = []
        if self.path.exists():
            with self.path.open(encoding="utf-8") as handle:
                for line in handle:
                    try:
                        seq = int(json.loads(line)["seq"])
                    except (ValueError, KeyError, TypeError):
                        continue
                    if seq > self._acked:
                        pending.append((seq, line.rstrip("\n")))
        return pending

    def _compact(self) -> None:
        pending = self.unacked()
        if len(pending) > self.max_messages:
            dropped = len(pending) - self.max_messages
            self.dropped += dropped
            logger.warning(
                "metric spool full: dropped the %d oldest unacknowledged reports (%d so far)", dropped, self.dropped
            )
            pending = pending[dropped:]
        self._handle.close()
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(data + "\n" for _, data in pending), encoding="utf-8")
        os.replace(tmp, self.path)
        self._lines = len(pending)
        self._handle = self.path.open("a", encoding="utf-8")

    def close(self, *, done: bool) -> None:
        """Close; with ``done`` (everything acknowledged) the spool's files go."""
        self._handle.close()
        if done and not self.unacked():
            for path in (self.path, self.acked_path):
                path.unlink(missing_ok=True)


def discard(folder: Path, worker_id: str) -> None:
    """Forget a worker run's spool (the server no longer knows the run: nothing there will ever be stored)."""
    for suffix in (".jsonl", ".acked"):
        (folder / f"{worker_id}{suffix}").unlink(missing_ok=True)


def leftovers(folder: Path) -> list[str]:
    """Worker runs of earlier sessions whose spools still hold reports."""
    if not folder.is_dir():
        return []
    return sorted(path.stem for path in folder.glob("*.jsonl") if path.stat().st_size > 0)
