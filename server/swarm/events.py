"""What the server's peer processes say on stdout (one JSON line each) and what their configs hold: the contract
between ``SwarmHost`` and the processes it runs, defined once.

The bootstrap peer says ``ready`` and then ``progress`` about once a second; a companion (aux or checkpoint peer)
says ``ready`` once it is in the swarm and ``stopped`` when it leaves; the checkpoint peer also says ``keeping``
(it is in the swarm with its state), ``checkpoint`` (it saved one) and ``restore-failed``. Any of them says
``failed`` (with its error) just before it exits on an error. The lists a progress
event carries (``contributors``, ``rounds``, ``flags``) stay raw here: the ledger validates each item
(``contributions.parse``, ``witnessed.parse_rounds``, ``witnessed.parse_flags``), dropping a malformed one alone.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from swarmhub.common.protocol import ExperimentConfig
from swarmhub.common.tokens import SERVER_PEER_USERNAME


class _Event(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Ready(_Event):
    event: Literal["ready"] = "ready"
    maddrs: list[str]
    peer_id: str | None = None  # a companion's (the bootstrap peer's is in its addresses)


class Progress(_Event):
    """What the monitor read of the swarm's signed progress records and of what the witness published."""

    event: Literal["progress"] = "progress"
    epoch: int
    peers: int
    samples_per_second: float
    samples: int
    contributors: list[Any] = Field(default_factory=list)
    rounds: list[Any] = Field(default_factory=list)
    flags: list[Any] = Field(default_factory=list)
    roster_reads: int = 0  # the monitor's reads of the roster so far (``bootstrap_peer.MonitorRoster``)

    @property
    def volunteer_peers(self) -> int:
        """The volunteers' peers among the contributors (the server's own peers left out)."""
        return len(
            {
                item.get("peer_id")
                for item in self.contributors
                if isinstance(item, dict) and item.get("username") not in (None, SERVER_PEER_USERNAME)
            }
        )


class Stopped(_Event):
    event: Literal["stopped"] = "stopped"
    epoch: int


class Keeping(_Event):
    """The checkpoint peer is in the swarm, with the state it holds (volunteers may join now)."""

    event: Literal["keeping"] = "keeping"
    epoch: int


class Checkpoint(_Event):
    """The checkpoint peer saved the swarm's state: ``folder`` is ``<run_id>/<epoch>`` under the checkpoints."""

    event: Literal["checkpoint"] = "checkpoint"
    epoch: int
    eval_loss: float | None = None
    # Shares of the held-out labels the model ranks first / among its five most likely (None: the task has none).
    eval_top1: float | None = Field(default=None, ge=0.0, le=1.0)
    eval_top5: float | None = Field(default=None, ge=0.0, le=1.0)
    folder: str
    restored_from: int | None = None  # the checkpoint a rollback restored, when this one is its copy


class Failed(_Event):
    """A peer process's last words before it exits with an error: the host shows them as its ``last_error``."""

    event: Literal["failed"] = "failed"
    error: str


class RestoreFailed(_Event):
    event: Literal["restore-failed"] = "restore-failed"
    epoch: int
    reason: str


PeerEvent = Annotated[
    Ready | Progress | Stopped | Keeping | Checkpoint | RestoreFailed | Failed, Field(discriminator="event")
]
_EVENTS: TypeAdapter[PeerEvent] = TypeAdapter(PeerEvent)


def parse(line: str | bytes) -> PeerEvent | None:
    """One line of a peer's stdout as its event; None for anything else (a stray print, a malformed event)."""
    try:
        return _EVENTS.validate_json(line)
    except ValidationError:
        return None


class AuxConfig(BaseModel):
    """An auxiliary peer's config file (``<run_id>.aux.json``): the experiment and where its swarm is."""

    run_id: str
    experiment: ExperimentConfig
    initial_peers: list[str]
    # The experiment's prepared corpus folder, for a task that trains on one: the auxiliary peer computes nothing,
    # but the model's shape (vocabulary, sequence length) comes from the corpus's manifest.
    corpus: str | None = None
    # A witness's number among the experiment's witnesses: with averaging groups, the dealt group whose key its
    # rounds look in (``worker/swarm/matchmaking.py``, ``deal``)
    index: int = Field(default=0, ge=0)


class KeeperConfig(AuxConfig):
    """A checkpoint peer's config file (``<run_id>.checkpoints.json``)."""

    folder: str  # where it saves: data_dir/checkpoints/<run_id>
    interval_seconds: float
    restore_file: str | None = None  # where the server writes the organizer's rollbacks
