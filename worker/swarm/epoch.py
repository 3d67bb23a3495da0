"""The swarm's epoch as a peer reads it from strangers' progress records: one vote per account (``robust``'s
overview says why). ``Roster`` names the account behind each record's signing key."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable
from typing import Any

from swarmhub.worker.swarm import access as swarm_access
from swarmhub.worker.swarm import flags as peer_flags

logger = logging.getLogger(__name__)
ROSTER_CACHE_SECONDS = 10.0
ROSTER_UNKNOWN_SECONDS = 1.0  # at most this often when a record is signed by a peer the last read did not hold
# At most one signed progress record per this many seconds from a training peer (besides the epoch's first and its
# final count): hivemind stores one after every step, and each costs the peer's DHT process, its p2pd and every
# receiving peer a signature and a check.
PROGRESS_INTERVAL = 1.0
# A record is not followed for this long once this peer, out of sync, has found no state at the epoch it states for
# UNBACKED_AFTER_SECONDS (see GuardedProgressTracker.leave_out_unbacked).
UNBACKED_SECONDS = 60.0
UNBACKED_AFTER_SECONDS = 20.0


class Roster:
    """Who signed what: the owner key of a protected record -> the username of its admitted token (cached).
    A volunteer the organizer removed (``denied``) is on no roster, whatever entries of theirs the DHT still holds."""

    def __init__(
        self,
        dht: Any,
        run_id: str,
        experiment_key: Any,
        own_username: str | None = None,
        denied: swarm_access.DenyList | None = None,
    ):
        self.dht, self.run_id, self.experiment_key = dht, run_id, experiment_key
        self.own_username = own_username
        self.denied = denied
        self._names: dict[str, str] = {}
        self._not_found: set[str] = set()  # signers the last read was asked for and did not find
        self._read_at = -math.inf

    def usernames(self, needed: Iterable[str] = ()) -> dict[str, str]:
        """Peer ID -> username, for every peer on the roster. Read again every ``ROSTER_CACHE_SECONDS``, and at most
        every ``ROSTER_UNKNOWN_SECONDS`` when one of ``needed`` (the signers of the records about to be read) is on no
        entry read so far and was not already looked for: a peer that just joined counts towards the swarm's batch
        from its first record, not from this peer's next scheduled read (until then its samples would go uncounted,
        and this peer would keep accumulating past the target). A signer that a read did not find (a peer on no
        roster entry) is looked for again only at the scheduled reads, so its records cost no extra reads."""
        wanted = set(needed)
        new = wanted - self._names.keys() - self._not_found
        age = time.monotonic() - self._read_at
        if age >= ROSTER_CACHE_SECONDS or (new and age >= ROSTER_UNKNOWN_SECONDS):
            guard = swarm_access.RosterGuard(self.experiment_key, self.run_id)
            try:
                guard.admit(self.dht.get(swarm_access.roster_key(self.run_id), latest=True))
            except Exception as exc:  # keep the last read
                logger.warning("could not read the swarm's roster: %r", exc)
            else:
                self._names = dict(guard._usernames)
                self._not_found = (wanted or self._not_found) - self._names.keys()  # of the records read now
            self._read_at = time.monotonic()  # a failed read is not retried at every step either
        if self.denied is None:
            return self._names
        return {peer: name for peer, name in self._names.items() if name not in self.denied}


def owner_peer_id(subkey: Any) -> str | None:
    owner = swarm_access.record_owner(subkey)
    if owner is None:
        return None
    try:
        return swarm_access.peer_id_for_public_key(owner)
    except ValueError:
        return None


def _votes(entries: Iterable[tuple[str | None, int]], own_username: str | None) -> list[int]:
    """Each other account's vote (the largest epoch among its records), in order."""
    votes: dict[str, int] = {}
    for username, epoch in entries:
        if username is not None and username != own_username:
            votes[username] = max(votes.get(username, 0), epoch)
    return sorted(votes.values())


