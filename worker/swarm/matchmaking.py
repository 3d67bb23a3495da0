"""How often a peer that looks for an averaging group asks the DHT who else is looking: at most once per poll
interval, set by the experiment's matchmaking time, where hivemind asks as fast as the DHT answers.

hivemind 1.1.12's matchmaking (``hivemind.averaging.matchmaking.PotentialLeaders``) re-reads its group key whenever
its queue of potential leaders is empty or holds no leader earlier than its own declaration: ``pop_next_leader``
sets ``update_triggered`` and ``_update_queue_periodically`` answers with another ``GroupKeyManager.get_averagers``
at once, in a loop with no pause. So for the whole of a search (``matchmaking_time``, seconds, every epoch and for
each of a peer's two averagers) a peer sends DHT lookups back to back, and every lookup is a request to several
peers (then signed, and each answer too: swarm protocol 1). Measured on two digits volunteers and the server's peers
on 127.0.0.1: each volunteer's DHT sent about 170 find requests a second, nearly all for the two group keys, and
the DHT processes and their ``p2pd`` were most of the swarm's CPU (the trainers themselves 0.01 cores).

:func:`install` makes every ``get_averagers`` of one key manager wait until the poll interval has passed since its
previous one: a quarter of the experiment's ``matchmaking_time``, between ``MIN_POLL_SECONDS`` and
``MAX_POLL_SECONDS`` (:func:`poll_seconds`). A leader declares its group at least ``matchmaking_time`` ahead, so a
follower sees a newly declared leader with three quarters of that window left. A search's first lookup is not
delayed. The lookup itself, and who may join whom, are hivemind's, unchanged, so peers with and without it match with
each other.

A peer that looks for a group all the time (the server's witness) would otherwise read the key five times a second
for as long as it runs, and each read is a request that every other peer answers: at a 3 s matchmaking time it now
reads 1.3 times a second.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import math
import time
from collections.abc import Iterable
from typing import Any

# The least time between two lookups of the peers looking for a group, per averager: a quarter of the matchmaking
# time, within these bounds.
MIN_POLL_SECONDS = 0.2
MAX_POLL_SECONDS = 1.0


def poll_seconds(matchmaking_time: float) -> float:
    """The least time between two group lookups of an averager whose matchmaking time is ``matchmaking_time``."""
    return min(max(matchmaking_time / 4, MIN_POLL_SECONDS), MAX_POLL_SECONDS)


def install(poll: float = MIN_POLL_SECONDS) -> None:
    """Pace hivemind's group lookups to one per ``poll`` seconds per averager (in this process and in the averager
    processes it forks after this call)."""
    from hivemind.averaging.key_manager import GroupKeyManager

    original = getattr(GroupKeyManager.get_averagers, "__swarmhub_original__", GroupKeyManager.get_averagers)

    async def get_averagers(self: Any, group_key: Any, only_active: bool) -> Any:
        last = getattr(self, "_swarmhub_last_lookup", None)
        if last is not None:
            wait = last + poll - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        self._swarmhub_last_lookup = time.monotonic()
        found = await original(self, group_key, only_active)
        # who declared themselves in this key, and until when (``_needed_group_size`` looks for a witness there)
        self._swarmhub_declared = {peer.to_base58(): expiration for peer, expiration in found}
        if _EXPECTING and self.prefix.endswith("_grad_averager"):
            _learn_server_peers(self.dht, self._swarmhub_declared)
        return found

    get_averagers.__swarmhub_original__ = original  # type: ignore[attr-defined]
    get_averagers.__doc__ = original.__doc__
    GroupKeyManager.get_averagers = get_averagers  # type: ignore[method-assign]


def uninstall() -> None:
    """Put hivemind's own lookup back (for a process that builds plain hivemind peers after swarmhub's)."""
    from hivemind.averaging.key_manager import GroupKeyManager

    original = getattr(GroupKeyManager.get_averagers, "__swarmhub_original__", None)
    if original is not None:
        GroupKeyManager.get_averagers = original  # type: ignore[method-assign]


# -- waiting for the server's witness -------------------------------------------------------------------------------
#
# Only the rounds that the server's witness (its auxiliary peer) takes part in earn verified credit, and on a busy
# machine the witness can be a moment late: two volunteers' peers then average without it, and neither is credited
# for that round. hivemind's leader assembles its group when its declared time is up if it has at least
# ``min_group_size`` members (``Matchmaking._request_join_potential_leaders``, ``rpc_join_group``). With
# :func:`expect_witnesses`, that threshold is read through :func:`_needed_group_size`: while the leader's followers
# include none of the witnesses the hub named at the join, a witness has declared itself in the group key lately (it is
# alive and looking), and the round's scheduled time is less than ``grace`` seconds past, no group is good enough:
# the leader sends its followers away and keeps looking (each one looks again too), and the witness joins one of them.
# After the grace, or with no witness seen, hivemind's own threshold applies: a round without a witness is a round
# uncredited, never a round not averaged. Gradient rounds only (the witness averages no state).

_WITNESSES: frozenset[str] = frozenset()
_GRACE = 0.0
_NEVER = 2**31
_EXPECTING = False
# The server's peers among those declared in the gradient key, learnt from the roster in the averager's process: a
# witness that started after this peer joined is waited for too. Read at most every ROSTER_SECONDS, and only when a
# peer not classified yet declares itself.
ROSTER_SECONDS = 10.0
_SERVER_PEERS: set[str] = set()
_OTHER_PEERS: set[str] = set()
_roster_read_at = -ROSTER_SECONDS


def witness_grace(matchmaking_time: float) -> float:
    """How long past its scheduled time a leader waits for a witness: two matchmaking times, at least a second."""
    return max(2.0 * matchmaking_time, 1.0)


def expect_witnesses(witnesses: frozenset[str], grace: float) -> None:
    """Make the gradient rounds this process (and the averager processes it forks after this call) leads wait up to
    ``grace`` seconds for one of ``witnesses`` (peer IDs, base58)."""
    from hivemind.averaging.matchmaking import Matchmaking

    global _WITNESSES, _GRACE, _EXPECTING
    _WITNESSES, _GRACE, _EXPECTING = frozenset(witnesses), grace, True
    if _EXPECTED is None:
        expect_group(0)  # the shared value, made before the averagers fork
    if not isinstance(Matchmaking.__dict__.get("min_group_size"), property):
        Matchmaking.min_group_size = property(_needed_group_size, _set_min_group_size)  # type: ignore[attr-defined]


def _learn_server_peers(dht: Any, declared: dict[str, float]) -> None:
    """Add the server's peers among ``declared`` to those waited for (a blocking roster read in the averager's loop,
    as ``state_guard`` makes; at most every ROSTER_SECONDS)."""
    global _roster_read_at
    unknown = declared.keys() - _SERVER_PEERS - _OTHER_PEERS
    if not unknown or time.monotonic() - _roster_read_at < ROSTER_SECONDS:
        return
    from swarmhub.worker.swarm import access as swarm_access
    from swarmhub.worker.swarm.epoch import Roster
    from swarmhub.worker.swarm.policy import POLICY

    if POLICY.experiment_key is None:
        return
    _roster_read_at = time.monotonic()
    try:
        names = Roster(dht, POLICY.run_id, POLICY.experiment_key).usernames(unknown)
    except Exception:  # the next lookup tries again
        return
    for peer in unknown & names.keys():
        (_SERVER_PEERS if names[peer] == swarm_access.SERVER_PEER_USERNAME else _OTHER_PEERS).add(peer)


# -- a round that waits for its expected group ---------------------------------------------------------------------
#
# hivemind's leader of a pre-scheduled gradient round begins at its scheduled time with whoever joined, and peers that
# estimated the epoch's end later form groups of their own, which the witness is not in (``training/optimizer.py``).
# With :func:`expect_group`, the round's group is the one the swarm's progress records show (this peer, the other
# volunteers' peers, a witness): the leader begins the moment the last of them joins (its target size, hivemind's
# ``rpc_join_group``), and until its own epoch has ended (its round triggered) it does not begin with fewer
# (:func:`_needed_group_size`): it sends its followers away and keeps looking, as hivemind's leader of too small a
# group does. Once its epoch has ended it begins with whoever is there, as before: a peer that does not come (one that
# left, one catching up) costs nothing until then. Gradient rounds of an experiment of one group only: with
# ``group_size`` the target is the group's (:func:`limit_groups`).

_EXPECTED: Any = None  # multiprocessing.Value: the expected group of this peer's next gradient round (0: unknown)


def expect_group(size: int, group: int | None = None) -> None:
    """Make the next gradient round of this peer begin once ``size`` peers (itself included) are in its group, and,
    with ``group``, look for it in that group's key (:func:`deal`); read in the averager's process, which must fork
    after the first call (made by :func:`expect_witnesses`)."""
    global _EXPECTED
    if _EXPECTED is None:
        import multiprocessing

        _EXPECTED = multiprocessing.get_context("fork").Value("i", 0, lock=False)
        from hivemind.averaging.matchmaking import Matchmaking

        if not isinstance(Matchmaking.__dict__.get("target_group_size"), property):
            Matchmaking.target_group_size = property(_target_group_size, _set_target_group_size)  # type: ignore
    _EXPECTED.value = max(int(size), 0)
    if group is not None:
        look_in_group(group)


def _set_target_group_size(self: Any, value: int | None) -> None:
    self._swarmhub_target_group_size = value


def _target_group_size(self: Any) -> int | None:
    own: int | None = self.__dict__.get("_swarmhub_target_group_size", self.__dict__.get("target_group_size"))
    if _EXPECTED is None or _EXPECTED.value < 2 or not self._prefix.endswith("_grad_averager"):
        return own
    if own is None:
        return int(_EXPECTED.value)
    return min(own, int(_EXPECTED.value)) if dealt_group() is not None else own


def _set_min_group_size(self: Any, value: int) -> None:
    self._swarmhub_min_group_size = value


def _needed_group_size(self: Any) -> int:
    from hivemind.utils import get_dht_time

    # (an instance made before the property was installed keeps its own value in its __dict__)
    base: int = self.__dict__.get("_swarmhub_min_group_size", self.__dict__.get("min_group_size", 2))
    if not self._prefix.endswith("_grad_averager") or self.step_control is None:
        return base
    witnesses = _WITNESSES | _SERVER_PEERS
    if self.peer_id.to_base58() in witnesses:
        return base
    whole = _GROUP_SIZE <= 0 or dealt_group() is not None  # the group is known: one group, or one dealt
    expected = _EXPECTED.value if _EXPECTED is not None and whole else 0
    if expected > base and not self.step_control.triggered:
        return expected  # this peer's epoch has not ended: the whole expected group, or keep looking
    if not witnesses or any(peer.to_base58() in witnesses for peer in self.current_followers):
        return base
    now = get_dht_time()
    if now > self.step_control.scheduled_time + _GRACE:
        return base
    declared = getattr(self.group_key_manager, "_swarmhub_declared", {})
    if not any(expiration >= now - _GRACE for peer, expiration in declared.items() if peer in witnesses):
        return base  # no witness looking for a group lately: nothing to wait for
    return _NEVER


# -- averaging groups of a set size, one witness each ---------------------------------------------------------------
#
# A swarm of many peers averages in groups (the experiment's ``group_size``: hivemind's ``target_group_size``), and a
# witness can sit in one group per round: the server runs one witness per group (``server/swarm/host.py``). So that
# the groups share them out, a leader of a gradient round (:func:`limit_groups`) refuses a second witness (its group
# holds one, or it is one), and refuses a volunteer's peer once its group holds ``group_size`` of them; hivemind's
# target size is one more (:func:`target_group_size`), so a group of ``group_size`` volunteers' peers and a witness is
# full and begins at once. A refused peer asks the next leader, as for a full group in hivemind (GROUP_IS_FULL). A
# leader with fewer peers begins at its declared time, as before; one without a witness waits for one as above.

_GROUP_SIZE = 0  # volunteers' peers per gradient group; 0: no limit (one group)
_SELF_WITNESS = False  # this process is one of the server's witnesses


def group_size() -> int:
    """The volunteers' peers per gradient group this process's rounds hold (0: one group)."""
    return _GROUP_SIZE


def target_group_size(group_size: int) -> int | None:
    """hivemind's ``target_group_size`` for the gradient averager of an experiment whose ``group_size`` is given:
    room for a witness beside ``group_size`` volunteers' peers; None (no limit) for 0."""
    return group_size + 1 if group_size > 0 else None


