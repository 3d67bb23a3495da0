"""``hivemind.Optimizer`` as swarmhub's workers run it (imported only when training starts: hivemind is heavy).

The learning-rate schedule runs at ``epoch - schedule_offset`` (:class:`SwarmStateAverager`): after a rollback
(``server/experiments/rollback.py``) the swarm's epoch counter goes on counting up, as hivemind peers never load a
state older than their own, while the schedule continues from the restored checkpoint's step. The offset travels
with the swarm's state.

A gradient averaging round is pre-scheduled only while the swarm's progress shows another peer, and its group waits,
until this peer's epoch has ended, for every peer the swarm's progress records show (``matchmaking.expect_group``).

hivemind pre-schedules the next round when its estimate of the epoch's end is one matchmaking time away, so that
matchmaking overlaps the last steps, and a group forms at its leader's scheduled time with whoever is there. Each peer
estimates that end from its own last read of the swarm's progress, and with epochs of about 20 s on a busy machine the
estimates of one epoch's end fell up to 6 s apart, more than the matchmaking time: a peer that estimated early led a
group of itself and whoever was already looking (the server's witness, which always is), the others formed groups of
their own later, and the first group's all-reduce then waited for its leader's epoch to really end, the witness with
it. Only the witness's group is credited: 4 digits volunteers at the task's proposed target batch (1,048,576) were
credited 0.28 to 0.57 of their samples (docs/benchmarks/credit.md, "Rounds that split"). With the expected group,
a leader whose scheduled time comes before its own epoch's end and before all those peers joined keeps looking (its
followers look again too) instead of beginning; the group begins the moment the last expected peer joins, or, once
its epoch has ended, with whoever is there, as before. (Not pre-scheduling at all also keeps the groups whole, but a
round that looks for its group only when the epoch ends cost the demo's one-second epochs half of their steps.)

When the epoch ends and the progress tracker shows no other peer (a swarm's first seconds, before the peers'
progress records have been read; or after the others left), hivemind cancels a pre-scheduled round. If the cancel
lands while the round is still looking for a group, hivemind 1.1's matchmaking can be left broken: the log shows
``RuntimeError: aclose(): asynchronous generator is already running`` from ``_declare_averager_periodically``,
and from then on every round of that peer ends "could not find a group" (seen in two-peer swarms on a busy
2-core machine: both peers pre-scheduled at the start, saw each other a moment later, and never averaged).
A peer that sees no other would skip the round anyway; not scheduling it leaves nothing to cancel. When a peer
appears before the epoch ends, hivemind starts matchmaking at the epoch's end instead (a round without the
head start).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import hivemind
import torch
from hivemind.averaging import DecentralizedAverager
from hivemind.averaging.control import AveragingStage, StepControl
from hivemind.optim.state_averager import TrainingStateAverager, dump_optimizer_state, load_optimizer_state

from swarmhub.worker.swarm import epoch as swarm_epoch
from swarmhub.worker.swarm import matchmaking, witness
from swarmhub.worker.swarm import progress as swarm_progress
from swarmhub.worker.swarm.progress import UNBACKED_AFTER_SECONDS, UNBACKED_SECONDS

logger = logging.getLogger(__name__)
# After a state download that left this peer behind, the swarm's progress is read again at most this often
REREAD_AFTER_FAILED_CATCH_UP_SECONDS = 2.0


class _KeepsLoadedMetadata(DecentralizedAverager):  # type: ignore[misc]
    """Keeps the metadata of the last state downloaded (``TrainingStateAverager`` reads only the epoch of it)."""

    def load_state_from_peers(self, *args: Any, **kwargs: Any) -> Any:
        loaded = super().load_state_from_peers(*args, **kwargs)
        self.loaded_metadata = loaded[0] if isinstance(loaded, tuple) and loaded else None
        return loaded


class _CancelsUnformedRounds(DecentralizedAverager):  # type: ignore[misc]
    """Keeps the controls of the averaging rounds it starts, so that a peer leaving can cancel those that no group
    holds yet. ``TrainingStateAverager`` runs a state round in the background at an epoch's end (hivemind's
    ``delay_state_averaging``) and the optimizer's shutdown waits for it: for the last volunteer of a swarm to leave
    that round never finds a group (the server's witness holds no state), and it waited ``averaging_timeout``."""

    def step(self, *args: Any, **kwargs: Any) -> Any:
        control = super().step(*args, **kwargs)
        if isinstance(control, StepControl):
            open_rounds = [c for c in getattr(self, "_open_rounds", []) if not c.done()]
            self._open_rounds = [*open_rounds, control]
        return control

    def cancel_unformed_rounds(self) -> int:
        """Cancel the rounds still waiting to look for a group or looking for one; returns how many."""
        cancelled = 0
        for control in getattr(self, "_open_rounds", []):
            if not control.done() and control.stage in (AveragingStage.IDLE, AveragingStage.LOOKING_FOR_GROUP):
                cancelled += bool(control.cancel())
        self._open_rounds = []
        return cancelled


class SwarmStateAverager(TrainingStateAverager, _KeepsLoadedMetadata, _CancelsUnformedRounds):  # type: ignore[misc]
    """hivemind's state averager with a schedule offset: the learning-rate schedule is at step
    ``local_epoch - schedule_offset``. The offset is shared with the state (its metadata's ``schedule_offset``) and
    taken with a downloaded state when it is a whole number between 0 and that state's epoch."""

    schedule_offset = 0
    loaded_metadata: Any = None

    @classmethod
    def _get_handle_name(cls, namespace: str | None, method_name: str) -> str:
        """hivemind names each RPC after the servicer's class: this one serves and asks for the state under
        ``TrainingStateAverager``'s names, so that peers of other swarmhub versions, and hivemind's own, download
        each other's state."""
        return str(TrainingStateAverager._get_handle_name(namespace, method_name))

    def get_current_state(self) -> Any:
        metadata, tensors, infos = super().get_current_state()
        return {**metadata, "schedule_offset": self.schedule_offset}, tensors, infos

    def load_state_from_peers(self, **kwargs: Any) -> None:
        """hivemind's, then the schedule offset taken from the state; the optimizer statistics (Adam's moments and
        step counts) and settings stay this peer's own unless the state came from the server's own peer (the
        checkpoint); the learning rate is the schedule's at the epoch taken.

        A volunteer's statistics cannot be checked against anything: a peer that stepped its optimizer on its own
        gradients x-1000 (alone, before anyone joined, or whenever its rounds failed) holds second moments a million
        times an honest peer's and first moments pointing uphill. Every peer that took them took steps a thousand
        times too small, uphill for dozens of epochs (``tests/test_byzantine_swarm.py``, the x-1000 attacker who
        starts the experiment alone). A newcomer keeps the statistics its optimizer was created with, as if it
        started training at the downloaded parameters. Whether the source was the server's peer is set by this
        peer's own download (``state_guard.FROM_SERVER_PEER``), never by the source."""
        from swarmhub.worker.swarm.state_guard import FROM_SERVER_PEER

        self.loaded_metadata = None
        epoch = self.local_epoch
        with torch.no_grad(), self.lock_averaged_tensors:
            layout, statistics = dump_optimizer_state(self.optimizer)
            own = (layout, [tensor.clone() for tensor in statistics])
        super().load_state_from_peers(**kwargs)
        metadata = self.loaded_metadata
        if not isinstance(metadata, dict) or metadata.get("epoch") != self.local_epoch or self.local_epoch < epoch:
            return  # nothing loaded (hivemind refuses a state older than this peer's)
        if metadata.get(FROM_SERVER_PEER) is not True:
            with torch.no_grad(), self.lock_averaged_tensors:
                load_optimizer_state(self.optimizer, *own)  # own settings too: a source's could say lr=1e6
                if self.scheduler is not None:  # the rate of the epoch just taken, from this peer's own base rates
                    for group, rate in zip(self.optimizer.param_groups, self.scheduler.get_last_lr(), strict=True):
                        group["lr"] = rate
        if not self.take_schedule_offset(metadata.get("schedule_offset", 0)):
            logger.warning("ignored a state's schedule offset %.50r", metadata.get("schedule_offset"))

    def take_schedule_offset(self, offset: Any) -> bool:
        """Set the offset when it is a whole number from 0 to this peer's epoch (a state's, or a checkpoint's);
        whether it was taken. The schedule follows either way."""
        valid = isinstance(offset, int) and not isinstance(offset, bool) and 0 <= offset <= self.local_epoch
        if valid:
            self.schedule_offset = offset
        self._update_scheduler()
        return valid

    @property
    def schedule_step(self) -> int:
        return max(self.local_epoch - self.schedule_offset, 0)

    def _update_scheduler(self) -> None:
        """Set the schedule to ``schedule_step``: forward as hivemind steps it, and back after a rollback (a
        ``LambdaLR`` is a pure function of the step)."""
        scheduler = self.scheduler
        if scheduler is None:
            return
        step = self.schedule_step
        if not isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
            super()._update_scheduler()
            return
        if scheduler.last_epoch == step:
            return
        rates = [base * rule(step) for base, rule in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)]
        for group, rate in zip(scheduler.optimizer.param_groups, rates, strict=True):
            group["lr"] = rate
        scheduler.last_epoch = step
        scheduler._last_lr = rates


