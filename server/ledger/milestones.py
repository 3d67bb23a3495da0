"""Milestones a volunteer reaches, from verified work only (never claimed or pending samples), over every
experiment anyone may see: a volunteer's profile lists them with the date reached where the ledger gives it, and
leaderboard rows carry their keys.

- ``first_round``: credited in a completed gradient averaging round the server's peer witnessed (``RoundCredit``);
- ``samples_1m`` / ``samples_10m`` / ``samples_100m``: verified samples, summed over the experiments;
- ``online_24h``: 24 h of time online, the profile's figure (summed per peer: two peers for an hour make two hours);
- ``checkpoint``: credited in a round whose gradients are in a checkpoint the server saved. A round the witness
  saw at epoch ``e`` produced the step to ``e + 1``, so it is in every checkpoint of a later epoch (the checkpoint
  peer saves the state at its epoch), unless a rollback in between discarded it: a checkpoint restored from epoch
  ``r`` at epoch ``t`` (``Checkpoint.restored_from``) drops the rounds of epochs ``r`` to ``t - 1``.

:func:`for_profile` gives one volunteer's, with dates; :func:`keys_for` the keys of many in one statement, for a
leaderboard page.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy import case, exists, func, select
from sqlalchemy.orm import Session, aliased

from swarmhub.server.experiments.lifecycle import (
    PUBLIC,  # the module: the package imports metrics, which imports this one
)
from swarmhub.server.models import Checkpoint, Experiment, RoundCredit, VolunteerTotal, WitnessedRound

DAY = 24 * 3600.0
SAMPLE_MILESTONES = (
    ("samples_1m", 1_000_000, "1M verified samples"),
    ("samples_10m", 10_000_000, "10M verified samples"),
    ("samples_100m", 100_000_000, "100M verified samples"),
)
TITLES = {
    "first_round": "First gradient round",
    **{key: title for key, _, title in SAMPLE_MILESTONES},
    "online_24h": "24 h online",
    "checkpoint": "Helped train a checkpoint",
}
ORDER = tuple(TITLES)


class Milestone(BaseModel):
    key: str = Field(description="first_round, samples_1m, samples_10m, samples_100m, online_24h or checkpoint")
    title: str
    reached_at: datetime | None = Field(
        description="When it was reached, where the ledger records it (the first round, the first checkpoint)"
    )


def reached(verified: int, online: float, first_round: bool, checkpoint: bool) -> list[str]:
    """The keys reached with ``verified`` samples and ``online`` seconds over the experiments anyone may see."""
    reached = {
        "first_round": first_round,
        **{key: verified >= threshold for key, threshold, _ in SAMPLE_MILESTONES},
        "online_24h": online >= DAY,
        "checkpoint": checkpoint,
    }
    return [key for key in ORDER if reached[key]]


def _credited(*where: Any) -> Any:
    """Rows of credited rounds (``RoundCredit`` joined to its ``WitnessedRound``) in experiments anyone may see."""
    return (
        select(RoundCredit.id)
        .join(WitnessedRound, WitnessedRound.id == RoundCredit.round_pk)
        .join(Experiment, Experiment.id == RoundCredit.experiment_id)
        .where(RoundCredit.credited > 0, PUBLIC, *where)
    )


def _in_checkpoint() -> tuple[Any, ...]:
    """The conditions under which the round of ``WitnessedRound`` and ``RoundCredit`` is in ``Checkpoint``: the
    same experiment, a later epoch, and no rollback between them that discarded the round."""
    restore = aliased(Checkpoint)
    discarded = exists().where(
        restore.experiment_id == RoundCredit.experiment_id,
        restore.restored_from.is_not(None),
        restore.restored_from <= WitnessedRound.epoch,
        restore.epoch > WitnessedRound.epoch,
        restore.epoch <= Checkpoint.epoch,
    )
    return (Checkpoint.experiment_id == RoundCredit.experiment_id, Checkpoint.epoch > WitnessedRound.epoch, ~discarded)


def for_profile(session: Session, user_id: int) -> list[Milestone]:
    """The milestones ``user_id`` reached, in a fixed order, each with its date where the ledger records it (the
    first round's, and the first checkpoint's that holds one of their rounds); a few statements, each reading
    only this volunteer's rows."""
    verified, online = session.execute(
        select(func.sum(VolunteerTotal.verified_samples), func.sum(VolunteerTotal.online_seconds))
        .join(Experiment, Experiment.id == VolunteerTotal.experiment_id)
        .where(VolunteerTotal.user_id == user_id, PUBLIC)
    ).one()
    first_round = session.scalar(
        _credited(RoundCredit.user_id == user_id).with_only_columns(func.min(WitnessedRound.witnessed_at))
    )
    first_checkpoint = None
    if first_round is not None:
        first_checkpoint = session.scalar(
            select(func.min(Checkpoint.created_at)).where(
                exists(_credited(RoundCredit.user_id == user_id, *_in_checkpoint()))
            )
        )
    dates = {"first_round": first_round, "checkpoint": first_checkpoint}
    keys = reached(int(verified or 0), float(online or 0.0), first_round is not None, first_checkpoint is not None)
    return [Milestone(key=key, title=TITLES[key], reached_at=dates.get(key)) for key in keys]


def keys_for(session: Session, user_ids: list[int]) -> dict[int, list[str]]:
    """The keys of the milestones each of ``user_ids`` reached (no dates), in one statement: their totals over
    the experiments anyone may see, and for those with verified samples whether any of their credited rounds is in
    a checkpoint (an EXISTS through ``ix_round_credits_user_id`` that stops at the first such round)."""
    if not user_ids:
        return {}
    totals = (
        select(
            VolunteerTotal.user_id,
            func.sum(VolunteerTotal.verified_samples).label("verified"),
            func.sum(VolunteerTotal.online_seconds).label("online"),
        )
        .join(Experiment, Experiment.id == VolunteerTotal.experiment_id)
        .where(VolunteerTotal.user_id.in_(user_ids), PUBLIC)
        .group_by(VolunteerTotal.user_id)
        .subquery()
    )
    held = exists(_credited(RoundCredit.user_id == totals.c.user_id, exists().where(*_in_checkpoint())))
    checkpoint = case((totals.c.verified > 0, held), else_=False)
    rows = session.execute(select(totals.c.user_id, totals.c.verified, totals.c.online, checkpoint)).all()
    return {
        int(user_id): reached(int(verified or 0), float(online or 0.0), int(verified or 0) > 0, bool(in_checkpoint))
        for user_id, verified, online, in_checkpoint in rows
    }