def limit_groups(group_size: int, witness: int | None = None) -> None:
    """Make the gradient rounds this process (and the averager processes it forks after this call) leads hold at most
    ``group_size`` volunteers' peers and one witness; ``witness``: this process is the server's witness of that number,
    whose rounds look in that dealt group's key (:func:`deal`)."""
    from hivemind.averaging.matchmaking import Matchmaking

    global _GROUP_SIZE, _SELF_WITNESS
    _GROUP_SIZE, _SELF_WITNESS = group_size, witness is not None
    if group_size > 0:
        look_in_group(witness if witness is not None else -1)  # a trainer's group is dealt each round
    if group_size <= 0 or hasattr(Matchmaking._check_reasons_to_reject, "__swarmhub_original__"):
        return
    original = Matchmaking._check_reasons_to_reject

    def _check_reasons_to_reject(self: Any, request: Any, context: Any) -> Any:
        found = original(self, request, context)
        if found is not None or _GROUP_SIZE <= 0 or not self._prefix.endswith("_grad_averager"):
            return found
        return _past_group_rules(self, context.remote_id)

    _check_reasons_to_reject.__swarmhub_original__ = original  # type: ignore[attr-defined]
    Matchmaking._check_reasons_to_reject = _check_reasons_to_reject  # type: ignore[method-assign]