class SwarmOptimizer(hivemind.Optimizer):  # type: ignore[misc]
    """``roster`` (the swarm's, see ``swarm_epoch.Roster``) makes the progress tracker read the swarm's epoch through
    ``swarm_epoch.bounded_progress``: a record with a made-up epoch moves no one."""

    def __init__(
        self, *args: Any, roster: swarm_epoch.Roster | None = None, target_group_size: int | None = None, **kwargs: Any
    ):
        self._roster = roster
        # hivemind 1.1.12 gives ``averager_opts`` to the state averager only: the gradient rounds, which carry the
        # traffic, would split the vector evenly whatever a peer's bandwidth
        self._grad_averager_opts = dict(kwargs.get("averager_opts") or {})
        # the experiment's averaging groups (``matchmaking.target_group_size``): gradient rounds only, as the
        # state averager's rounds are rare and carry no credit
        if target_group_size is not None:
            self._grad_averager_opts["target_group_size"] = target_group_size
        self._behind_since: float | None = None  # out of sync since, with no state at the swarm's epoch found
        super().__init__(*args, **kwargs)

    def _make_state_averager(self, **kwargs: Any) -> SwarmStateAverager:
        return SwarmStateAverager(
            dht=self.dht,
            prefix=f"{self.run_id}_state_averager",
            min_matchmaking_time=self.matchmaking_time,
            allreduce_timeout=self.allreduce_timeout,
            shutdown_timeout=self.shutdown_timeout,
            offload_optimizer=self.offload_optimizer,
            custom_gradients=self.offload_optimizer,
            status_loglevel=self.status_loglevel,
            next_chunk_timeout=self.next_chunk_timeout,
            client_mode=self.client_mode,
            auxiliary=self.auxiliary,
            start=True,
            **kwargs,
        )

    def _make_gradient_averager(self, factory: Any, **kwargs: Any) -> Any:
        """No peer downloads another's gradient accumulators (newcomers load the state averager's state), so the
        gradient averager does not offer them: hivemind would re-declare them in the DHT after every round and
        at every epoch, a signed store that each peer holding the key answers, for nothing. It gets the
        ``averager_opts`` the state averager gets (the measured bandwidth)."""
        return super()._make_gradient_averager(factory, allow_state_sharing=False, **self._grad_averager_opts, **kwargs)

    def _make_progress_tracker(self, target_batch_size: int, **kwargs: Any) -> Any:
        common = {
            "dht": self.dht,
            "prefix": self.run_id,
            "target_batch_size": target_batch_size,
            "client_mode": self.client_mode,
            "status_loglevel": self.status_loglevel,
            "start": True,
            **kwargs,
        }
        if self._roster is None:  # the server's witness: hivemind's tracker, its last read kept for the witness
            return witness.make_recording_tracker_class()(**common)
        return swarm_progress.make_tracker_class()(roster=self._roster, **common)

    def shutdown(self) -> None:
        """hivemind's, except for the rounds that no group holds yet, which a leaving peer cancels instead of
        waiting up to ``averaging_timeout`` for a group that, with the others gone, may never form (the last
        volunteer to leave a swarm of two waited 20 s): the state round started in the background at the last
        epoch's end (``_CancelsUnformedRounds``), and a gradient round scheduled but not yet looking for a group,
        which hivemind would join with zero weight (it cancels one already looking)."""
        if isinstance(self.state_averager, _CancelsUnformedRounds) and self.state_averager.cancel_unformed_rounds():
            logger.debug("cancelled the state round that no group held before leaving")
        for name in ("scheduled_grads", "scheduled_state"):
            control = getattr(self, name, None)
            if control is not None and not control.done() and control.stage == AveragingStage.IDLE:
                logger.debug("cancelling the %s round scheduled before leaving", name.removeprefix("scheduled_"))
                control.cancel()
                setattr(self, name, None)
        super().shutdown()

    def _alone_with_server_peers(self) -> bool:
        return self._roster is not None and getattr(self.tracker, "other_trainers", 1) == 0

    def _update_global_epoch(self, grad_scaler: Any) -> None:
        """hivemind's, without a state averaging round when no other volunteer trains: the server's witness keeps
        a record in the swarm (so that a lone volunteer's gradient rounds are witnessed) but holds no training
        state and joins no state round, and hivemind would wait ``averaging_timeout`` for a group every time."""
        if not self._alone_with_server_peers():
            return super()._update_global_epoch(grad_scaler)
        every = self.average_state_every  # type: ignore[has-type]
        self.average_state_every = 2**62
        try:
            return super()._update_global_epoch(grad_scaler)
        finally:
            self.average_state_every = every

    def _maybe_schedule_state_averaging(self) -> None:
        if not self._alone_with_server_peers():
            super()._maybe_schedule_state_averaging()

    def _maybe_schedule_gradient_averaging(self) -> None:
        if self.tracker.global_progress.num_peers <= 1:
            return  # alone: hivemind would cancel the round at the epoch's end (see the module's docstring)
        self._expect_group()
        super()._maybe_schedule_gradient_averaging()

    def _begin_averaging_gradients(self, grad_scaler: Any) -> bool:
        self._expect_group()
        return bool(super()._begin_averaging_gradients(grad_scaler))

    def _expect_group(self) -> None:
        """The group of this peer's next gradient round: itself, every other volunteer's peer in the swarm's
        progress records, and a witness where one keeps a record (see the module's docstring); with averaging
        groups, the peers dealt to this peer's group for the round's epoch and that group's witness
        (``matchmaking.deal``)."""
        found = getattr(self.tracker, "group_peers", None)
        if found is None:
            return
        others, server = found
        a_witness = min(server, 1)  # the module ``witness`` is another thing
        if matchmaking.group_size() > 0:
            own = self.dht.peer_id.to_base58()
            group, members = matchmaking.deal(self.local_epoch, others, own, matchmaking.group_size())
            matchmaking.expect_group(members + a_witness, group=group)
        else:
            matchmaking.expect_group(1 + len(others) + a_witness)

    def load_state_from_peers(self, **kwargs: Any) -> None:
        """hivemind's, then, when no state could be taken and the swarm still looks ahead, an immediate read of
        the swarm's progress: the read leaves out the peers whose state was just refused (``peer_flags.distrusted``),
        so a peer that serves a poisoned state while advertising a newer epoch keeps no one "out of sync" (without
        it, hivemind asks for the state again at every step until its next scheduled read, and refuses it again).

        A peer still out of sync after UNBACKED_AFTER_SECONDS of this leaves out the records it could not catch up
        with for a while (``GuardedProgressTracker.leave_out_unbacked``): no peer's state is at their epoch."""
        super().load_state_from_peers(**kwargs)
        if self._roster is None or self.local_epoch >= self.tracker.global_epoch - 1:
            self._behind_since = None
        elif self._behind_since is None:
            self._behind_since = time.monotonic()
        elif time.monotonic() - self._behind_since >= UNBACKED_AFTER_SECONDS:
            self._behind_since = None
            for peer in self.tracker.leave_out_unbacked(self.local_epoch):
                logger.warning(
                    "found no state at the epoch %s's progress records state for %.0f s: not following them for %.0f s",
                    peer,
                    UNBACKED_AFTER_SECONDS,
                    UNBACKED_SECONDS,
                )
            self._reread_at = 0.0  # read the swarm's progress without them now
        if self._roster is None or self.local_epoch >= self.tracker.global_epoch:
            return
        if time.monotonic() - getattr(self, "_reread_at", 0.0) < REREAD_AFTER_FAILED_CATCH_UP_SECONDS:
            return
        self._reread_at = time.monotonic()
        self.refresh_swarm_progress(timeout=REREAD_AFTER_FAILED_CATCH_UP_SECONDS)

    def refresh_swarm_progress(self, timeout: float = 10.0, force: bool = False) -> None:
        """Have hivemind's progress tracker read the swarm's progress now, when its epoch is not this peer's.

        After loading the swarm's state, the tracker's idea of the swarm's epoch can be older than the state just
        loaded, and hivemind then counts none of this peer's samples towards the swarm's batch: a fast peer trains
        alone for up to its next scheduled read (tens of seconds) and its work never reaches an averaging round.
        """
        tracker = self.tracker
        if tracker.global_epoch == self.local_epoch and not force:
            return
        tracker.fetched_global_progress_this_epoch.clear()
        tracker.global_progress.next_fetch_time = 0.0
        tracker.global_state_updated.set()  # wakes the fetcher, which then sees that a read is due now
        if not tracker.fetched_global_progress_this_epoch.wait(timeout):
            logger.warning("the swarm's progress was not read within %.0f s", timeout)
