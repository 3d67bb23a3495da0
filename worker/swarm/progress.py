"""The progress tracker as a volunteer's peer runs it: hivemind's, reading the swarm's epoch through
``epoch.bounded_progress``, storing at most one signed record every ``PROGRESS_INTERVAL``, leaving out the records of
peers whose state it cannot catch up with, and counting the group a gradient round expects (:func:`group_peers`)."""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

from swarmhub.worker.swarm import access as swarm_access
from swarmhub.worker.swarm import flags as peer_flags
from swarmhub.worker.swarm.epoch import Roster, bounded_progress, owner_peer_id, progress_entries

logger = logging.getLogger(__name__)
# At most one signed progress record per this many seconds from a training peer (besides the epoch's first and its
# final count): hivemind stores one after every step, and each costs the peer's DHT process, its p2pd and every
# receiving peer a signature and a check.
PROGRESS_INTERVAL = 1.0
# A record is not followed for this long once this peer, out of sync, has found no state at the epoch it states for
# UNBACKED_AFTER_SECONDS (see GuardedProgressTracker.leave_out_unbacked).
UNBACKED_SECONDS = 60.0
UNBACKED_AFTER_SECONDS = 20.0


def group_peers(kept: Any, names: dict[str, str], own_peer: str) -> tuple[frozenset[str], int]:
    """(the volunteers' peers other than ``own_peer``, how many of the server's peers) among the signers of the
    progress records ``kept`` that are on the roster (``names``: peer ID -> username). The server's peers that keep a
    record are its witnesses and its checkpoint peer (``epoch.store_presence``)."""
    volunteers: set[str] = set()
    server = 0
    for subkey in kept if isinstance(kept, dict) else ():
        peer = owner_peer_id(subkey)
        if peer is None or peer == own_peer or peer not in names:
            continue
        if names[peer] == swarm_access.SERVER_PEER_USERNAME:
            server += 1
        else:
            volunteers.add(peer)
    return frozenset(volunteers), server


