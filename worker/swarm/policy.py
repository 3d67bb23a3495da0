"""What this process's guards enforce, set once by ``robust.install`` before hivemind's averagers start.

hivemind creates its reducers, all-reduce runners and state downloads itself, in the averager processes it forks,
so the experiment's rules reach them through this one process-wide object (a forked averager inherits it): the
aggregation and weight bounds of the reducers (``robust``), whose records and state are followed (``swarm_epoch``,
``state_guard``, ``matchmaking``) and, on the server's auxiliary peer, where completed rounds go (``witness``).
It imports nothing of swarmhub, so that each of those modules can read it without importing another."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Policy:
    aggregation: str = "mean"
    max_weight: float = math.inf  # the experiment's target_batch_size: no peer counts for more than a whole batch
    flag_weight: float = math.inf  # a claim over this is flagged: WEIGHT_FLAG_FACTOR x (the target or one step's batch)
    run_id: str = ""
    experiment_key: Any = None  # the experiment's public key: reads the roster (who is the server's peer)
    trusted_state: bool = False  # this process is the server's own peer: its norm check has no reference
    username: str | None = None  # whose peer this is: its own account's records are not a vote
    # The server's auxiliary peer: called (in the averager's process) with each completed gradient round's id
    # and its senders with their capped weights (``witness.Witness``)
    witness: Callable[[str, list[tuple[str, float]]], None] | None = None


POLICY = Policy()
