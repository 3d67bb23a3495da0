"""The swarm's epoch as a peer reads it from strangers' progress records: one vote per account (``robust``'s
overview says why). ``Roster`` names the account behind each record's signing key."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from typing import Any

from swarmhub.worker.swarm import access as swarm_access

logger = logging.getLogger(__name__)
ROSTER_CACHE_SECONDS = 10.0
ROSTER_UNKNOWN_SECONDS = 1.0  # at most this often when a record is signed by a peer the last read did not hold


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
