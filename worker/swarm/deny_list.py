"""The usernames an organizer removed from an experiment, as a peer's processes see them.

hivemind runs a peer's DHT and averagers in processes forked from the one that starts it, and each of them checks
the list (the DHT's authorizer on every request, the averagers' roster guard on every caller). The process that
made the :class:`DenyList` asks ``source`` every ``interval`` seconds (a worker asks the server; the server's
peers read a file the server keeps) and writes the answer into shared memory that its forked children read:
one request per worker per interval instead of one per process.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import threading
from collections.abc import Callable

from swarmhub.worker.errors import FINAL_REFUSALS, WorkerError

logger = logging.getLogger(__name__)

DENY_POLL_SECONDS = 5.0  # with the roster cache this bounds how long a banned volunteer is still served
SHARED_BYTES = 1 << 16  # the list as JSON; a longer one is asked for by every process on its own, as before


class DenyList:
    """Usernames the organizer removed from the experiment, refreshed in the background; lookups never block on
    the network.

    The shared copy is written by one thread of the owner process only and read under a sequence counter (odd
    while a write is under way), so a reader never takes a lock a fork could have left held."""

    def __init__(self, source: Callable[[], set[str]] | None = None, interval: float = DENY_POLL_SECONDS):
        self._source = source
        self._interval = interval
        self._denied: frozenset[str] = frozenset()
        self._owner = os.getpid()
        self._pid: int | None = None  # the process whose own polling thread runs (a fallback in a forked child)
        self._seen = -1
        self._stop = threading.Event()
        # The source refused for good (FINAL_REFUSALS: a worker's login revoked, say): its training stops with this.
        self.refused: WorkerError | None = None
        if source is None:
            return
        context = multiprocessing.get_context("fork")
        self._sequence = context.RawValue("q", 0)
        self._length = context.RawValue("q", -1)  # -1: no list yet; -2: too long to share
        self._capacity = SHARED_BYTES
        self._buffer = context.RawArray("c", self._capacity)
        self._denied = frozenset(self._safe_read())
        self._share(self._denied)
        self._pid = self._owner
        threading.Thread(target=self._poll, daemon=True, name="swarmhub-denylist").start()

    def _safe_read(self) -> set[str]:
        try:
            return set(self._source()) if self._source else set()
        except Exception as exc:  # keep the last known list while the source is unreachable
            logger.warning("could not refresh the deny-list: %s", getattr(exc, "message", exc))
            if isinstance(exc, WorkerError) and exc.exit_code in FINAL_REFUSALS:
                self.refused = self.refused or exc
            return set(self._denied)

    def close(self) -> None:
        """Stop polling (in this process; a peer's list otherwise polls for as long as the process lives)."""
        self._stop.set()

    def _poll(self) -> None:
        while not self._stop.wait(self._interval):
            self._denied = frozenset(self._safe_read())
            if os.getpid() == self._owner:
                self._share(self._denied)

    def _share(self, names: frozenset[str]) -> None:
        data = json.dumps(sorted(names)).encode()
        self._sequence.value += 1  # odd: readers keep what they had
        if len(data) <= self._capacity:
            self._buffer[: len(data)] = data
            self._length.value = len(data)
        else:
            self._length.value = -2
        self._sequence.value += 1

    def _read_shared(self) -> None:
        sequence = self._sequence.value
        if sequence == self._seen or sequence % 2:
            return
        length = self._length.value
        data = self._buffer.raw[:length] if length >= 0 else b""
        if self._sequence.value != sequence:
            return  # rewritten while read: the next lookup reads it again
        self._seen = sequence
        if length == -2 and self._pid != os.getpid():  # too long to share: this process asks on its own
            self._pid = os.getpid()
            self._denied = frozenset(self._safe_read())
            threading.Thread(target=self._poll, daemon=True, name="swarmhub-denylist").start()
        elif length >= 0:
            self._denied = frozenset(json.loads(data))

    def __contains__(self, username: object) -> bool:
        if self._source is not None and os.getpid() != self._owner and self._pid != os.getpid():
            self._read_shared()
        return username in self._denied
