"""Live dashboard updates: viewers subscribe per experiment; at most one push per interval each.

Every server process keeps its own viewers. A process that learns that an experiment's numbers changed (a
worker reported to it, its monitor peer read the swarm) marks the experiment; once per interval it builds one
snapshot per marked experiment from the database and pushes it to its viewers. With Redis configured
(``SWARMHUB_REDIS_URL``) each process also publishes its marks on a pub/sub channel and marks what the
others publish, so a dashboard connected to one process sees what workers report to another. Without Redis a
single process works alone. A viewer that does not read is never waited for: its queue holds at most a few
snapshots and the oldest is dropped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

Snapshot = Callable[[str], Awaitable[dict[str, Any] | None]]
logger = logging.getLogger("swarmhub.live")
VIEWER_QUEUE = 4


class LiveHub:
    def __init__(self, interval: float, redis_url: str = "", channel: str = "swarmhub:live"):
        self.interval = interval
        self.redis_url = redis_url
        self.channel = channel
        self.instance = uuid.uuid4().hex  # this process: its own marks come back from Redis and are skipped
        self._subscribers: dict[str, set[asyncio.Queue[dict[str, Any]]]] = defaultdict(set)
        self._dirty: set[str] = set()
        self._outbox: set[str] = set()  # marks to publish for the other processes
        self._redis: Any = None

    def subscribe(self, slug: str) -> asyncio.Queue[dict[str, Any]]:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=VIEWER_QUEUE)
        self._subscribers[slug].add(queue)
        return queue

    def unsubscribe(self, slug: str, queue: asyncio.Queue[dict[str, Any]]) -> None:
        self._subscribers[slug].discard(queue)
        if not self._subscribers[slug]:
            del self._subscribers[slug]

    def mark(self, slug: str) -> None:
        """The experiment's numbers changed (call on the event loop)."""
        if slug in self._subscribers:
            self._dirty.add(slug)
        if self.redis_url:
            self._outbox.add(slug)

    def _mark_remote(self, raw: Any) -> None:
        try:
            message = json.loads(raw)
            if message.get("from") != self.instance:
                for slug in message.get("slugs", [])[:1000]:
                    if isinstance(slug, str) and slug in self._subscribers:
                        self._dirty.add(slug)
        except (ValueError, AttributeError, TypeError):
            logger.warning("ignoring a malformed live message: %.200r", raw)

    async def run(self, snapshot: Snapshot) -> None:
        """Push a fresh snapshot to the viewers of every experiment that changed, here or elsewhere."""
        listener = asyncio.create_task(self._listen()) if self.redis_url else None
        try:
            while True:
                await asyncio.sleep(self.interval)
                await self._publish()
                dirty, self._dirty = self._dirty, set()
                for slug in dirty:
                    data = await snapshot(slug)
                    if data is None:
                        continue
                    for queue in list(self._subscribers.get(slug, ())):
                        if queue.full():  # a slow viewer skips a frame rather than holding everyone up
                            queue.get_nowait()
                        queue.put_nowait(data)
        finally:
            if listener is not None:
                listener.cancel()
            if self._redis is not None:
                await self._redis.aclose()

    async def _connection(self) -> Any:
        if self._redis is None:
            import redis.asyncio as redis

            self._redis = redis.from_url(self.redis_url, socket_timeout=5, socket_connect_timeout=5)
        return self._redis

    async def _publish(self) -> None:
        if not self._outbox:
            return
        slugs, self._outbox = sorted(self._outbox), set()
        try:
            connection = await self._connection()
            await connection.publish(self.channel, json.dumps({"from": self.instance, "slugs": slugs}))
        except Exception as exc:  # Redis down: this process's own viewers still get their updates
            logger.warning("could not publish live marks to Redis: %r", exc)

    async def _listen(self) -> None:
        backoff = 1.0
        while True:
            try:
                connection = await self._connection()
                async with connection.pubsub() as pubsub:
                    await pubsub.subscribe(self.channel)
                    backoff = 1.0
                    async for message in pubsub.listen():
                        if message.get("type") == "message":
                            self._mark_remote(message["data"])
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("live fan-out from Redis interrupted (%r): retrying in %.0f s", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
