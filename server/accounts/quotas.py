"""Quotas per account: what one organizer's experiments may cost the hub (``SWARMHUB_QUOTA_*`` settings).

Every running experiment costs the server a bootstrap peer and its ports, and maybe an auxiliary and a checkpoint
peer; every corpus costs disk. Without quotas a fresh account could create and start experiments without end.
Counts come from the tables as they are (no counter to drift), per the experiment's owner; an administrator is
exempt, also when acting on another account's experiment. Each check runs before the write it guards, so a
refused request writes nothing.
"""

from __future__ import annotations

import math
from datetime import timedelta

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from swarmhub.common.protocol import ExperimentStatus
from swarmhub.server import experiments
from swarmhub.server.core.errors import Forbidden, TooManyRequests
from swarmhub.server.core.settings import Settings
from swarmhub.server.models import Corpus, Experiment, TeamFounding, User, utcnow

DAY = timedelta(days=1)


def server_peers(experiment: Experiment, *, aux_peer: bool | None = None) -> int:
    """The peers the server runs for ``experiment`` beside its bootstrap peer: auxiliary, checkpoint."""
    aux = experiment.aux_peer if aux_peer is None else aux_peer
    return int(aux) + int(experiments.keeps_checkpoints(experiment))


def check_create(session: Session, settings: Settings, user: User) -> None:
    """429 (with Retry-After) when ``user`` created ``quota_experiments_per_day`` experiments in the last 24 hours."""
    if user.is_admin:
        return
    _lock(session, user.id)
    now = utcnow()
    count, oldest = session.execute(
        select(func.count(), func.min(Experiment.created_at)).where(
            Experiment.owner_id == user.id, Experiment.created_at > now - DAY
        )
    ).one()
    limit = settings.quota_experiments_per_day
    if count < limit:
        return
    # 429, not 403: the next creation is allowed at a time the server knows.
    headers = {"Retry-After": str(max(1, math.ceil((oldest + DAY - now).total_seconds())))} if oldest else None
    when = f"after {(oldest + DAY):%Y-%m-%d %H:%M} UTC" if oldest else "when an administrator raises it"
    raise TooManyRequests(
        f"you created {_count(count, 'experiment')} in the last 24 hours, and the hub allows {limit} per account a "
        f"day (quota: experiments per day): create the next one {when}, or edit one of your drafts",
        headers=headers,
    )


def check_team_create(session: Session, settings: Settings, user: User) -> None:
    """429 (with Retry-After) when ``user`` created ``quota_teams_per_day`` teams in the last 24 hours, those since
    deleted included (by their last member leaving or by an administrator: ``TeamFounding``), or founding, leaving
    and founding again would be no limit."""
    if user.is_admin:
        return
    _lock(session, user.id)
    now = utcnow()
    count, oldest = session.execute(
        select(func.count(), func.min(TeamFounding.created_at)).where(
            TeamFounding.creator_id == user.id, TeamFounding.created_at > now - DAY
        )
    ).one()
    limit = settings.quota_teams_per_day
    if count < limit:
        return
    headers = {"Retry-After": str(max(1, math.ceil((oldest + DAY - now).total_seconds())))} if oldest else None
    raise TooManyRequests(
        f"you created {_count(count, 'team')} in the last 24 hours, and the hub allows {limit} per account a day "
        "(quota: teams per day)",
        field="name",
        headers=headers,
    )


def check_status_change(session: Session, settings: Settings, experiment: Experiment, user: User, action: str) -> None:
    """403 when starting ``experiment`` would take its owner past ``quota_running_experiments`` or
    ``quota_server_peers``. Other actions free what the owner holds."""
    startable, _ = experiments.TRANSITIONS["start"]
    if action != "start" or user.is_admin or experiment.status not in startable:
        return  # only a start costs more (starting a running or finished experiment is refused as a transition)
    _lock(session, experiment.owner_id)
    others = _running(session, experiment)
    limit = settings.quota_running_experiments
    if len(others) >= limit:
        # 403, not 429: waiting does not free a slot, the organizer does.
        raise Forbidden(
            f"you already run {_count(len(others), 'experiment')}, and the hub runs at most {limit} per account "
            "(quota: running experiments): pause or finish one first"
        )
    _check_peers(settings, experiment, others, server_peers(experiment), f"starting {experiment.slug!r}")


