"""The metric store's clock. :func:`.common.current_time` reads ``utcnow`` from here at every call, so that a test or
benchmark that sets ``clock.utcnow`` moves the clock of every module that stores or reads metrics (the store, the
dashboard's series, the leaderboard's activity window, the swarm view, the hub's figures)."""

from __future__ import annotations

from swarmhub.server import models

utcnow = models.utcnow
