"""Rate limits on what a guesser or a spammer would hammer: log-in, sign-up, device-code entry, token issue.

A sliding window per action and client address, in this process's memory (with several server processes,
each limits on its own: the limit a client sees is at most that many times higher).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Any

from fastapi import Depends, Request

from .errors import TooManyRequests

# action -> (requests, per seconds)
LIMITS = {
    "login": (30, 60.0),
    "signup": (10, 600.0),
    "device-entry": (20, 60.0),
    "token-issue": (30, 600.0),
}


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


def check(request: Request, action: str) -> None:
    """Count one ``action`` from this client's address; raises 429 (with Retry-After) over the limit."""
    limiter: RateLimiter = request.app.state.ratelimiter
    wait = limiter.hit(action, request.client.host if request.client else "unknown")
    if wait is not None:
        seconds = max(1, math.ceil(wait))
        raise TooManyRequests(
            f"too many {action.replace('-', ' ')} attempts from your address: try again in {seconds} s",
            headers={"Retry-After": str(seconds)},
        )


def limited(action: str) -> Any:
    """A route dependency: at most LIMITS[action] requests per client address."""

    def dependency(request: Request) -> None:
        check(request, action)

    return Depends(dependency)
