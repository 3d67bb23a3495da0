"""Experiments: create, edit, move through draft -> running -> paused -> finished, list, join. The fields as the
API takes and shows them (:mod:`.schemas`), the experiments themselves (:mod:`.lifecycle`), who takes part
(:mod:`.membership`), what a volunteer may join now, most needed first (:mod:`.joinable`), joining one
(:mod:`.joining`), their peers' swarm tokens (:mod:`.admission`) and rolling a swarm back to a kept checkpoint
(:mod:`.rollback`); the public names of all but the last are reachable here, as ``experiments.X``."""

from __future__ import annotations

from swarmhub.server.experiments.admission import (
    MIN_PEER_KEY_BITS,
    PeerKey,
    check_peer_key,
    experiment_public_key,
    peer_key,
    swarm_token,
)
from swarmhub.server.experiments.joinable import joinable
from swarmhub.server.experiments.joining import join
from swarmhub.server.experiments.lifecycle import (
    PUBLIC,
    TRANSITIONS,
    by_run_id,
    can_manage,
    can_view,
    change_status,
    checkpoint_words,
    create,
    fastest_peer_rate,
    get_managed,
    get_visible,
    keeps_checkpoints,
    list_visible,
    needs_corpus,
    run_id,
    running,
    update,
)
from swarmhub.server.experiments.membership import (
    accept_invite,
    ban,
    banned_usernames,
    check_joinable,
    invited,
    is_banned,
    is_member,
    start_worker_run,
    unban,
)
from swarmhub.server.experiments.schemas import (
    DEFAULT_MAX_PEERS_PER_VOLUNTEER,
    PROPOSED_FIELDS,
    TRAINING_FIELDS,
    ExperimentCreate,
    ExperimentFields,
    ExperimentPublic,
    ExperimentUpdate,
    JoinPolicy,
    StatusChange,
    proposal_for,
    to_config,
    to_public,
)
from swarmhub.server.models import Experiment  # callers name the model as experiments.Experiment

__all__ = [
    "join",
    "PROPOSED_FIELDS",
    "proposal_for",
    "fastest_peer_rate",
    "DEFAULT_MAX_PEERS_PER_VOLUNTEER",
    "Experiment",
    "MIN_PEER_KEY_BITS",
    "PUBLIC",
    "TRAINING_FIELDS",
    "TRANSITIONS",
    "ExperimentCreate",
    "ExperimentFields",
    "ExperimentPublic",
    "ExperimentUpdate",
    "JoinPolicy",
    "PeerKey",
    "StatusChange",
    "accept_invite",
    "ban",
    "banned_usernames",
    "by_run_id",
    "can_manage",
    "can_view",
    "change_status",
    "check_joinable",
    "check_peer_key",
    "create",
    "experiment_public_key",
    "get_managed",
    "get_visible",
    "invited",
    "is_banned",
    "is_member",
    "joinable",
    "checkpoint_words",
    "keeps_checkpoints",
    "list_visible",
    "needs_corpus",
    "peer_key",
    "run_id",
    "running",
    "start_worker_run",
    "swarm_token",
    "to_config",
    "to_public",
    "unban",
    "update",
]
