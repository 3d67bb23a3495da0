"""Proposed swarm settings: the rate cap that the epoch-length guard puts on a swarm, and the settings a task
proposes so that a swarm of its planned size trains unthrottled (``SettingsProposal``, served at
``GET /api/tasks/{name}/proposal``). Light, like the wire contract: pydantic only."""

from __future__ import annotations

import math

from pydantic import BaseModel, Field, computed_field

from swarmhub.common.protocol import MAX_TARGET_BATCH_SIZE, OptimizerName


def swarm_rate_cap(target_batch_size: int, matchmaking_time: float) -> float:
    """The most samples a second a whole swarm can train with these settings: a peer waits at least
    ``matchmaking_time`` between two optimizer steps (the epoch-length guard that keeps hivemind's matchmaking from
    wedging), and the swarm gathers ``target_batch_size`` samples per step."""
    return round(target_batch_size / matchmaking_time, 1)


def unthrottled_batch(samples_per_second: float, matchmaking_time: float) -> int:
    """The smallest target batch size at which the rate cap (:func:`swarm_rate_cap`) does not hold back a peer
    that trains ``samples_per_second``."""
    return math.ceil(samples_per_second * matchmaking_time)


DEFAULT_PLANNED_PEERS = 8  # the swarm size a task's proposal is sized for, unless the organizer plans another


def next_power_of_two(value: float) -> int:
    return 1 << max(math.ceil(value) - 1, 0).bit_length()


class SettingsProposal(BaseModel):
    """A task's proposed swarm settings (``Task.proposal``): a target batch size large enough that a swarm of
    ``planned_peers`` peers, each as fast as the task's reference peer, trains without waiting on the epoch-length
    guard (``swarm_rate_cap``), and the timings that go with it."""

    target_batch_size: int = Field(ge=1, le=MAX_TARGET_BATCH_SIZE)
    matchmaking_time: float
    averaging_timeout: float
    reference_samples_per_second: float = Field(
        description="What one reference peer (one CPU thread of bench/task_rates.py's machine, a bare PyTorch loop) "
        "trains on this task with these parameters: the estimate the proposal is sized with"
    )
    planned_peers: int = Field(ge=1)
    optimizer: OptimizerName | None = Field(
        default=None, description="The optimizer the task trains well with; null: the experiment's default"
    )
    learning_rate: float | None = Field(
        default=None,
        gt=0,
        description="The learning rate the task proposes for that optimizer at this target batch size; null: the "
        "experiment's default",
    )

    @computed_field(  # type: ignore[prop-decorator]
        description="The most samples/s the whole swarm trains at with these settings (swarm_rate_cap)"
    )
    @property
    def rate_cap(self) -> float:
        return swarm_rate_cap(self.target_batch_size, self.matchmaking_time)

    @computed_field(  # type: ignore[prop-decorator]
        description="How many reference peers these settings keep bound by compute: planned_peers or more, fewer "
        "only where the largest target batch size allowed is not enough"
    )
    @property
    def unthrottled_peers(self) -> float:
        return round(self.rate_cap / max(self.reference_samples_per_second, 1e-9), 1)


def propose(
    reference_samples_per_second: float,
    *,
    matchmaking_time: float,
    averaging_timeout: float,
    planned_peers: int = DEFAULT_PLANNED_PEERS,
    at_least: int = 1,
) -> SettingsProposal:
    """The smallest power-of-two target batch size that lets ``planned_peers`` reference peers train unthrottled:
    at least ``unthrottled_batch(planned_peers * rate, matchmaking_time)`` and ``at_least``, at most
    ``MAX_TARGET_BATCH_SIZE``."""
    needed = max(unthrottled_batch(planned_peers * reference_samples_per_second, matchmaking_time), at_least)
    return SettingsProposal(
        target_batch_size=min(next_power_of_two(needed), MAX_TARGET_BATCH_SIZE),
        matchmaking_time=matchmaking_time,
        averaging_timeout=averaging_timeout,
        reference_samples_per_second=round(reference_samples_per_second, 1),
        planned_peers=planned_peers,
    )
