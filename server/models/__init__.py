"""Database tables (SQLAlchemy 2). Change them only together with a migration in ``migrations/``.

One module per area; every table and helper is importable from here (``from .models import X``). The areas'
names sort in the order their tables are defined (accounts, experiments, reports, swarm, teams, totals, training), so
``Base.metadata`` lists the tables in that order.
"""

from .accounts import ApiToken, DeviceAuthorization, User, WebSession
from .base import NAMING, Base, UTCDateTime, utcnow
from .experiments import Experiment, ExperimentBan, ExperimentMember
from .reports import MetricPoint, WorkerRun
from .swarm import PeerEpoch, RoundCredit, SwarmFlag, SwarmLease, SwarmPeer, SwarmPeerKey, WitnessedRound
from .teams import Team, TeamMember
from .totals import ExperimentTotal, MetricBucket, VolunteerTotal
from .training import Checkpoint, Corpus

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
    "TeamMember",
    "UTCDateTime",
    "User",
    "VolunteerTotal",
    "WebSession",
    "WitnessedRound",
    "WorkerRun",
    "utcnow",
]
