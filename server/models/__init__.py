"""Database tables (SQLAlchemy 2). Change them only together with a migration in ``migrations/``.

One module per area; every table and helper is importable from here (``from .models import X``). The areas'
names sort in the order their tables are defined (accounts, experiments, reports, swarm, teams, totals, training), so
``Base.metadata`` lists the tables in that order.
"""

from swarmhub.server.models.accounts import ApiToken, DeviceAuthorization, User, WebSession
from swarmhub.server.models.base import NAMING, Base, UTCDateTime, utcnow
from swarmhub.server.models.experiments import Experiment, ExperimentBan, ExperimentMember
from swarmhub.server.models.reports import MetricPoint, WorkerRun
from swarmhub.server.models.swarm import (
    PeerEpoch,
    RoundCredit,
    SwarmFlag,
    SwarmLease,
    SwarmPeer,
    SwarmPeerKey,
    WitnessedRound,
)
from swarmhub.server.models.teams import Team, TeamFounding, TeamMember
from swarmhub.server.models.totals import ExperimentTotal, MetricBucket, VolunteerTotal
from swarmhub.server.models.training import Checkpoint, Corpus

__all__ = [
    "NAMING",
    "ApiToken",
    "Base",
    "Checkpoint",
    "Corpus",
    "DeviceAuthorization",
    "Experiment",
    "ExperimentBan",
    "ExperimentMember",
    "ExperimentTotal",
    "MetricBucket",
    "MetricPoint",
    "PeerEpoch",
    "RoundCredit",
    "SwarmFlag",
    "SwarmLease",
    "SwarmPeer",
    "SwarmPeerKey",
    "Team",
    "TeamFounding",
    "TeamMember",
    "UTCDateTime",
    "User",
    "VolunteerTotal",
    "WebSession",
    "WitnessedRound",
    "WorkerRun",
    "utcnow",
]