def make_tracker_class() -> type:
    from hivemind.optim.progress_tracker import ProgressTracker
    from hivemind.utils.timed_storage import get_dht_time  # at every step (``_hasten_read``): imported once

    class GuardedProgressTracker(ProgressTracker):  # type: ignore[misc, valid-type]
        """hivemind's progress tracker, reading the swarm's epoch through :func:`bounded_progress`."""

        def __init__(self, *args: Any, roster: Roster, **kwargs: Any):
            self.roster = roster
            self.epoch_bound: int | None = None
            # volunteers' peers other than this one among the records read last (the server's hold no training state)
            self.other_trainers = 1
            self._signalled_at = -math.inf  # when a record was last asked for (time.monotonic())
            self._signalled_epoch: int | None = None
            self._signalled_ready = False
            self._timing = False  # the first step was seen: the EMA times the steps from then on
            self._unsent = threading.Event()  # a count was kept back: the flusher sends it within the interval
            self.kept_epochs: dict[str, int] = {}  # volunteers' peer ID -> epoch, of the records followed last
            self._unbacked: dict[str, float] = {}  # peer ID -> monotonic time until which its records are left out
            # (volunteers' peers other than this one, how many of the server's peers) with a record among those
            # followed last: the group a gradient round of this peer expects (``matchmaking.expect_group``)
            self.group_peers: tuple[frozenset[str], int] | None = None
            super().__init__(*args, **kwargs)
            threading.Thread(target=self._flush_kept_counts, daemon=True, name="swarmhub-progress").start()

        def report_local_progress(
            self, local_epoch: int, samples_accumulated: int, update_global_samples: bool = True
        ) -> None:
            """hivemind's bookkeeping at every step, but a signed record in the DHT at most every
            ``PROGRESS_INTERVAL`` seconds (hivemind stores one per call: one per training step). A record goes out
            at once when the epoch changes and when this peer's count completes the epoch (the epoch's final count,
            which the other peers and the server's ledger read); a count kept back goes out within the interval."""
            progress: Any = self.local_progress  # type: ignore[has-type]
            extra = samples_accumulated - progress.samples_accumulated
            if update_global_samples and local_epoch == progress.epoch == self.global_progress.epoch:
                self.global_progress.samples_accumulated += extra
            if extra > 0 and self.performance_ema.num_updates == 0 and not self._timing:
                # The first step's interval runs from the tracker's creation: the worker's start-up, not training.
                # Counted, it would keep this peer's rate (published, and behind its next read of the swarm's
                # progress, ``_hasten_read``) far too low for the first epoch, as hivemind's EMA forgets slowly.
                self._timing = True
                self.performance_ema.reset_timer()
            elif extra > 0:
                self.performance_ema.update(task_size=extra)
            else:
                self.performance_ema.reset_timer()
            self.local_progress = self._get_local_progress(local_epoch, samples_accumulated)
            if extra > 0:
                self._hasten_read()
            ready = self.ready_to_update_epoch
            now = time.monotonic()
            urgent = local_epoch != self._signalled_epoch or (ready and not self._signalled_ready)
            if urgent or now - self._signalled_at >= PROGRESS_INTERVAL:
                self._signalled_at, self._signalled_epoch, self._signalled_ready = now, local_epoch, ready
                self._unsent.clear()
                self.should_report_progress.set()
            else:
                self._unsent.set()

        def _hasten_read(self) -> None:
            """Bring the swarm's next progress read forward to when hivemind would schedule it knowing this peer's
            rate now. hivemind schedules each read from the rates it read last: at a swarm's start every rate is
            still unknown (its EMA starts at ~0 samples/s), so the ETA is endless and the next read is
            ``max_refresh_period`` (10 s) away, or ``default_refresh_period`` (3 s) when no record was there yet.
            Peers that start together would each train a whole target batch on its own before reading the
            others' records: a first global batch of N targets. With this rule the read comes when hivemind's own rule
            puts it for the rate now known (a fraction of the time to the target, at least ``min_refresh_period``),
            and the others' first records (sent at once, see ``report_local_progress``) are in it. Cheap: it wakes
            the fetcher only when the due time moves earlier."""
            progress: Any = self.global_progress
            rate = self.performance_ema.samples_per_second
            if rate <= 1e-9:
                return
            peers = max(int(progress.num_peers), 1)
            expected = max(peers + self.expected_drift_peers, peers * (1 + self.expected_drift_rate))
            remaining = max(0, self.target_batch_size - progress.samples_accumulated)
            wait = min(max(remaining / rate * peers / expected, self.min_refresh_period), self.max_refresh_period)
            due = get_dht_time() + wait
            if due < progress.next_fetch_time - self.min_refresh_period:
                progress.next_fetch_time = due
                self.global_state_updated.set()  # the fetcher waits again, until the new due time

        def _flush_kept_counts(self) -> None:
            while not self.shutdown_triggered.is_set():
                self._unsent.wait()
                time.sleep(max(0.0, self._signalled_at + PROGRESS_INTERVAL - time.monotonic()))
                if self._unsent.is_set() and time.monotonic() - self._signalled_at >= PROGRESS_INTERVAL:
                    self._signalled_at = time.monotonic()
                    self._unsent.clear()
                    self.should_report_progress.set()

        def unbacked(self) -> frozenset[str]:
            now = time.monotonic()
            return frozenset(peer for peer, until in self._unbacked.items() if until > now)

        def leave_out_unbacked(self, own_epoch: int) -> list[str]:
            """Leave out, for UNBACKED_SECONDS, the records of the volunteers' peers that state an epoch this peer
            could not catch up with (past ``own_epoch`` + 1): called when it found no state at their epoch for
            UNBACKED_AFTER_SECONDS. A record whose epoch no peer's state holds keeps a newcomer out of sync at every
            step, downloading other newcomers' states, for as long as it is followed; and hivemind publishes no
            record for an out-of-sync peer, so a forger's can be the only ones there are. An honest peer's records
            come back after the pause. The peers left out."""
            now = time.monotonic()
            ahead = [peer for peer, epoch in self.kept_epochs.items() if epoch > own_epoch + 1]
            # the only writer: the pauses that ran out are forgotten here, and one new dict replaces the old
            self._unbacked = {
                **{peer: until for peer, until in self._unbacked.items() if until > now},
                **dict.fromkeys(ahead, now + UNBACKED_SECONDS),
            }
            return ahead

        def _parse_swarm_progress_data(self, metadata: Any) -> Any:
            try:
                signers = {owner_peer_id(subkey) for subkey in metadata} if isinstance(metadata, dict) else set()
                names = self.roster.usernames(needed={peer for peer in signers if peer})
                kept, self.epoch_bound, ahead = bounded_progress(
                    metadata,
                    names,
                    self.roster.own_username,
                    self.local_progress.epoch,
                    peer_flags.distrusted() | self.unbacked(),
                    peer_flags.partners(),
                    self.dht.peer_id.to_base58(),
                )
                not_trainers = {self.roster.own_username, swarm_access.SERVER_PEER_USERNAME}
                self.kept_epochs = {
                    owner_peer_id(subkey) or "?": epoch
                    for subkey, name, epoch, _ in progress_entries(kept, names)
                    if name not in not_trainers
                }
                self.other_trainers = sum(
                    1 for subkey in kept or () if names.get(owner_peer_id(subkey) or "") not in not_trainers
                )
                self.group_peers = group_peers(kept, names, self.dht.peer_id.to_base58())
            except Exception as exc:  # never stop the tracker: read as hivemind would
                logger.warning("could not bound the swarm's progress: %r", exc)
                kept = metadata
            else:
                for peer in ahead:
                    logger.warning("ignored a progress record of %s: its epoch is past the swarm's", peer)
                    peer_flags.flag(peer, "epoch ahead of the swarm")
                kept = self._with_own_progress(kept)
            return super()._parse_swarm_progress_data(kept)

        def _with_own_progress(self, kept: Any) -> Any:
            """``kept`` with this peer's own record as it stands now (its count at its last step, its rate), not as
            read back from the DHT: that one is up to ``PROGRESS_INTERVAL`` old, or as old as the loop's wait after
            an epoch change (``resume_after_wait``), and hivemind extrapolates it at this peer's rate, counting
            samples it never trained."""
            from hivemind.utils import ValueWithExpiration

            own = self._local_public_key  # the subkey this tracker stores its records under, signed by its key
            item = kept.get(own) if isinstance(kept, dict) else None
            if not isinstance(item, ValueWithExpiration):
                return kept
            fresh = ValueWithExpiration(self.local_progress.dict(), item.expiration_time)  # type: ignore[has-type]
            return {**kept, own: fresh}

        def resume_after_wait(self) -> None:
            """The training loop waited after an epoch change (its epoch-length guard) and trains again. It trained
            nothing while it waited, but its record kept the time of the epoch change, and a read of the swarm's
            progress during the wait extrapolated it over the wait: a peer alone in its swarm then found its next
            epoch complete after a step or two, and trained at a small fraction of its rate. Its record is stamped
            now (and sent), the ETA read during the wait is dropped, and the swarm's progress is read again at
            once."""
            with self.lock_global_progress:  # after a read under way, before the next one
                progress: Any = self.local_progress  # type: ignore[has-type]
                self.local_progress = self._get_local_progress(progress.epoch, progress.samples_accumulated)
                self.global_progress.eta_next_epoch = float("inf")
                self.global_progress.next_fetch_time = get_dht_time()
            self._signalled_at = time.monotonic()
            self._unsent.clear()
            self.should_report_progress.set()
            self.global_state_updated.set()  # the fetcher reads now, not at the time it chose during the wait

    return GuardedProgressTracker
