"""Metric ingestion and what dashboards show: the write path (:mod:`.store`), the leaderboard (:mod:`.board`),
and the summary and loss/throughput series (:mod:`.dashboard`). Their public names are reachable here, as
``metrics.X``; ``metrics.clock.utcnow`` is the package's clock (see :func:`.common.current_time`)."""

from __future__ import annotations

from swarmhub.server.metrics import clock as clock
from swarmhub.server.metrics.board import (
    CLAIM_SLACK,
    KEYS_ONLY_FROM,
    LEADERBOARD_LIMIT,
    LEADERBOARD_MAX_LIMIT,
    LEADERBOARD_MAX_OFFSET,
    SIGNED_FACTOR,
    THROUGHPUT_FACTOR,
    Cursor,
    LeaderboardEntry,
    LeaderboardPage,
    TotalRow,
    device_classes_of,
    leaderboard,
    leaderboard_page,
)
from swarmhub.server.metrics.common import BUCKET_WIDTHS, among, device_class
from swarmhub.server.metrics.dashboard import (
    SERIES_POINTS,
    Baseline,
    MetricsPublic,
    SeriesPoint,
    Summary,
    series,
    summary,
)
from swarmhub.server.metrics.store import ingest, ingest_many

__all__ = [
    "BUCKET_WIDTHS",
    "Baseline",
    "CLAIM_SLACK",
    "KEYS_ONLY_FROM",
    "LEADERBOARD_LIMIT",
    "LEADERBOARD_MAX_LIMIT",
    "LEADERBOARD_MAX_OFFSET",
    "SERIES_POINTS",
    "SIGNED_FACTOR",
    "THROUGHPUT_FACTOR",
    "Cursor",
    "LeaderboardEntry",
    "LeaderboardPage",
    "MetricsPublic",
    "SeriesPoint",
    "Summary",
    "TotalRow",
    "among",
    "device_class",
    "device_classes_of",
    "ingest",
    "ingest_many",
    "leaderboard",
    "leaderboard_page",
    "series",
    "summary",
]