def _past_group_rules(matchmaking: Any, joining: Any) -> Any:
    """A GROUP_IS_FULL answer for ``joining`` where the leader's group has room for no more of its kind; else None."""
    from hivemind.proto import averaging_pb2

    witnesses = _WITNESSES | _SERVER_PEERS
    followers = [peer.to_base58() for peer in matchmaking.current_followers]
    if joining.to_base58() in witnesses:
        full = _SELF_WITNESS or any(peer in witnesses for peer in followers)
    else:
        volunteers = sum(1 for peer in followers if peer not in witnesses) + (0 if _SELF_WITNESS else 1)
        full = volunteers >= _GROUP_SIZE
    return averaging_pb2.MessageFromLeader(code=averaging_pb2.GROUP_IS_FULL) if full else None


# -- groups dealt every epoch, one to each witness ------------------------------------------------------------------
#
# Groups that form as leaders' declared times fall left a third of the samples in rounds no witness was in (6
# volunteers in groups of 3: 0.58 to 0.90 of their claims credited, docs/benchmarks/credit.md). With ``group_size``,
# each gradient round's group is dealt instead: every volunteer's peer orders the volunteers' peers that the swarm's
# progress records show by a hash of the round's epoch and their peer IDs, and deals them round-robin into as many
# groups as the server runs witnesses (``ceil(peers / group_size)``, at most ``MAX_GROUPS``: the count the server's
# ``witnesses.wanted`` starts). Group k looks in its own key (hivemind's group bits, ``.0b`` and k in three bits), where
# the server's witness number k always looks; its expected group is its dealt peers and that witness, and waits for
# them as a one-group round does (:func:`_needed_group_size`). A peer whose view of the records differs from the
# others' looks in another key or expects another count: that round splits as before, the next epoch deals again.

