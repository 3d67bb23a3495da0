"""The wire contract between worker and server: one definition of each message.

Light on purpose: pydantic only (no torch, FastAPI or SQLAlchemy), so the server imports it and the
worker ships it to volunteers unchanged.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# The swarm's own protocol between peers: 3 cuts the vectors it averages where each peer's share ends
# (``load_balancing.make_container_class``; a reducer expects the parts its own cut makes: peers that cut otherwise fail
# every round together); 2 authenticates DHT requests by their libp2p connection (``swarmhub.worker.swarm.dht_auth``); 1
# signed each one (hivemind's token protocol). Peers of different protocols cannot average or talk: the server refuses a
# join from a worker older than MIN_WORKER_VERSION, and a worker refuses a hub whose join answer names another protocol
# (a hub older than the field names none: 1).
SWARM_PROTOCOL = 3
MIN_WORKER_VERSION = "0.3.0"  # the first worker version that speaks SWARM_PROTOCOL 3
SLUG_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{1,48}[a-z0-9])$")
MAX_REPORT_BYTES = 4096  # one metric message on the websocket; anything larger is refused


class ExperimentStatus(str, Enum):
    draft = "draft"
    running = "running"
    paused = "paused"
    finished = "finished"


class OptimizerName(str, Enum):
    adam = "adam"
    adamw = "adamw"
    sgd = "sgd"
    lamb = "lamb"  # layer-wise adaptive moments (You et al., 2019): ALBERT's optimizer in DeDLOC
    lars = "lars"  # layer-wise rate scaling for SGD with momentum (You et al., 2017): SwAV's optimizer in DeDLOC


class Overlap(str, Enum):
    """How much communication overlaps computation (hivemind's delayed updates)."""

    none = "none"  # average gradients, step, then compute the next batch
    delayed_step = "delayed-step"  # the optimizer steps in the background; its result lands one step later
    delayed_averaging = "delayed-averaging"  # gradients are also averaged in the background (one step stale)
    # Each peer chooses for its device and link (``worker.overlap.choose_overlap``): delayed-averaging on a CUDA
    # device, whose CPU is free for hivemind's background work, and on a CPU whose measured link makes a round of
    # the model's gradients long (measured faster there); none on a CPU with a fast or unmeasured link (measured no
    # faster). Peers of either choice average in the same rounds (``tests/test_adaptive_swarm.py`` trains the two
    # together).
    auto = "auto"


class Aggregation(str, Enum):
    """How a reducer combines the peers' parts of a round (``swarmhub.worker.swarm.robust``)."""

    mean = "mean"  # the weighted mean of the finite parts, claimed weights capped
    centered_clip = "centered-clip"  # CenteredClip around the parts' median: a minority cannot steer the result


class Precision(str, Enum):
    """The compute precision of a trainer's forward and backward passes (``worker.training.resolve_precision``)."""

    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


class PeerRole(str, Enum):
    trainer = "trainer"  # computes gradients and averages them
    auxiliary = "auxiliary"  # lends bandwidth: averages with the trainers, computes no gradients


MAX_TARGET_BATCH_SIZE = 1_048_576  # samples per optimizer step: the largest target an experiment may set
MAX_BANDWIDTH_MBPS = 1_000_000.0  # 1 Tbit/s: above any link a volunteer has
MAX_GROUP_SIZE = 1024  # volunteers' peers per averaging group: the largest an experiment may set
GROUP_SIZE_HELP = (
    "Volunteers' peers per gradient averaging group: 0 averages every peer in one group; 2 or more splits a large "
    "swarm into groups of at most that many each round (hivemind's target_group_size), and the server runs one "
    "witness per group, so that every group's round is credited"
)


class TrainingSettings(BaseModel):
    """What is trained and how: the part of an experiment that every worker must agree on."""

    model_config = ConfigDict(extra="forbid")

    task: str = Field(default="digits", min_length=1, max_length=64, description="Registered task name")
    task_params: dict[str, Any] = Field(default_factory=dict, description="The task's own parameters")
    optimizer: OptimizerName = OptimizerName.adam
    learning_rate: float = Field(default=1e-3, gt=0, le=10)
    target_batch_size: int = Field(
        default=256,
        ge=1,
        le=MAX_TARGET_BATCH_SIZE,
        description="Samples the whole swarm accumulates per optimizer step (an experiment created without it gets "
        "its task's proposal: Task.proposal)",
    )
    matchmaking_time: float = Field(
        default=3.0, ge=0.5, le=120, description="Seconds peers wait to form an averaging group"
    )
    averaging_timeout: float = Field(
        default=30.0, ge=5, le=600, description="Seconds after which a stuck averaging round is abandoned"
    )
    aggregation: Aggregation = Field(
        default=Aggregation.mean,
        description="How each reducer combines the peers' parts: mean, or centered-clip (robust to a minority of "
        "peers sending poisoned gradients; non-finite parts are dropped and claimed weights capped either way)",
    )
    group_size: int = Field(
        default=0,
        ge=0,
        le=MAX_GROUP_SIZE,
        description=GROUP_SIZE_HELP,
    )
    overlap: Overlap = Field(
        default=Overlap.none,
        description="Overlap communication with computation: none, delayed-step, delayed-averaging "
        "(one step of staleness), or auto (each peer picks delayed-averaging on a CUDA device or a slow link, none "
        "otherwise)",
    )

    @field_validator("group_size")
    @classmethod
    def _group_of_two_or_more(cls, value: int) -> int:
        if value == 1:
            raise ValueError("a group holds 2 peers or more (0: one group of every peer)")
        return value


class ExperimentConfig(TrainingSettings):
    """The experiment as a worker receives it."""

    slug: str
    title: str

    # A worker of a release before ``group_size`` refuses a config with a field it does not know: a swarm of one group
    # (0) sends none, as before.
    group_size: int = Field(
        default=0, ge=0, le=MAX_GROUP_SIZE, exclude_if=lambda value: value == 0, description=GROUP_SIZE_HELP
    )


class ExperimentSummary(BaseModel):
    """An experiment as listed publicly (`GET /api/experiments`)."""

    slug: str
    title: str
    description: str
    status: ExperimentStatus
    owner: str
    task: str
    created_at: datetime
    task_params: dict[str, Any] = Field(default_factory=dict, description="Set by `GET /api/experiments/{slug}`")


class ExperimentDetail(ExperimentSummary):
    """One experiment as ``GET /api/experiments/{slug}`` shows it, as far as the worker reads it."""

    target_batch_size: int | None = None
    matchmaking_time: float | None = None
    max_swarm_samples_per_second: float | None = Field(
        default=None, description="The most samples/s the whole swarm can train at with these settings"
    )


class JoinRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    device: str = Field(default="cpu", max_length=32)
    client_version: str = Field(default="", max_length=32)
    peer_public_key: str = Field(
        min_length=64,
        max_length=2048,
        pattern=r"^ssh-rsa [A-Za-z0-9+/=]+$",
        description="The peer's RSA public key (OpenSSH text): the swarm token is bound to it",
    )
    # How this peer takes part, as the worker resolved it, for the organizer's swarm view. Self-reported and
    # optional (a worker older than these fields sends none; ``None`` is "not reported"). No peer ID: the server
    # derives it from ``peer_public_key``, the key the swarm token binds, rather than trust a claimed one.
    precision: Precision | None = Field(
        default=None, description="Compute precision of its forward and backward passes (none for an auxiliary peer)"
    )
    client_mode: bool | None = Field(
        default=None, description="True: it joins in client mode (other peers cannot dial it); false: reachable"
    )
    role: PeerRole | None = Field(default=None, description="trainer, or auxiliary (averages only, no gradients)")
    bandwidth_mbps: float | None = Field(
        default=None,
        gt=0,
        le=MAX_BANDWIDTH_MBPS,
        allow_inf_nan=False,
        description="Its link speed to the server as it measured it (Mbit/s, the slower direction)",
    )


JOIN_REPORT_FIELDS = ("precision", "client_mode", "role", "bandwidth_mbps")  # optional: a server may not know them


class SwarmTokenRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    peer_public_key: str = Field(min_length=64, max_length=2048, pattern=r"^ssh-rsa [A-Za-z0-9+/=]+$")


class SwarmToken(BaseModel):
    """A hivemind ``AccessToken`` signed by the experiment's key (see ``swarm_access`` for the bytes)."""

    username: str
    public_key: str
    expiration_time: str
    signature: str


class JoinResponse(BaseModel):
    """`POST /api/experiments/{slug}/join`: everything a worker needs to train."""

    experiment: ExperimentConfig
    run_id: str = Field(description="hivemind run_id shared by every peer of this experiment")
    initial_peers: list[str] = Field(description="Multiaddrs of the server's bootstrap peer")
    worker_id: str = Field(description="Identifies this contribution session in metric reports")
    username: str
    report_path: str = Field(description="Websocket path for metric reports, relative to the server URL")
    swarm_token: SwarmToken = Field(description="Admits this peer's key to the swarm until it expires")
    token_path: str = Field(description="Where to get a fresh swarm token (POST), relative to the server URL")
    experiment_public_key: str = Field(description="Verifies every peer's swarm token (OpenSSH text)")
    server_time: float = Field(description="The server's clock (unix seconds) when it answered")
    data_path: str | None = Field(
        default=None,
        description="Where the experiment's corpus is served (its task trains on one), relative to the server URL",
    )
    swarm_protocol: int = Field(
        default=1, description="The protocol the swarm's peers speak to each other (a worker joins only its own)"
    )
    witness_peers: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="Peer IDs of the server's witnesses (its auxiliary peers) in the swarm: a volunteer's peer that "
        "leads an averaging round waits a little for one of them, since only witnessed rounds earn verified credit",
    )


