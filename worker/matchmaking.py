"""How often a peer that looks for an averaging group asks the DHT who else is looking: at most once per poll
interval, set by the experiment's matchmaking time, where hivemind asks as fast as the DHT answers.

hivemind 1.1.12's matchmaking (``hivemind.averaging.matchmaking.PotentialLeaders``) re-reads its group key whenever
its queue of potential leaders is empty or holds no leader earlier than its own declaration: ``pop_next_leader``
sets ``update_triggered`` and ``_update_queue_periodically`` answers with another ``GroupKeyManager.get_averagers``
at once, in a loop with no pause. So for the whole of a search (``matchmaking_time``, seconds, every epoch and for
each of a peer's two averagers) a peer sends DHT lookups back to back, and every lookup is a request to several
peers (then signed, and each answer too: swarm protocol 1). Measured on two digits volunteers and the server's peers
on 127.0.0.1: each volunteer's DHT sent about 170 find requests a second, nearly all for the two group keys, and
the DHT processes and their ``p2pd`` were most of the swarm's CPU (the trainers themselves 0.01 cores).

:func:`install` makes every ``get_averagers`` of one key manager wait until the poll interval has passed since its
previous one: a quarter of the experiment's ``matchmaking_time``, between ``MIN_POLL_SECONDS`` and
``MAX_POLL_SECONDS`` (:func:`poll_seconds`). A leader declares its group at least ``matchmaking_time`` ahead, so a
follower sees a newly declared leader with three quarters of that window left. A search's first lookup is not
delayed. The lookup itself, and who may join whom, are hivemind's, unchanged, so peers with and without it match with
each other.

A peer that looks for a group all the time (the server's witness) would otherwise read the key five times a second
for as long as it runs, and each read is a request that every other peer answers: at a 3 s matchmaking time it now
reads 1.3 times a second.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

# The least time between two lookups of the peers looking for a group, per averager: a quarter of the matchmaking
# time, within these bounds.
MIN_POLL_SECONDS = 0.2
MAX_POLL_SECONDS = 1.0


def poll_seconds(matchmaking_time: float) -> float:
    """The least time between two group lookups of an averager whose matchmaking time is ``matchmaking_time``."""
    return min(max(matchmaking_time / 4, MIN_POLL_SECONDS), MAX_POLL_SECONDS)


def install(poll: float = MIN_POLL_SECONDS) -> None:
    """Pace hivemind's group lookups to one per ``poll`` seconds per averager (in this process and in the averager
    processes it forks after this call)."""
    from hivemind.averaging.key_manager import GroupKeyManager

    original = getattr(GroupKeyManager.get_averagers, "__swarmhub_original__", GroupKeyManager.get_averagers)

    async def get_averagers(self: Any, group_key: Any, only_active: bool) -> Any:
        last = getattr(self, "_swarmhub_last_lookup", None)
        if last is not None:
            wait = last + poll - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        self._swarmhub_last_lookup = time.monotonic()
        return await original(self, group_key, only_active)

    get_averagers.__swarmhub_original__ = original  # type: ignore[attr-defined]
    get_averagers.__doc__ = original.__doc__
    GroupKeyManager.get_averagers = get_averagers  # type: ignore[method-assign]


def uninstall() -> None:
    """Put hivemind's own lookup back (for a process that builds plain hivemind peers after swarmhub's)."""
    from hivemind.averaging.key_manager import GroupKeyManager

    original = getattr(GroupKeyManager.get_averagers, "__swarmhub_original__", None)
    if original is not None:
        GroupKeyManager.get_averagers = original  # type: ignore[method-assign]
