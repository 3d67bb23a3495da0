"""Rolling a swarm back to a kept checkpoint, after an attack or a bad turn of training.

The organizer picks one of the checkpoints whose files are still kept (the page's list, or
``POST /api/experiments/{slug}/rollback``). The request is stored on the experiment (``restore_epoch``, and
``restore_seq`` counted up), and the reconcile loop writes it into the file the experiment's checkpoint peer reads
(``SwarmHost.write_restore``). The checkpoint peer (``checkpoint_peer.Keeper.maybe_restore``) acts on each new
request once: it loads that checkpoint's weights (with the checkpoint peer's own optimizer statistics: it never
takes a volunteer's) and shares them as the swarm's state ten epochs past the newest the swarm shows (a volunteer
training alone moves an epoch every few seconds), and stores a progress record at that epoch for two minutes
(hivemind publishes none for a peer without samples). Every peer's
next read of the swarm's progress then finds itself behind a server peer, which peers follow past their epoch
bound (``swarm_epoch.bounded_progress``) and download state from first (``state_guard.order_sources``): each loads
the restored state. The peer saves it at once as a
checkpoint marked ``restored_from``.

The epoch counter goes on counting up (hivemind peers never load a state older than their own), and the
learning-rate schedule continues from the restored checkpoint's step: the checkpoint peer sets the swarm's schedule
offset (``worker/swarm_optimizer.SwarmStateAverager``) to the epoch it shares the state at less the checkpoint's
schedule step, and every peer takes the offset with the state.
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from swarmhub.server import experiments
from swarmhub.server.core.errors import BadRequest, Conflict
from swarmhub.server.models import Checkpoint, Experiment


class RollbackRequest(BaseModel):
    epoch: int = Field(ge=0, le=2**53, description="The step of a kept checkpoint (GET .../checkpoints)")


class RollbackAccepted(BaseModel):
    epoch: int = Field(description="The step whose checkpoint the swarm's state is restored from")
    seq: int = Field(description="How many restores this experiment has asked for, this one included")


def kept_epochs(session: Session, experiment: Experiment) -> list[int]:
    """The steps of the checkpoints whose files are kept, newest first."""
    return list(
        session.scalars(
            select(Checkpoint.epoch)
            .where(Checkpoint.experiment_id == experiment.id, Checkpoint.kept.is_(True))
            .order_by(Checkpoint.epoch.desc())
        )
    )


def request(session: Session, experiment: Experiment, epoch: int) -> RollbackAccepted:
    """Ask the checkpoint peer to restore the kept checkpoint of step ``epoch`` (the caller checked the right)."""
    if not experiments.keeps_checkpoints(experiment):
        raise BadRequest("this experiment's task keeps no checkpoints: there is nothing to roll back to")
    if experiment.status not in ("running", "paused"):
        raise Conflict(f"the experiment is {experiment.status}: only a running or paused swarm is rolled back")
    kept = kept_epochs(session, experiment)
    if epoch not in kept:
        listed = ", ".join(str(e) for e in kept[:10]) or "none yet"
        raise BadRequest(f"no kept checkpoint at step {epoch} (kept: {listed})", field="epoch")
    experiment.restore_epoch = epoch
    experiment.restore_seq = (experiment.restore_seq or 0) + 1
    session.flush()
    return RollbackAccepted(epoch=epoch, seq=experiment.restore_seq)


def restore_order(experiment: Experiment) -> dict[str, int] | None:
    """What the checkpoint peer's restore file says: the newest request, or None when there was none."""
    if not experiment.restore_seq or experiment.restore_epoch is None:
        return None
    return {"seq": int(experiment.restore_seq), "epoch": int(experiment.restore_epoch)}
