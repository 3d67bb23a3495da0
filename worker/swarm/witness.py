"""The server's auxiliary peer as the swarm's witness: which peers took part in each completed gradient round,
with what weight, and whom the server's peer refused.

Volunteers are strangers; the server's peers are the only ones the hub vouches for. The server's auxiliary peer
takes part in every gradient averaging round as a reducer (it computes no gradients; every reachable peer
reduces a slice of the vector, see ``load_balancing``), so its reducer receives a slice from every sender with
the weight that sender claimed. When a round completes there, the reducer reports its senders (each with its
weight as counted: capped, see ``aggregation.capped_weights``; a sender whose slice was not finite or incomplete is
left out) through :data:`policy.POLICY`'s ``witness`` hook; :class:`Witness` collects these in the peer's main
process and publishes the newest ones, with the peers it flagged, as a DHT record under
``{run_id}_witness``, signed by the server peer's own key (an owner subkey, as the roster's entries are). The
server's monitor peer reads it and hands it to the ledger, which counts only these rounds as verified work.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from typing import Any

from swarmhub.worker.swarm import access as swarm_access
from swarmhub.worker.swarm import flags as peer_flags
from swarmhub.worker.swarm.policy import POLICY

logger = logging.getLogger(__name__)

KEEP_ROUNDS = 32  # rounds in the published record: the monitor reads it about every second
KEEP_FLAGS = 64
REPUBLISH_SECONDS = 60.0  # unchanged records are stored again before they expire (RECORD_SECONDS)
RECORD_SECONDS = 600.0
PRESENT_SECONDS = 15.0  # how often the witness re-stores its progress record (hivemind's expire after 60 s)
EPOCH_READ_SECONDS = 1.0  # how often it reads the swarm's records for the epoch it states
_QUEUE: Any = None  # averager processes -> the peer's main process; made before hivemind forks


def witness_key(run_id: str) -> str:
    return f"{run_id}_witness"


def _record_round(round_id: str, senders: list[tuple[str, float]]) -> None:
    try:
        _QUEUE.put_nowait((round_id, time.time(), senders))
    except Exception as exc:  # a full queue: the round goes unrecorded rather than blocking averaging
        logger.warning("could not record round %s: %r", round_id, exc)


def install() -> None:
    """Make this process (the server's auxiliary peer) a witness. Call before creating ``hivemind.Optimizer``."""
    import multiprocessing

    global _QUEUE
    if _QUEUE is None:
        _QUEUE = multiprocessing.get_context("fork").Queue(maxsize=10_000)
    POLICY.witness = _record_round


def make_recording_tracker_class() -> type:
    """hivemind's own progress tracker, which also keeps the records of its last read of the swarm's progress: the
    server's witness states its epoch from them (``Witness.swarm_epoch``) instead of reading the same key
    again, a lookup that every other peer would answer."""
    from hivemind.optim.progress_tracker import ProgressTracker

    class RecordingProgressTracker(ProgressTracker):  # type: ignore[misc, valid-type]
        last_read: tuple[float, Any] | None = None  # (time.monotonic() of the read, the records it found)

        def _parse_swarm_progress_data(self, metadata: Any) -> Any:
            self.last_read = (time.monotonic(), metadata)
            return super()._parse_swarm_progress_data(metadata)

    return RecordingProgressTracker


class Witness:
    """Publishes the rounds the averager processes saw complete, and this peer's flags, in the DHT."""

    def __init__(self, dht: Any, run_id: str, public_key: bytes, roster: Any = None):
        self.dht, self.run_id, self.public_key = dht, run_id, public_key
        self.roster = roster  # swarm_epoch.Roster: whose records vote for the epoch this peer's record states
        self.rounds: deque[dict[str, Any]] = deque(maxlen=KEEP_ROUNDS)
        self.flags: deque[dict[str, Any]] = deque(maxlen=KEEP_FLAGS)
        self._stored_at = 0.0
        self._present_at = 0.0
        self._present_epoch: int | None = None
        self._epoch_read_at = -PRESENT_SECONDS
        self._evidenced = 0  # the epoch the last rounds with partners showed

    def keep_present(self, tracker: Any) -> None:
        """Keep a progress record of this peer in the swarm (epoch: the swarm's, no samples), as a trainer's.

        hivemind's auxiliary peers publish none, so a volunteer training alone would see no other peer and never
        start an averaging round, and no round of theirs would be witnessed. With this record it averages with
        the witness. Stored when the epoch it states changes (read at most every EPOCH_READ_SECONDS) and every
        PRESENT_SECONDS; it expires after hivemind's metadata expiration.

        Volunteers bound the epochs they follow by this record's (``swarm_epoch.bounded_progress``), so it states
        what completed rounds show (:meth:`swarm_epoch`), never the tracker's epoch (the largest any record
        states): restating a forger's record one epoch ahead would lend it the hub's vote, epoch after epoch."""
        from swarmhub.worker.swarm.epoch import store_presence

        now = time.monotonic()
        if now - self._epoch_read_at < EPOCH_READ_SECONDS:
            return
        self._epoch_read_at = now
        epoch = self.swarm_epoch(tracker)
        if epoch == self._present_epoch and now - self._present_at < PRESENT_SECONDS:
            return
        if store_presence(self.dht, tracker, epoch):
            if epoch != self._present_epoch:
                logger.info("stating the swarm's epoch as %d", epoch)
            self._present_at, self._present_epoch = now, epoch

    def swarm_epoch(self, tracker: Any) -> int:
        """The epoch completed rounds show: the lower median of the votes (each account's largest epoch) of the
        volunteers this peer completed a gradient round with lately (``peer_flags.partners``, less the distrusted).
        An honest peer reaches an epoch by completing rounds, which this peer takes part in, while a peer that only
        publishes records never becomes a partner.

        Without a partner, the lower median of all the other accounts' votes where two accounts or more vote (not
        below the epoch the last rounds showed), else that epoch (0 before any round): one account's record alone
        is no evidence. An out-of-sync hivemind peer publishes no record at all, so a forger's can be the only one
        in the swarm, and restating it would keep every newcomer out of sync, each downloading another's state, for
        as long as the forger ratchets. The tracker's epoch without a roster."""
        from swarmhub.worker.swarm.epoch import median_vote, owner_peer_id, progress_entries

        if self.roster is None:
            return int(tracker.global_epoch)
        gone = peer_flags.distrusted()
        names = {peer: name for peer, name in self.roster.usernames().items() if peer not in gone}
        entries = progress_entries(self._records(tracker), names)
        partners = peer_flags.partners()
        # a client-mode partner's epoch is evidenced by its rounds as well as anyone's
        with_partners = [(name, epoch) for subkey, name, epoch, _ in entries if owner_peer_id(subkey) in partners]
        server = swarm_access.SERVER_PEER_USERNAME
        median = median_vote(with_partners, server)
        if median is not None:
            self._evidenced = median
            return median
        votes = [(name, epoch) for _, name, epoch, client in entries if not client]
        if len({name for name, _ in votes if name not in (None, server)}) >= 2:
            # before any round: the lower median of two accounts or more never is one forger's alone
            return max(self._evidenced, median_vote(votes, server) or 0)
        return self._evidenced

    def _records(self, tracker: Any) -> Any:
        """The swarm's progress records: those of the tracker's last read when it is at most EPOCH_READ_SECONDS old
        (it reads at least every second), else read now."""
        read = getattr(tracker, "last_read", None)
        if read is not None and time.monotonic() - read[0] <= EPOCH_READ_SECONDS:
            return read[1]
        found = self.dht.get(tracker.training_progress_key, latest=True)
        return found.value if found is not None else None

    def publish(self, epoch: int) -> None:
        """Collect what happened since the last call (rounds of ``epoch``, the epoch the peer was in before its
        last step) and store the record when something is new or it nears expiry."""
        import queue

        changed = False
        while _QUEUE is not None:
            try:
                round_id, at, senders = _QUEUE.get_nowait()
            except (queue.Empty, OSError, ValueError):
                break
            self.rounds.append(
                {"id": round_id, "epoch": int(epoch), "time": at, "senders": [[p, float(w)] for p, w in senders]}
            )
            changed = True
        for peer_id, reasons in peer_flags.take_flags().items():
            for reason, count in reasons.items():
                if reason in peer_flags.LOCAL_REASONS:
                    continue
                self.flags.append({"id": uuid.uuid4().hex, "peer_id": peer_id, "reason": reason, "count": count})
                changed = True
        if changed or time.monotonic() - self._stored_at >= REPUBLISH_SECONDS:
            self.store()

    def store(self) -> None:
        from hivemind.utils.timed_storage import get_dht_time

        value = {"rounds": list(self.rounds), "flags": list(self.flags)}
        stored = self.dht.store(
            witness_key(self.run_id),
            subkey=swarm_access.roster_subkey(self.public_key),
            value=value,
            expiration_time=get_dht_time() + RECORD_SECONDS,
        )
        if stored:
            self._stored_at = time.monotonic()
        else:
            logger.warning("could not publish the witnessed rounds")