MAX_GROUPS = 8  # gradient groups (and the server's witnesses) of one experiment at most
GROUP_BITS = 3  # hivemind's group bits that name a dealt group (2 ** GROUP_BITS >= MAX_GROUPS)
_DEALT: Any = None  # multiprocessing.Value: the dealt group whose key gradient rounds look in (-1: the shared key)


def groups_for(peers: int, group_size: int) -> int:
    """How many gradient groups ``peers`` volunteers' peers form in groups of ``group_size`` (0: one group)."""
    if group_size <= 0 or peers <= 0:
        return 1
    return max(1, min(MAX_GROUPS, math.ceil(peers / group_size)))


def deal(epoch: int, others: Iterable[str], own: str, group_size: int) -> tuple[int, int]:
    """(the group ``own``'s gradient round of ``epoch`` is dealt to, how many volunteers' peers that group holds)
    among ``own`` and ``others`` (the volunteers' peers with a progress record) in groups of ``group_size``. Asked at
    every training step: the deal is computed once per epoch and set of peers."""
    return _deal(epoch, frozenset(others), own, group_size)


@functools.lru_cache(maxsize=4)
def _deal(epoch: int, others: frozenset[str], own: str, group_size: int) -> tuple[int, int]:
    peers = sorted({*others, own}, key=lambda peer: hashlib.sha256(f"{epoch}:{peer}".encode()).digest())
    groups = groups_for(len(peers), group_size)
    group = peers.index(own) % groups
    return group, len(range(group, len(peers), groups))


def look_in_group(group: int) -> None:
    """Make this process's gradient rounds (and those of the averager processes it forks after the first call) look
    for their group in dealt group ``group``'s key; -1: in the shared key, as hivemind does."""
    global _DEALT
    if _DEALT is None:
        import multiprocessing

        from hivemind.averaging.key_manager import GroupKeyManager

        _DEALT = multiprocessing.get_context("fork").Value("i", -1, lock=False)
        if not hasattr(GroupKeyManager.current_key.fget, "__swarmhub_original__"):
            original = GroupKeyManager.current_key

            def current_key(self: Any) -> str:
                dealt = dealt_group()
                if dealt is None or not self.prefix.endswith("_grad_averager"):
                    return str(original.fget(self))
                return f"{self.prefix}.0b{dealt:0{GROUP_BITS}b}"

            current_key.__swarmhub_original__ = original  # type: ignore[attr-defined]
            GroupKeyManager.current_key = property(current_key)  # type: ignore[method-assign, assignment]
    _DEALT.value = int(group) if 0 <= group < MAX_GROUPS else -1


def dealt_group() -> int | None:
    """The dealt group this process's gradient rounds look in, None where they look in the shared key."""
    if _DEALT is None or _DEALT.value < 0:
        return None
    return int(_DEALT.value)
