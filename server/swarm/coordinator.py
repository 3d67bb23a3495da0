"""``SwarmCoordinator``: this server process's side of every running experiment's swarm, between the database and
``SwarmHost``. It takes or renews the swarm lease of each running experiment (one process hosts each swarm), has
the host start and stop the server's peers to match, publishes where their bootstrap peers listen, and writes what
those peers report (signed progress, witnessed rounds and flags, checkpoints) to the database.

It runs as one task in the server's event loop (:meth:`run`), every ``swarm_reconcile_seconds`` or sooner when
:meth:`reconcile_soon` wakes it, which any thread may call at any time (before the loop runs it is a no-op: the
first reconcile runs at start anyway)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from swarmhub.server import experiments
from swarmhub.server.core.settings import Settings
from swarmhub.server.corpus import training_data
from swarmhub.server.experiments import rollback
from swarmhub.server.ledger import contributions, witnessed
from swarmhub.server.live.channels import LiveHub
from swarmhub.server.models import Corpus, Experiment, utcnow
from swarmhub.server.swarm import events as peer_events
from swarmhub.server.swarm import leases
from swarmhub.server.swarm.host import HostedSwarm, SwarmHost
from swarmhub.server.swarm.supervision import PeerState

logger = logging.getLogger("swarmhub.server")


class SwarmCoordinator:
    def __init__(self, settings: Settings, sessions: sessionmaker[Session], swarm: SwarmHost, live: LiveHub):
        self.settings = settings
        self.sessions = sessions
        self.swarm = swarm
        self.live = live
        self.instance = uuid.uuid4().hex  # this process, as the holder of swarm leases
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        swarm.on_progress = self.record_progress
        swarm.on_checkpoint = self.record_checkpoint
        swarm.on_ready = lambda run_id: self.reconcile_soon()  # publish its addresses without waiting

    # -- waking and running ------------------------------------------------------------------------------------

    def reconcile_soon(self) -> None:
        """Reconcile now rather than at the next interval (a status change, a removal, a peer that is ready)."""
        self._in_loop(self._wake.set)

    def _in_loop(self, action: Callable[[], object]) -> None:
        """Run ``action`` in the server's event loop (from any thread); nothing while the loop does not run."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(action)

    async def run(self) -> None:
        """Reconcile until cancelled; a failed round is logged and the next one runs on time."""
        self._loop = asyncio.get_running_loop()
        while True:
            try:
                await self.reconcile()
            except Exception:
                logger.exception("swarm reconcile failed")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.swarm_reconcile_seconds)
            self._wake.clear()

    async def reconcile(self) -> None:
        if not self.swarm.enabled:
            return
        hosted = await run_in_threadpool(self.leased_swarms)
        await run_in_threadpool(self.swarm.reconcile, hosted)
        await run_in_threadpool(self.publish_hosted)

    async def close(self) -> None:
        """Stop this process's peers and hand their swarms over at once rather than at lease expiry."""
        self._loop = None
        hosted = self.swarm.hosted()
        await run_in_threadpool(self.swarm.close)

        def release() -> None:
            with self.sessions.begin() as session:
                leases.release(session, hosted, self.instance)

        with contextlib.suppress(Exception):  # the database may be gone already; the leases then expire
            await run_in_threadpool(release)

    def _mark_live(self, slug: str) -> None:
        """Tell the experiment's live dashboards (from a peer's reader thread)."""
        self._in_loop(lambda: self.live.mark(slug))

    # -- what one reconcile reads and writes -------------------------------------------------------------------

    def leased_swarms(self) -> dict[str, HostedSwarm]:
        """The running experiments whose swarm this process hosts: it renews or takes their leases."""
        with self.sessions.begin() as session:
            running = {experiments.run_id(e): e for e in experiments.running(session)}
            lease = self.settings.swarm_lease_seconds
            held = {run_id for run_id in running if leases.acquire(session, run_id, self.instance, seconds=lease)}
            stopped = [run_id for run_id in self.swarm.hosted() if run_id not in running]
            leases.release(session, stopped, self.instance)
            return {
                run_id: (
                    e.signing_key,
                    experiments.banned_usernames(session, e),
                    self.aux_config(session, e) if e.aux_peer else None,
                    self.keeper_config(session, e),
                )
                for run_id, e in running.items()
                if run_id in held
            }

    def aux_config(self, session: Session, experiment: Experiment) -> dict[str, Any]:
        """What the auxiliary peer (the witness) needs: the experiment's config and, for a task that trains on a
        corpus, the corpus folder (the model's shape is in its manifest)."""
        config = experiments.to_config(experiment).model_dump(mode="json")
        return {"experiment": config, "corpus": self._corpus(session, experiment)}

    def _corpus(self, session: Session, experiment: Experiment) -> str | None:
        corpus = session.get(Corpus, experiment.id)
        return str(training_data.corpus_folder(self.settings, corpus)) if corpus is not None else None

    def keeper_config(self, session: Session, experiment: Experiment) -> dict[str, Any] | None:
        """What the checkpoint peer needs, for a task that keeps checkpoints."""
        if not experiments.keeps_checkpoints(experiment):
            return None
        return {
            "experiment": experiments.to_config(experiment).model_dump(mode="json"),
            "corpus": self._corpus(session, experiment),
            "interval_seconds": experiment.checkpoint_minutes * 60,
            "restore": rollback.restore_order(experiment),  # written to the peer's restore file at every reconcile
        }

    def publish_hosted(self) -> None:
        """Tell the other processes (and joins anywhere) where this process's bootstrap peers listen, and how its
        peer processes for each run are."""
        with self.sessions.begin() as session:
            for run_id, states in self.swarm.supervisor.all_states().items():
                dumped = [state.model_dump(mode="json") for state in states]
                leases.publish_peer_states(session, run_id, self.instance, dumped)
            for run_id in self.swarm.hosted():
                # Not before the checkpoint peer is in: the first volunteer would otherwise start from scratch.
                maddrs = self.swarm.maddrs(run_id) if not self.swarm.keeper_pending(run_id) else []
                if maddrs:
                    leases.publish(session, run_id, self.instance, maddrs, self.swarm.swarm_peers(run_id))

    def peer_states(self, session: Session, run_id: str) -> list[PeerState]:
        """The server's peer processes for ``run_id``: this process's own view when it hosts them, else what the
        holder of its lease published at its last reconcile (empty when no process hosts the run)."""
        if run_id in self.swarm.hosted():
            return self.swarm.supervisor.states(run_id)
        lease = leases.current(session, run_id)
        states = []
        for item in (lease.server_peers or []) if lease is not None else []:
            with contextlib.suppress(ValidationError):
                states.append(PeerState.model_validate(item))
        return states

    # -- what the server's peers report (called from their reader threads) ---------------------------------------

    def record_checkpoint(self, run_id: str, event: peer_events.Checkpoint) -> None:
        """The checkpoint peer saved the swarm's model: list it (and prune the oldest files)."""
        with self.sessions.begin() as session:
            experiment = experiments.by_run_id(session, run_id)
            if experiment is None:
                return
            training_data.record_checkpoint(
                session,
                self.settings,
                experiment,
                event.epoch,
                event.eval_loss,
                event.folder,
                event.restored_from,
                eval_top1=event.eval_top1,
                eval_top5=event.eval_top5,
            )
            slug = experiment.slug
        self._mark_live(slug)

    def record_progress(self, run_id: str, event: peer_events.Progress) -> None:
        """The monitor peer read the swarm's signed progress records and what the server's witness published: add
        them to the ledger (and remove a volunteer whose flags reached the organizer's limit)."""
        contributors = contributions.parse(event.contributors)
        rounds = witnessed.parse_rounds(event.rounds)
        flags = witnessed.parse_flags(event.flags)
        if not contributors and not rounds and not flags:
            return
        with self.sessions.begin() as session:
            experiment = experiments.by_run_id(session, run_id)
            if experiment is None:
                return
            now = utcnow()
            if contributors:
                contributions.record(session, experiment, contributors, now)
            witnessed.record_rounds(session, experiment, rounds, now)
            removed = witnessed.record_flags(session, experiment, flags, now)
            slug = experiment.slug
        if removed:
            self.reconcile_soon()  # the swarm's deny-list, at once
        self._mark_live(slug)
