"""A groupmate that sends its parts in a gradient round but never reads the averaged parts back, keeping its
streams open (a hostile volunteer's patched hivemind, or one too busy to read), against a real averager on
loopback with swarmhub's guarded all-reduce (``robust.GuardedAllReduceRunner``)."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from swarmhub.worker import robust

from .swarm_processes import loopback_dhts

pytestmark = pytest.mark.swarm

# Large enough that the averaged parts sent back do not fit the buffers between the two peers (sockets and the
# p2p stream window): with a vector of 1.2 million values the honest round was not held, with 4 million it was
SIZE = 4_000_000
CHUNK_TIMEOUT = 2.0  # hivemind's next_chunk_timeout: a sender's parts 2 s apart at most, an answer 4 s
ALLREDUCE_TIMEOUT = 60.0  # what holds a round when nothing else ends it (the worker's averaging_timeout)


def never_reads_answers(runner_class: type) -> object:
    """The attacker's ``_communicate_with_peer``: her own slice as hivemind does it; to each other peer she sends
    her parts, then sleeps with the stream open and its answers unread."""
    communicate = runner_class._communicate_with_peer

    async def deaf(self, peer_id):  # noqa: ANN001, ANN202
        if peer_id == self.peer_id:
            return await communicate(self, peer_id)
        parts = self._generate_input_for_peer(self.ordered_peer_ids.index(peer_id))
        answers = await self._get_peer_stub(peer_id).rpc_aggregate_part(parts)
        await asyncio.sleep(3600)
        return answers

    return deaf


def test_a_groupmate_that_never_reads_its_averaged_parts_does_not_hold_the_round() -> None:
    """Without the guard the honest peer's round was held until its all-reduce timeout every time, with nothing
    averaged (its handler stuck sending the deaf peer an answer, its reducer waiting for that peer's next part).
    With it the deaf peer is left out of the rest of the honest peer's slice after the reducer timeout: the round
    ends in seconds, and the deaf peer's own slice, which she reduces and answers honestly, is averaged."""
    import hivemind
    from hivemind.averaging.allreduce import AllReduceRunner

    robust.install("mean", target_batch_size=1_000_000, run_id="deaf-test", experiment_key=None, username="ada")
    options = dict(
        prefix="deaf-test",
        target_group_size=2,
        min_group_size=2,
        min_matchmaking_time=2.0,
        request_timeout=1.0,
        next_chunk_timeout=CHUNK_TIMEOUT,
        allreduce_timeout=ALLREDUCE_TIMEOUT,
        start=True,
    )
    with loopback_dhts(2) as (honest_dht, deaf_dht):
        honest = hivemind.averaging.DecentralizedAverager([torch.full((SIZE,), 1.0)], honest_dht, **options)
        original = AllReduceRunner._communicate_with_peer
        AllReduceRunner._communicate_with_peer = never_reads_answers(AllReduceRunner)  # her forked process keeps it
        try:
            deaf = hivemind.averaging.DecentralizedAverager([torch.full((SIZE,), 3.0)], deaf_dht, **options)
        finally:
            AllReduceRunner._communicate_with_peer = original
        try:
            started = time.monotonic()
            control = honest.step(wait=False, timeout=90)
            deaf.step(wait=False, timeout=90)
            group = control.result(timeout=120)
            took = time.monotonic() - started
            assert group is not None and len(group) == 2
            assert took < ALLREDUCE_TIMEOUT / 2, took
            with honest.get_tensors() as tensors:
                values = tensors[0]
                averaged = int((values == 2.0).sum())
                kept = int((values == 1.0).sum())
            # her slice, reduced by her, came back averaged; the rest of the honest slice is the honest values or
            # their average with what she sent before she was left out
            assert averaged + kept == SIZE, (averaged, kept)
            assert averaged >= SIZE // 3, (averaged, kept)
        finally:
            honest.shutdown()
            deaf.shutdown()
