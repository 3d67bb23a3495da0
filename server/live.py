"""Live dashboard updates: viewers subscribe per experiment; at most one push per interval each.

An in-process hub: with several server processes, each pushes what its own workers report
(fan-out across processes through Redis is the production follow-up).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

Snapshot = Callable[[str], Awaitable[dict[str, Any] | None]]


class LiveHub:
    def __init__(self, interval: float):
        self.interval = interval
        self._subscribers: dict[str, set[asyncio.Queue[dict[str, Any]]]] = defaultdict(set)
        self._dirty: set[str] = set()

    def subscribe(self, slug: str) -> asyncio.Queue[dict[str, Any]]:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=4)
        self._subscribers[slug].add(queue)
        return queue

    def unsubscribe(self, slug: str, queue: asyncio.Queue[dict[str, Any]]) -> None:
        self._subscribers[slug].discard(queue)
        if not self._subscribers[slug]:
            del self._subscribers[slug]

    def mark(self, slug: str) -> None:
        if slug in self._subscribers:
            self._dirty.add(slug)

    async def run(self, snapshot: Snapshot) -> None:
        """Push a fresh snapshot to the viewers of every experiment that changed."""
        while True:
            await asyncio.sleep(self.interval)
            dirty, self._dirty = self._dirty, set()
            for slug in dirty:
                data = await snapshot(slug)
                if data is None:
                    continue
                for queue in list(self._subscribers.get(slug, ())):
                    if queue.full():  # a slow viewer skips a frame rather than holding everyone up
                        queue.get_nowait()
                    queue.put_nowait(data)