class MetricReport(BaseModel):
    """One progress report from a worker. `seq` increases by one per message of a worker run."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["metrics"] = "metrics"
    seq: int = Field(ge=0, le=2**62)
    step: int = Field(ge=0, le=2**62)
    epoch: int = Field(ge=0, le=2**62)
    samples: int = Field(ge=0, le=2**62, description="Samples this worker run has processed so far")
    loss: float
    samples_per_second: float = Field(ge=0, le=1e9)
    peers: int = Field(ge=0, le=100_000, description="Peers the worker sees in the swarm")
    averaged_peers: int = Field(default=0, ge=0, le=100_000, description="Group size of the last averaging")

    @field_validator("loss")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("loss must be a finite number")
        return value


class Ack(BaseModel):
    """Server to worker: every report of this connection up to ``seq`` is stored. Acks are cumulative: the
    server stores a connection's reports in the order sent and may answer several with one ack."""

    type: Literal["ack"] = "ack"
    seq: int


class Control(BaseModel):
    """Server to worker: stop. The experiment is no longer `running`, or this volunteer was removed."""

    type: Literal["control"] = "control"
    status: ExperimentStatus
    message: str = ""
    removed: bool = Field(default=False, description="The organizer removed this volunteer from the experiment")


class DeviceCode(BaseModel):
    """RFC 8628 device authorization response."""

    device_code: str
    user_code: str
    verification_uri: str
    verification_uri_complete: str
    expires_in: int
    interval: int


