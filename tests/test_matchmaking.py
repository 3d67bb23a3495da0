"""A peer looking for an averaging group asks the DHT at a bounded rate who else looks, and still finds its group."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
import torch

from swarmhub.worker.swarm import matchmaking

from .swarm_processes import loopback_dhts

pytestmark = pytest.mark.swarm

SEARCH_SECONDS = 3.0


def _lookups_of_a_lone_search(dht: object, poll: float | None) -> int:
    """Search for a group alone for SEARCH_SECONDS, as hivemind's matchmaking does, and count the DHT lookups of the
    group key (counted under the pacing, if any)."""
    from hivemind.averaging.control import StepControl
    from hivemind.averaging.key_manager import GroupKeyManager
    from hivemind.averaging.matchmaking import PotentialLeaders
    from hivemind.utils import MPFuture, get_dht_time

    counted = GroupKeyManager.get_averagers
    calls = 0

    async def counting(self: GroupKeyManager, group_key: str, only_active: bool) -> object:
        nonlocal calls
        calls += 1
        return await counted(self, group_key, only_active)

    GroupKeyManager.get_averagers = counting  # type: ignore[method-assign]
    if poll is not None:
        matchmaking.install(poll)
    try:

        async def search() -> None:
            keys = GroupKeyManager(dht, "pace-test", "", target_group_size=None)  # type: ignore[arg-type]
            leaders = PotentialLeaders(keys.peer_id, min_matchmaking_time=SEARCH_SECONDS, target_group_size=None)
            now = get_dht_time()
            step = StepControl(now, now + SEARCH_SECONDS, allow_retries=True, weight=1.0, data_for_gather=b"")
            step.attach(MPFuture(), MPFuture())
            step.allow_allreduce()  # a step that is let go (hivemind warns about one that is not)
            async with leaders.begin_search(step, keys, declare=True):
                deadline = time.monotonic() + SEARCH_SECONDS
                while time.monotonic() < deadline:  # as Matchmaking does: no leader yet, so ask again
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(leaders.pop_next_leader(), max(0.0, deadline - time.monotonic()))

        asyncio.run(search())
    finally:
        matchmaking.uninstall()
        GroupKeyManager.get_averagers = counted  # type: ignore[method-assign]
    return calls


@pytest.mark.parametrize("matchmaking_time", [0.5, SEARCH_SECONDS])
def test_a_peer_alone_in_its_search_asks_at_most_every_poll_interval(matchmaking_time: float) -> None:
    """hivemind re-reads the group key back to back while no leader is there; paced, at most once per poll interval:
    a quarter of the matchmaking time (0.2 s at the shortest an experiment may set, 0.75 s at 3 s)."""
    poll = matchmaking.poll_seconds(matchmaking_time)
    assert poll == max(matchmaking_time / 4, matchmaking.MIN_POLL_SECONDS)
    with loopback_dhts(2) as (_, dht):
        unpaced = _lookups_of_a_lone_search(dht, poll=None)
        paced = _lookups_of_a_lone_search(dht, poll=poll)
    assert paced <= SEARCH_SECONDS / poll + 2, (paced, unpaced)
    assert paced >= SEARCH_SECONDS / poll / 3, (paced, unpaced)  # it still looks, all along
    assert unpaced > paced, (paced, unpaced)  # hivemind alone: a lookup as soon as the last one answers


@pytest.mark.parametrize(
    ("paced", "matchmaking_time"),
    [((True, True), 0.5), ((True, False), 0.5), ((True, True), 3.0)],
    ids=["both-paced", "one-paced", "both-paced-3s"],
)
def test_paced_averagers_still_form_their_group_and_average(paced: tuple[bool, bool], matchmaking_time: float) -> None:
    """Two real averagers (each forked with or without ``install``) with the shortest matchmaking time an experiment
    may set, and with 3 s (a poll of 0.75 s): paced peers match with each other, and with a peer that reads its group
    key as hivemind does."""
    import hivemind

    with loopback_dhts(2) as dhts:
        averagers = []
        for i, (dht, pace) in enumerate(zip(dhts, paced)):
            if pace:
                matchmaking.install(matchmaking.poll_seconds(matchmaking_time))
            try:
                averagers.append(
                    hivemind.averaging.DecentralizedAverager(
                        [torch.full((1000,), float(i))],
                        dht,
                        prefix="pace-average",
                        target_group_size=2,
                        min_group_size=2,
                        min_matchmaking_time=matchmaking_time,
                        request_timeout=0.4,
                        start=True,
                    )
                )
            finally:
                matchmaking.uninstall()
        try:
            started = time.monotonic()
            controls = [a.step(wait=False, timeout=30, allow_retries=True) for a in averagers]
            groups = [control.result(timeout=60) for control in controls]
            assert all(group is not None and len(group) == 2 for group in groups)
            assert time.monotonic() - started < 30
            for a in averagers:
                with a.get_tensors() as tensors:
                    assert torch.allclose(tensors[0], torch.full((1000,), 0.5))
        finally:
            for a in averagers:
                a.shutdown()


def test_a_leader_takes_one_witness_and_at_most_group_size_volunteers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule that shares the server's witnesses out among the groups (``matchmaking.limit_groups``): a leader's
    group takes a witness only while it holds none, and volunteers' peers up to the experiment's group size."""
    from hivemind.p2p import PeerID
    from hivemind.proto import averaging_pb2

    peers = [PeerID(bytes([0x12, 0x20, *([index] * 32)])) for index in range(6)]
    witness, other_witness, volunteers = peers[0], peers[1], peers[2:]
    monkeypatch.setattr(matchmaking, "_WITNESSES", frozenset({witness.to_base58(), other_witness.to_base58()}))
    monkeypatch.setattr(matchmaking, "_GROUP_SIZE", 2)

    class Leader:
        def __init__(self, followers: list[PeerID]):
            self.current_followers = dict.fromkeys(followers)

    def refused(followers: list[PeerID], joining: PeerID, leader_is_witness: bool = False) -> bool:
        monkeypatch.setattr(matchmaking, "_SELF_WITNESS", leader_is_witness)
        found = matchmaking._past_group_rules(Leader(followers), joining)
        return found is not None and found.code == averaging_pb2.GROUP_IS_FULL

    # a volunteer leader: one more volunteer fits (2 with the leader), a third does not; a witness fits once
    assert not refused([], volunteers[1])
    assert refused([volunteers[1]], volunteers[2])
    assert not refused([volunteers[1]], witness)
    assert refused([witness], other_witness)
    assert refused([volunteers[1], witness], volunteers[2])
    # a witness leading takes two volunteers, and no second witness
    assert not refused([volunteers[0]], volunteers[1], leader_is_witness=True)
    assert refused([volunteers[0], volunteers[1]], volunteers[2], leader_is_witness=True)
    assert refused([], other_witness, leader_is_witness=True)
    # hivemind's target: room for the witness beside the group's volunteers; no limit for one group
    assert matchmaking.target_group_size(2) == 3
    assert matchmaking.target_group_size(0) is None