def median_vote(entries: Iterable[tuple[str | None, int]], own_username: str | None) -> int | None:
    """The lower median of the other accounts' votes (``entries`` are (username, epoch)); None without any."""
    ordered = _votes(entries, own_username)
    return ordered[(len(ordered) - 1) // 2] if ordered else None


def epoch_bound(entries: Iterable[tuple[str | None, int]], own_username: str | None, own_epoch: int) -> int | None:
    """The largest epoch a progress record may state, as the peer of ``own_username`` at ``own_epoch`` judges:
    one past the larger of its own epoch and the lower median of the other accounts' votes (each account's vote
    is the largest epoch among its records; the server's peers are one account). ``entries`` are (username,
    epoch). None (no bound) when no other account has a record: one account alone cannot be judged."""
    ordered = _votes(entries, own_username)
    if not ordered:
        return None
    if own_epoch <= 0:
        # A newcomer has no epoch of its own to hold records against: the upper median, so that honest peers a
        # few epochs apart all stay within its view (a made-up epoch still needs half the other accounts).
        return ordered[len(ordered) // 2] + 1
    return max(own_epoch, ordered[(len(ordered) - 1) // 2]) + 1


def progress_entries(metadata: Any, names: dict[str, str]) -> list[tuple[Any, str | None, int, bool]]:
    """(subkey, username, epoch, client_mode) of each parseable progress record."""
    from hivemind.optim.progress_tracker import LocalTrainingProgress

    entries: list[tuple[Any, str | None, int, bool]] = []
    if not isinstance(metadata, dict):
        return entries
    for subkey, item in metadata.items():
        try:
            progress = LocalTrainingProgress.parse_obj(item.value)
        except Exception:  # noqa: S112 - a malformed record is ignored, as hivemind ignores it
            continue
        peer_id = owner_peer_id(subkey)
        entries.append((subkey, names.get(peer_id) if peer_id else None, int(progress.epoch), progress.client_mode))
    return entries


def bounded_progress(
    metadata: Any,
    names: dict[str, str],
    own_username: str | None = None,
    own_epoch: int = 0,
    distrusted: frozenset[str] = frozenset(),
    partners: frozenset[str] | None = None,
    own_peer: str | None = None,
) -> tuple[Any, int | None, list[str]]:
    """``metadata`` without the records whose epoch is past the bound (and without records of peers not on the
    roster, or ``distrusted``); the bound; the peer IDs whose records were dropped for their epoch.

    The bound is one past the larger of this peer's epoch and the hub's vote (the largest epoch its peers' records
    state, less the record of ``own_peer``, this peer's ID) where the server's peers are in the swarm, and
    :func:`epoch_bound` (the other accounts' median) where they are not: with two forging accounts of three, the
    median is a forged epoch; the hub's is not.

    With ``partners`` (the peers this one averaged with lately, see ``peer_flags.partners``), a peer already in the
    swarm follows a record at the bound itself (one past both its own epoch and the hub's vote, or the median) only
    from a partner or the server's peers: an honest peer gets there by completing a round, usually with this one,
    while a peer that only publishes records one epoch ahead would otherwise make this peer skip to that epoch
    (and drop the gradients it accumulated) every time it does."""
    if not isinstance(metadata, dict):
        return metadata, None, []
    if distrusted:
        names = {peer: name for peer, name in names.items() if peer not in distrusted}
    entries = progress_entries(metadata, names)
    voters = [(name, epoch) for _, name, epoch, client in entries if not client]
    server = swarm_access.SERVER_PEER_USERNAME
    # The hub's vote leaves out this peer's own record: the server's checkpoint peer follows the witness's.
    hub = (
        []
        if own_username == server and own_peer is None
        else [
            epoch
            for subkey, name, epoch, client in entries
            if not client and name == server and (own_peer is None or owner_peer_id(subkey) != own_peer)
        ]
    )
    median: int | None
    if hub:
        # The hub's vote stands for the others': its witness states the epoch its partners reached by completing
        # rounds with it (``witness.Witness.swarm_epoch``), which no number of forging accounts moves.
        median = max(hub)
        bound: int | None = max(own_epoch, median) + 1
    else:
        bound = epoch_bound(voters, own_username, own_epoch)
        median = median_vote(voters, own_username)
    kept: dict[Any, Any] = {}
    ahead = []
    for subkey, name, epoch, _ in entries:
        if name is None:
            continue
        peer = owner_peer_id(subkey) or "?"
        # The server's peers are followed wherever they are: the hub vouches for them, and its checkpoint peer
        # shares a rolled-back state ten epochs past the swarm's (``server/experiments/rollback.py``).
        if name not in (own_username, swarm_access.SERVER_PEER_USERNAME) and bound is not None:
            unvouched = (
                partners is not None
                and own_epoch > 0
                and median is not None
                and epoch > max(own_epoch, median)
                and peer not in partners
            )
            if epoch > bound or unvouched:
                ahead.append(peer)
                continue
        kept[subkey] = metadata[subkey]
    return kept, bound, ahead


def store_presence(dht: Any, tracker: Any, epoch: int) -> bool:
    """Store a progress record of this peer at ``epoch`` with no samples, as a trainer's. hivemind publishes none
    for a peer that accumulates no samples (the server's witness and checkpoint peer), so without it the others
    would not see the peer, nor its epoch. Expires after hivemind's metadata expiration; True when stored."""
    from hivemind.optim.progress_tracker import LocalTrainingProgress
    from hivemind.utils.timed_storage import get_dht_time

    record = LocalTrainingProgress(
        peer_id=dht.peer_id.to_bytes(),
        epoch=int(epoch),
        samples_accumulated=0,
        samples_per_second=0.0,
        time=get_dht_time(),
        client_mode=False,
    )
    return bool(
        dht.store(
            tracker.training_progress_key,
            subkey=tracker._local_public_key,
            value=record.dict(),
            expiration_time=get_dht_time() + tracker.metadata_expiration,
        )
    )


def group_peers(kept: Any, names: dict[str, str], own_peer: str) -> tuple[int, int]:
    """(volunteers' peers other than ``own_peer``, the server's peers) among the signers of the progress records
    ``kept`` that are on the roster (``names``: peer ID -> username). The server's peers that keep a record are its
    witnesses (``witness.Witness.keep_present``)."""
    volunteers = server = 0
    for subkey in kept if isinstance(kept, dict) else ():
        peer = owner_peer_id(subkey)
        if peer is None or peer == own_peer or peer not in names:
            continue
        if names[peer] == swarm_access.SERVER_PEER_USERNAME:
            server += 1
        else:
            volunteers += 1
    return volunteers, server


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
            # (volunteers' peers other than this one, the server's peers) with a record among those followed last: the
            # group a gradient round of this peer expects (``matchmaking.expect_group``)
            self.group_peers: tuple[int, int] | None = None
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