class TokenResponse(BaseModel):
    access_token: str
    token_type: Literal["bearer"] = "bearer"  # noqa: S105 - the OAuth token type, not a secret
    username: str
    scope: Literal["volunteer", "organizer"] = "organizer"  # a server older than scopes issues full tokens


class DenyListPublic(BaseModel):
    """`GET /api/experiments/{slug}/denylist`: whom every peer of the swarm must refuse."""

    usernames: list[str]


class Me(BaseModel):
    username: str
    is_admin: bool
    scope: str | None = Field(default=None, description="The token's scope: volunteer or organizer")
    expires_at: datetime | None = Field(default=None, description="When the token stops working; none: until revoked")


class ProbeInfo(BaseModel):
    """`GET /api/probe`: the server's clock and the address it sees this worker at."""

    server_time: float = Field(description="The server's clock (unix seconds)")
    client_host: str = Field(description="The address this request came from, as the server sees it")


class ShardTurn(BaseModel):
    """The corpus shard a volunteer's peer trains on next (``POST /api/experiments/{slug}/data/next-shard``)."""

    index: int = Field(ge=0, le=2**31, description="The shard's place in the manifest's list of shards")


class UploadResult(BaseModel):
    """`POST /api/probe/upload`: how many bytes arrived and how long receiving them took."""

    bytes: int
    seconds: float


class ReachabilityRequest(BaseModel):
    """`POST /api/probe/reachability`: the addresses this worker listens on."""

    maddrs: list[str] = Field(min_length=1, max_length=8, description="Multiaddrs the worker listens on")


class DialResult(BaseModel):
    maddr: str
    dialed: str | None = Field(description="host:port the server dialed, or null when it would not")
    ok: bool
    error: str | None = None


class ReachabilityResult(BaseModel):
    """`POST /api/probe/reachability`: could the server open a TCP connection to this worker?"""

    reachable: bool = Field(description="The server could open a TCP connection to at least one address")
    results: list[DialResult]


class WorkerInstall(BaseModel):
    """How a volunteer installs the worker this hub speaks."""

    available: bool = Field(description="Whether this hub serves its worker (false while it is prepared at start-up)")
    version: str = Field(description="The hub's swarmhub version: the worker it serves is the same")
    filename: str | None = None
    url: str | None = Field(default=None, description="Where the wheel is downloaded from")
    sha256: str | None = Field(default=None, description="The wheel's SHA-256; pip checks it before installing")
    command: str | None = Field(default=None, description="The install command, pinned to this hub's wheel and hash")
    upgrade_command: str | None = None
    platforms: str = Field(description="Where the worker runs")
    problem: str | None = Field(default=None, description="Why no worker is served, when none is")
