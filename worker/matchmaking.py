"""How often a peer that looks for an averaging group asks the DHT who else is looking: at most every
``POLL_SECONDS``, where hivemind asks as fast as the DHT answers.

hivemind 1.1.12's matchmaking (``hivemind.averaging.matchmaking.PotentialLeaders``) re-reads its group key whenever
its queue of potential leaders is empty or holds no leader earlier than its own declaration: ``pop_next_leader``
sets ``update_triggered`` and ``_update_queue_periodically`` answers with another ``GroupKeyManager.get_averagers``
at once, in a loop with no pause. So for the whole of a search (``matchmaking_time``, seconds, every epoch and for
each of a peer's two averagers) a peer sends DHT lookups back to back, and every lookup is a signed request to
several peers that each verify it and sign their answer. Measured on two digits volunteers and the server's peers
on 127.0.0.1: each volunteer's DHT sent about 170 find requests a second, nearly all for the two group keys, and
the DHT processes and their ``p2pd`` were most of the swarm's CPU (the trainers themselves 0.01 cores).

:func:`install` makes every ``get_averagers`` of one key manager wait until ``POLL_SECONDS`` have passed since its
previous one. A search's first lookup is not delayed; a follower sees a newly declared leader at most
``POLL_SECONDS`` later, well inside the shortest ``matchmaking_time`` an experiment may set (0.5 s). The lookup
itself, and who may join whom, are hivemind's, unchanged, so peers with and without it match with each other.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

# The least time between two lookups of the peers looking for a group, per averager.
POLL_SECONDS = 0.2


def install() -> None:
    """Pace hivemind's group lookups (in this process and in the averager processes it forks after this call)."""
    from hivemind.averaging.key_manager import GroupKeyManager

    original = getattr(GroupKeyManager.get_averagers, "__swarmhub_original__", GroupKeyManager.get_averagers)

    async def get_averagers(self: Any, group_key: Any, only_active: bool) -> Any:
        last = getattr(self, "_swarmhub_last_lookup", None)
        if last is not None:
            wait = last + POLL_SECONDS - time.monotonic()
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