def check_update(
    session: Session, settings: Settings, experiment: Experiment, user: User, data: experiments.ExperimentUpdate
) -> None:
    """403 when an edit turns on the auxiliary peer of a running experiment past ``quota_server_peers``."""
    if user.is_admin or experiment.status != ExperimentStatus.running or not data.aux_peer or experiment.aux_peer:
        return
    _lock(session, experiment.owner_id)
    what = f"an auxiliary peer for {experiment.slug!r}"
    _check_peers(settings, experiment, _running(session, experiment), server_peers(experiment, aux_peer=True), what)


def check_corpus(session: Session, settings: Settings, experiment: Experiment, user: User, content: str) -> None:
    """403 when ``content`` as ``experiment``'s corpus would take its owner's corpora past ``quota_corpus_mb``."""
    # Not locked: the text is prepared (seconds) before the corpus is written, and a lock held that long would
    # stall the owner's other requests. Two uploads at once may both pass, each within SWARMHUB_CORPUS_MAX_MB.
    size = len(content.encode())  # what the corpus row records (``corpus.prepare``); its shards take about as much
    check_corpus_bytes(session, settings, experiment, user, size, ("this text is", "a smaller text"))


def check_corpus_bytes(
    session: Session, settings: Settings, experiment: Experiment, user: User, size: int, words: tuple[str, str]
) -> None:
    """403 when a corpus of ``size`` bytes as ``experiment``'s would take its owner's corpora past
    ``quota_corpus_mb``; ``words`` name it and what to give instead ("these images take", "fewer or smaller
    images"). An image corpus is checked with the bytes of its arrays, after its archive is read and before they
    are written."""
    if user.is_admin:
        return
    stored = session.scalar(
        select(func.sum(Corpus.bytes))
        .join(Experiment, Experiment.id == Corpus.experiment_id)
        .where(Experiment.owner_id == experiment.owner_id, Corpus.experiment_id != experiment.id)  # replaced
    )
    stored = int(stored or 0)  # PostgreSQL sums to a Decimal
    limit = int(settings.quota_corpus_mb * 2**20)
    if stored + size <= limit:
        return
    subject, instead = words
    raise Forbidden(
        f"{subject} {_mb(size)} and your other experiments' training text takes {_mb(stored)}, and the hub keeps "
        f"at most {_mb(limit)} per account (quota: training text): give {instead}, or ask the hub's administrators "
        "for room"
    )


def _check_peers(settings: Settings, experiment: Experiment, others: list[Experiment], own: int, what: str) -> None:
    held = sum(server_peers(e) for e in others)
    limit = settings.quota_server_peers
    if own == 0 or held + own <= limit:
        return
    raise Forbidden(
        f"{what} would make the hub run {held + own} auxiliary and checkpoint peers for your experiments, and it "
        f"runs at most {limit} per account (quota: server peers): pause one of your running experiments, or turn "
        "off an auxiliary peer (aux_peer)",
        field="aux_peer" if experiment.status == ExperimentStatus.running else None,
    )


def _running(session: Session, experiment: Experiment) -> list[Experiment]:
    """The owner's other running experiments."""
    stmt = select(Experiment).where(
        Experiment.owner_id == experiment.owner_id,
        Experiment.status == ExperimentStatus.running,
        Experiment.id != experiment.id,
    )
    return list(session.scalars(stmt))


def _lock(session: Session, owner_id: int) -> None:
    """One account's quota checks one at a time, so that two requests at once cannot both take the last slot: the
    check and the write it guards hold the lock until the request's transaction ends."""
    if session.get_bind().dialect.name == "sqlite":
        # No row locks: a write that changes nothing takes SQLite's one writer lock, and the counts are read in it.
        session.execute(text("UPDATE users SET id = id WHERE id = :id"), {"id": owner_id})
    else:  # the owner's row (NO KEY UPDATE: rows that refer to it can still be written)
        session.execute(select(User.id).where(User.id == owner_id).with_for_update(key_share=True))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def _mb(n: int) -> str:
    """Sizes as ``SWARMHUB_CORPUS_MAX_MB`` and ``SWARMHUB_QUOTA_CORPUS_MB`` count them (1 MB = 2**20 bytes)."""
    return f"{n / 2**20:,.1f} MB" if n >= 2**20 else f"{n / 2**10:,.0f} KB"
