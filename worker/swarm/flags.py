"""What a peer refused from whom, and what follows from it (``robust``'s overview says why).

Refusals are counted in :data:`FLAGS` (peer ID -> reasons), which :func:`take_flags` hands to whoever reports
them. A peer flagged with evidence (anything but :data:`LOCAL_REASONS`) is also *distrusted* for
``DISTRUST_SECONDS`` (:func:`distrusted`). The peers this one completed a gradient round with are its *partners*
(:func:`partners`). Reducers and state downloads run in the averager processes hivemind forks: what they see comes
back to the peer's main process through one queue, made by :func:`open_queue` before the fork.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

FLAGS: dict[str, Counter[str]] = {}
_FLAGS_LOCK = threading.Lock()
# Reducers and state downloads run in the averager processes hivemind forks: their flags come back through this
# queue, made by install() before the fork.
_FLAG_QUEUE: Any = None


# Reasons that are evidence of a peer's own data being wrong. An epoch past the bound is not: an honest peer can be
# a few epochs off the swarm for a while (dragged by a forger's records, or just late); it is logged and counted
# on this peer only, and never reported to the server (the witness publishes the other reasons).
LOCAL_REASONS = frozenset({"epoch ahead of the swarm", "state epoch ahead of the swarm"})
# How long a peer flagged with evidence is distrusted (its records not followed, its state not downloaded)
DISTRUST_SECONDS = 600.0
_DISTRUSTED: dict[str, float] = {}  # peer ID -> monotonic time until which it is distrusted (this process)
# A peer this one completed a gradient round with counts as a partner this long (``swarm_epoch.bounded_progress``)
PARTNER_SECONDS = 600.0
_PARTNER = "averaged with"  # not a flag: the queue's marker for a partner
_PARTNERS: dict[str, float] = {}
_MAIN_PID: int | None = None  # the process that drains the flag queue (set by install())


def _note(peer_id: str, reason: str) -> None:
    """Count a flag in this process (the caller holds _FLAGS_LOCK)."""
    if reason == _PARTNER:
        _PARTNERS[peer_id] = time.monotonic() + PARTNER_SECONDS
        return
    FLAGS.setdefault(peer_id, Counter())[reason] += 1
    if reason not in LOCAL_REASONS:
        _DISTRUSTED[peer_id] = time.monotonic() + DISTRUST_SECONDS


def flag(peer_id: str, reason: str) -> None:
    if reason not in LOCAL_REASONS and reason != _PARTNER:
        _DISTRUSTED[peer_id] = time.monotonic() + DISTRUST_SECONDS  # at once in this process too
    if _FLAG_QUEUE is not None:
        try:
            _FLAG_QUEUE.put_nowait((peer_id, reason))
            return
        except Exception:  # noqa: S110 - a full or closed queue: keep the flag in this process
            pass
    with _FLAGS_LOCK:
        _note(peer_id, reason)


def _drain() -> None:
    """Move the flags of the averager processes into this one (the caller holds _FLAGS_LOCK)."""
    import queue

    if _FLAG_QUEUE is None or (_MAIN_PID is not None and os.getpid() != _MAIN_PID):
        return  # only the process that made the queue reads it: a child would take its parent's flags
    while True:
        try:
            peer_id, reason = _FLAG_QUEUE.get_nowait()
        except (queue.Empty, OSError, ValueError):
            return
        _note(peer_id, reason)


def take_flags() -> dict[str, dict[str, int]]:
    """Peer ID -> reason -> count, for everything flagged since the last call (in this process and the
    averager processes forked after :func:`install`)."""
    with _FLAGS_LOCK:
        _drain()
        taken = {peer: dict(reasons) for peer, reasons in FLAGS.items()}
        FLAGS.clear()
    return taken


def averaged_with(peer_ids: Sequence[str]) -> None:
    """This peer completed a gradient round with ``peer_ids`` (called in an averager process)."""
    for peer_id in peer_ids:
        flag(peer_id, _PARTNER)


def partners() -> frozenset[str]:
    """The peers this one completed a gradient round with in the last PARTNER_SECONDS, less the distrusted."""
    gone = distrusted()
    with _FLAGS_LOCK:
        now = time.monotonic()
        for peer in [p for p, until in _PARTNERS.items() if until <= now]:
            del _PARTNERS[peer]
        return frozenset(_PARTNERS) - gone


def distrusted() -> frozenset[str]:
    """The peers flagged with evidence in the last DISTRUST_SECONDS (seen by this process, and in the process
    that called :func:`install` by its averager processes too)."""
    with _FLAGS_LOCK:
        _drain()
        now = time.monotonic()
        for peer in [p for p, until in _DISTRUSTED.items() if until <= now]:
            del _DISTRUSTED[peer]
        return frozenset(_DISTRUSTED)


def open_queue() -> None:
    """Make the queue the averager processes forked after this call send their flags through (this process reads
    it). Call before creating ``hivemind.Optimizer``."""
    global _FLAG_QUEUE, _MAIN_PID
    _MAIN_PID = os.getpid()
    if _FLAG_QUEUE is None:
        import multiprocessing

        _FLAG_QUEUE = multiprocessing.get_context("fork").Queue(maxsize=10_000)
