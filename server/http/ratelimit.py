"""Rate limits on what a guesser or a spammer would hammer: log-in, sign-up, device-code entry, token issue,
swarm tokens.

A sliding window per action and client address (``limited``), or per action and account (``limited_per_account``,
for what a signed-in volunteer asks for from several machines, such as swarm tokens). Without Redis
(``SWARMHUB_REDIS_URL`` empty) each process counts in its own memory (``RateLimiter``): with several server
processes the limit a client sees is at most that many times higher. With Redis, every process counts in one
sorted set per action and address or account (``RedisRateLimiter``), so replicas share one budget.

Redis down fails open, on purpose: rate limiting must never take log-in down with it. While Redis does not
answer, each process falls back to its own in-memory window (a warning is logged, and Redis is asked again
every ``RETRY_SECONDS``), so a guesser still meets the per-process limit.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
import uuid
from collections import deque
from typing import Any, Protocol

from fastapi import Depends, Request

from swarmhub.server.core.errors import TooManyRequests
from swarmhub.server.core.settings import Settings
from swarmhub.server.http.deps import CurrentUser
from swarmhub.server.models import User
from swarmhub.server.services import services

logger = logging.getLogger("swarmhub.ratelimit")

# action -> (requests, per seconds)
LIMITS = {
    "login": (30, 60.0),
    "signup": (10, 600.0),
    "device-entry": (20, 60.0),
    "token-issue": (30, 600.0),
    "corpus": (20, 600.0),  # each upload trains a tokenizer: CPU-heavy
    # Per account: each of a volunteer's peers asks once when it joins and once per token lifetime (up to an
    # hour), so this leaves room for a few dozen peers starting together, and each answer is an RSA signature.
    "swarm-token": (60, 600.0),
    # Per account: each join asks once; each answer dials up to a few addresses back (to the caller only)
    "reachability": (30, 600.0),
    # Per address and per account: team names are public, so a script must not flood /teams (see also
    # quotas.check_team_create, a few teams per account a day)
    "team-create": (10, 600.0),
}
RETRY_SECONDS = 5.0  # how long a process counts alone after Redis failed to answer
REDIS_TIMEOUT = 0.5  # seconds: a stalled Redis must not stall every log-in for long


class Limiter(Protocol):
    def hit(self, action: str, key: str) -> float | None: ...


class RateLimiter:
    def __init__(self, limits: dict[str, tuple[int, float]] | None = None, max_keys: int = 100_000):
        self.limits = dict(limits or LIMITS)
        self.max_keys = max_keys
        self._hits: dict[tuple[str, str], deque[float]] = {}
        self._lock = threading.Lock()

    def hit(self, action: str, key: str) -> float | None:
        """Count one request; returns the seconds to wait when it is over the limit (and then not counted)."""
        limit, window = self.limits[action]
        now = time.monotonic()
        with self._lock:
            if len(self._hits) >= self.max_keys:  # bounded memory: forget the quietest half
                for stale in sorted(self._hits, key=lambda k: self._hits[k][-1] if self._hits[k] else 0.0)[
                    : self.max_keys // 2
                ]:
                    del self._hits[stale]
            hits = self._hits.setdefault((action, key), deque())
            while hits and now - hits[0] >= window:
                hits.popleft()
            if len(hits) >= limit:
                return window - (now - hits[0])
            hits.append(now)
            return None


# KEYS[1]: the window's sorted set; ARGV: limit, window (ms), a unique member. Returns -1 when the hit is
# counted, else the milliseconds until the oldest hit leaves the window. One script, so concurrent hits from
# several processes cannot both see room for one more; Redis's own clock, so the replicas' clocks need not agree.
_SLIDING_WINDOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit, window = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) >= limit then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return math.max(1, tonumber(oldest[2]) + window - now)
end
redis.call('ZADD', KEYS[1], now, ARGV[3])
redis.call('PEXPIRE', KEYS[1], window)
return -1
"""


class RedisRateLimiter:
    """The same sliding windows, kept in Redis under ``prefix`` so that every server process shares them.

    Each key holds at most ``limit`` entries and expires one window after its last counted hit. The client
    address (or account) is hashed into the key: nothing a client sends appears in Redis's key space as it is.
    """

    def __init__(self, url: str, prefix: str, limits: dict[str, tuple[int, float]] | None = None):
        import redis

        self.limits = dict(limits or LIMITS)
        self.prefix = prefix
        self.fallback = RateLimiter(self.limits)
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self._client = redis.Redis.from_url(url, socket_timeout=REDIS_TIMEOUT, socket_connect_timeout=REDIS_TIMEOUT)
        self._script: Any = self._client.register_script(_SLIDING_WINDOW)
        self._alone_until = 0.0

    def key(self, action: str, key: str) -> str:
        digest = hashlib.sha256(f"{action}\0{key}".encode()).hexdigest()[:32]
        return f"{self.prefix}:{action}:{digest}"

    def hit(self, action: str, key: str) -> float | None:
        """Count one request; returns the seconds to wait when it is over the limit (and then not counted)."""
        limit, window = self.limits[action]
        if time.monotonic() < self._alone_until:
            return self.fallback.hit(action, key)
        try:
            args = [limit, int(window * 1000), uuid.uuid4().hex]
            wait_ms = int(self._script(keys=[self.key(action, key)], args=args))
        except self._errors as exc:
            self._alone_until = time.monotonic() + RETRY_SECONDS
            logger.warning(
                "rate limits: Redis did not answer (%r); counting in this process alone for %.0f s", exc, RETRY_SECONDS
            )
            return self.fallback.hit(action, key)
        return None if wait_ms < 0 else wait_ms / 1000

    def close(self) -> None:
        self._client.close()


def make_limiter(settings: Settings) -> Limiter:
    """Shared through Redis when the deployment has one, else this process's own."""
    if settings.redis_url:
        return RedisRateLimiter(settings.redis_url, f"{settings.redis_channel}:ratelimit")
    return RateLimiter()


def check(request: Request, action: str) -> None:
    """Count one ``action`` from this client's address; raises 429 (with Retry-After) over the limit."""
    _count(request, action, request.client.host if request.client else "unknown", "attempts from your address")


def check_account(request: Request, action: str, user: User) -> None:
    """Count one ``action`` of this account, from whatever address; raises 429 (with Retry-After) over the limit."""
    # Not by address: a volunteer's peers run on several machines, and an address is cheap to change.
    _count(request, action, f"user:{user.id}", "requests from your account")


def _count(request: Request, action: str, key: str, what: str) -> None:
    limiter: Limiter = services(request.app).ratelimiter
    wait = limiter.hit(action, key)
    if wait is not None:
        seconds = max(1, math.ceil(wait))
        raise TooManyRequests(
            f"too many {action.replace('-', ' ')} {what}: try again in {seconds} s",
            headers={"Retry-After": str(seconds)},
        )


def limited(action: str) -> Any:
    """A route dependency: at most LIMITS[action] requests per client address."""

    def dependency(request: Request) -> None:
        check(request, action)

    return Depends(dependency)


def limited_per_account(action: str) -> Any:
    """A route dependency for signed-in API clients: at most LIMITS[action] requests per account."""

    def dependency(request: Request, user: CurrentUser) -> None:
        check_account(request, action, user)

    return Depends(dependency)
