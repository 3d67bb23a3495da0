"""Which experiment a supervised worker trains (``swarmhub run-service`` and ``swarmhub join --any``).

Three ways to choose, from ``config.toml``'s ``experiments`` (see :mod:`.limits`):

- a plain list of names (:class:`InOrder`): the first, until it stops taking volunteers, then the next;
- names with shares (:class:`Shares`): the running time is split in those proportions, in slices that add up to
  ``share_period_minutes`` (shares 3 and 1 with 60 minutes: 45 minutes of the first, then 15 of the second);
- ``"any"`` (:class:`MostNeeded`): the experiment that needs peers most among those the volunteer may join, as
  the server lists them (``GET /api/me/joinable``, :class:`JoinableExperiment`); the next most needed once it
  finishes or stops taking volunteers.

The need rule is defined here, once, and the server applies it (:func:`need`): an experiment with fewer of its
peers online needs more; there is no per-experiment target yet, so "fewer" is the whole rule. Ties go to the
experiment with less throughput, then by name, so every worker that asks at one moment sees the same order.

The runner (:mod:`.runner`) asks a chooser for a :class:`Pick` before it starts a ``join``, tells it when an
experiment stopped taking volunteers (:meth:`Chooser.hand_over`), and ends a share's slice with join's clean stop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel, Field


class JoinableExperiment(BaseModel):
    """One running experiment the caller may join, with how much it needs peers (``GET /api/me/joinable``)."""

    slug: str
    title: str
    task: str
    peers_online: int = Field(ge=0, description="the experiment's workers that reported within the active window")
    volunteers_online: int = Field(ge=0, description="distinct volunteers among those workers")
    samples_per_second: float = Field(ge=0, description="those workers' reported rates, summed")
    need: float = Field(
        gt=0, le=1, description="1 / (1 + peers_online): 1 with no peer online, halved by the first peer, and so on"
    )


def need(peers_online: int) -> float:
    """How much an experiment needs peers: 1 with none online, less with every peer (see the module docstring)."""
    return round(1.0 / (1 + max(0, peers_online)), 6)


def by_need(items: Iterable[JoinableExperiment]) -> list[JoinableExperiment]:
    """Most needed first; ties: less throughput first, then by name."""
    return sorted(items, key=lambda e: (-e.need, e.samples_per_second, e.slug))


@dataclass(frozen=True)
class Pick:
    """The experiment to train now, and why (``swarmhub service status`` shows it)."""

    slug: str
    why: str


class NothingToJoin(Exception):
    """No experiment to start now; the message says why (the runner shows it and asks again later)."""


class Chooser(Protocol):
    def current(self) -> str | None:
        """The experiment picked last (None before the first pick)."""

    def pick(self) -> Pick:
        """The experiment to start now; :class:`NothingToJoin` (or the fetch's ``WorkerError``) when none."""

    def hand_over(self) -> bool:
        """The current experiment stopped taking volunteers: True when another one may start at once."""

    def slice_seconds(self) -> float | None:
        """How long the current experiment may run before the next one's turn (None: no limit)."""

    def next_slice(self) -> None:
        """The current slice is used: the next experiment's turn."""


class InOrder:
    """A plain list, in order of preference: the first, until it stops taking volunteers; then the next."""

    def __init__(self, slugs: Sequence[str]):
        if not slugs:
            raise ValueError("no experiments to join")
        self.slugs = list(slugs)
        self.index = 0

    def current(self) -> str:
        return self.slugs[self.index]

    def pick(self) -> Pick:
        if len(self.slugs) == 1:
            return Pick(self.current(), "the experiment in config.toml")
        return Pick(self.current(), f"number {self.index + 1} of {len(self.slugs)} in config.toml's order")

    def hand_over(self) -> bool:
        if len(self.slugs) < 2:
            return False
        self.index = (self.index + 1) % len(self.slugs)
        return True

    def slice_seconds(self) -> None:
        return None

    def next_slice(self) -> None:
        return None


class Shares:
    """Time slices in proportion to the shares: one round of every experiment lasts ``period`` seconds."""

    def __init__(self, shares: Sequence[tuple[str, float]], period: float):
        if not shares:
            raise ValueError("no experiments to join")
        if period <= 0 or any(share <= 0 for _, share in shares):
            raise ValueError("shares and the period must be above 0")
        self.shares = list(shares)
        self.period = period
        self.total = sum(share for _, share in shares)
        self.index = 0

    def current(self) -> str:
        return self.shares[self.index][0]

    def pick(self) -> Pick:
        slug, share = self.shares[self.index]
        if len(self.shares) == 1:
            return Pick(slug, "the only experiment with a share in config.toml")
        minutes = self.period * share / self.total / 60
        return Pick(
            slug,
            f"share slice: share {share:g} of {self.total:g}, {minutes:.3g} of every {self.period / 60:.3g} minutes",
        )

    def hand_over(self) -> bool:
        if len(self.shares) < 2:
            return False
        self.next_slice()
        return True

    def slice_seconds(self) -> float | None:
        if len(self.shares) < 2:
            return None
        return self.period * self.shares[self.index][1] / self.total

    def next_slice(self) -> None:
        self.index = (self.index + 1) % len(self.shares)


class MostNeeded:
    """``--any``: the joinable experiment that needs peers most, kept until it stops taking volunteers (or the
    volunteer was removed from it); then the server is asked again."""

    def __init__(self, fetch: Callable[[], list[JoinableExperiment]]):
        self.fetch = fetch
        self.chosen: Pick | None = None

    def current(self) -> str | None:
        return self.chosen.slug if self.chosen else None

    def pick(self) -> Pick:
        if self.chosen is not None:  # a restart after a crash or a pause keeps the experiment
            return self.chosen
        listed = by_need(self.fetch())  # a WorkerError (server unreachable, token rejected) is the runner's
        if not listed:
            raise NothingToJoin("no running experiment you may join: asking the server again shortly")
        best = listed[0]
        peers = f"{best.peers_online} peer{'' if best.peers_online == 1 else 's'} online"
        self.chosen = Pick(best.slug, f"most needed of the {len(listed)} you may join: {peers} (need {best.need:.2f})")
        return self.chosen

    def hand_over(self) -> bool:
        self.chosen = None
        return True

    def slice_seconds(self) -> None:
        return None

    def next_slice(self) -> None:
        return None
