"""Live dashboard updates: viewers subscribe per experiment; at most one push per interval each.

Every server process keeps its own viewers. A process that learns that an experiment's numbers changed (a
worker reported to it, its monitor peer read the swarm) marks the experiment. Pushes are throttled on the
leading edge: a mark on an experiment whose last push is at least one interval old builds and pushes a
snapshot at once; a mark that comes sooner waits for (last push + interval), and every mark until then rides
on that one push. A viewer thus sees a report without waiting out an interval after a quiet spell, and never
gets more than one push per interval per experiment. Each push builds the snapshot and encodes its JSON once;
every viewer is sent that same text.

With Redis configured (``SWARMHUB_REDIS_URL``) each process also publishes its marks on a pub/sub channel (on
the same leading edge, so at most one message per interval per experiment) and marks what the others publish,
so a dashboard connected to one process sees what workers report to another. Without Redis a single process
works alone. A viewer that does not read is never waited for: its queue holds at most a few snapshots and the
oldest is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

Snapshot = Callable[[str], Awaitable[str | None]]  # the experiment's snapshot as JSON text, None if it is gone
logger = logging.getLogger("swarmhub.live")
VIEWER_QUEUE = 4


class _Throttle:
    """Slugs waiting for their turn: each is due at once, or one interval after its previous turn."""

    def __init__(self, interval: float):
        self.interval = interval
        self.pending: set[str] = set()
        self._last: dict[str, float] = {}

    def due(self, now: float) -> list[str]:
        """Take the pending slugs whose turn it is, and start their next interval now."""
        ready = [slug for slug in self.pending if slug not in self._last or self._last[slug] + self.interval <= now]
        for slug in ready:
            self.pending.discard(slug)
            self._last[slug] = now
        for slug, last in list(self._last.items()):  # an old enough turn counts as none: forget it
            if last + self.interval <= now and slug not in self.pending:
                del self._last[slug]
        return sorted(ready)

    def next_at(self) -> float | None:
        """When the first pending slug is due (None: nothing pending)."""
        return min((self._last.get(slug, 0.0) + self.interval for slug in self.pending), default=None)


class LiveHub:
    def __init__(self, interval: float, redis_url: str = "", channel: str = "swarmhub:live"):
        self.interval = interval
        self.redis_url = redis_url
        self.channel = channel
        self.instance = uuid.uuid4().hex  # this process: its own marks come back from Redis and are skipped
        self._subscribers: dict[str, set[asyncio.Queue[str]]] = defaultdict(set)
        self._dirty = _Throttle(interval)
        self._outbox = _Throttle(interval)  # marks to publish for the other processes
        self._wake: asyncio.Event | None = None  # made by run(), on the loop that serves the viewers
        self._redis: Any = None

    def subscribe(self, slug: str) -> asyncio.Queue[str]:
        queue: asyncio.Queue[str] = asyncio.Queue(maxsize=VIEWER_QUEUE)
        self._subscribers[slug].add(queue)
        return queue

    def unsubscribe(self, slug: str, queue: asyncio.Queue[str]) -> None:
        self._subscribers[slug].discard(queue)
        if not self._subscribers[slug]:
            del self._subscribers[slug]

    def mark(self, slug: str) -> None:
        """The experiment's numbers changed (call on the event loop)."""
        if slug in self._subscribers:
            self._dirty.pending.add(slug)
            self._notify()
        if self.redis_url:
            self._outbox.pending.add(slug)
            self._notify()

    def _notify(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _mark_remote(self, raw: Any) -> None:
        try:
            message = json.loads(raw)
            if message.get("from") != self.instance:
                for slug in message.get("slugs", [])[:1000]:
                    if isinstance(slug, str) and slug in self._subscribers:
                        self._dirty.pending.add(slug)
                        self._notify()
        except (ValueError, AttributeError, TypeError):
            logger.warning("ignoring a malformed live message: %.200r", raw)

    async def run(self, snapshot: Snapshot) -> None:
        """Push a fresh snapshot to the viewers of every experiment that changed, here or elsewhere."""
        loop = asyncio.get_running_loop()
        self._wake = wake = asyncio.Event()
        listener = asyncio.create_task(self._listen()) if self.redis_url else None
        try:
            while True:
                wake.clear()  # marks made while we publish and push below set it again
                await self._publish(self._outbox.due(loop.time()))
                for slug in self._dirty.due(loop.time()):
                    await self._push(slug, snapshot)
                turns = [t for t in (self._dirty.next_at(), self._outbox.next_at()) if t is not None]
                delay = min(turns) - loop.time() if turns else None
                if delay is None or delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wake.wait(), delay)
        finally:
            if listener is not None:
                listener.cancel()
            if self._redis is not None:
                await self._redis.aclose()

    async def _push(self, slug: str, snapshot: Snapshot) -> None:
        text = await snapshot(slug)
        if text is None:
            return
        for queue in list(self._subscribers.get(slug, ())):
            if queue.full():  # a slow viewer skips a frame rather than holding everyone up
                queue.get_nowait()
            queue.put_nowait(text)

    async def _connection(self) -> Any:
        if self._redis is None:
            import redis.asyncio as redis

            self._redis = redis.from_url(self.redis_url, socket_timeout=5, socket_connect_timeout=5)
        return self._redis

    async def _publish(self, slugs: list[str]) -> None:
        if not slugs:
            return
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


class LiveSeats:
    """Live dashboard sockets open in this server process, per client address and per experiment: one address
    (a script, or a browser with hundreds of tabs) cannot hold every seat, nor one experiment every socket."""

    def __init__(self, per_address: int, per_experiment: int):
        self.per_address, self.per_experiment = per_address, per_experiment
        self.by_address: dict[str, int] = {}
        self.by_slug: dict[str, int] = {}

    def take(self, address: str, slug: str) -> str | None:
        """Take a seat; or why not (the close reason)."""
        if self.by_address.get(address, 0) >= self.per_address:
            return f"too many live dashboards from your address (at most {self.per_address}): close some"
        if self.by_slug.get(slug, 0) >= self.per_experiment:
            return f"this dashboard has its most viewers ({self.per_experiment}): reload in a minute"
        self.by_address[address] = self.by_address.get(address, 0) + 1
        self.by_slug[slug] = self.by_slug.get(slug, 0) + 1
        return None

    def give_back(self, address: str, slug: str) -> None:
        for counts, key in ((self.by_address, address), (self.by_slug, slug)):
            counts[key] -= 1
            if counts[key] <= 0:
                del counts[key]
