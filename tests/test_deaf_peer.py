"""A groupmate that sends its parts in a gradient round but never reads the averaged parts back, keeping its
streams open (a hostile volunteer's patched hivemind, or one too busy to read), against a real averager on
loopback with swarmhub's guarded all-reduce (``robust.GuardedAllReduceRunner``). Both run in a process of their
own: ``robust.install`` changes hivemind's module globals for the process that calls it."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

from .swarm_processes import kill_all, tagged_env, wait_gone

pytestmark = pytest.mark.swarm

# Large enough that the averaged parts sent back do not fit the buffers between the two peers (sockets and the
# p2p stream window): with 307,200 values (1.2 MB) the honest round was not held, with 4 million (16 MB) it was
SIZE = 4_000_000
CHUNK_TIMEOUT = 2.0  # hivemind's next_chunk_timeout: a sender's parts 2 s apart at most, an answer 4 s
ALLREDUCE_TIMEOUT = 60.0  # what holds a round when nothing else ends it (the worker's averaging_timeout)

SCRIPT = """
import asyncio, json, sys, time
import hivemind, torch
from hivemind.averaging.allreduce import AllReduceRunner
from swarmhub.worker.swarm import robust

size, chunk_timeout, allreduce_timeout = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
robust.install("mean", target_batch_size=1_000_000, run_id="deaf-test", experiment_key=None, username="ada")
first = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
second = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=first.get_visible_maddrs(), start=True)
options = dict(prefix="deaf-test", target_group_size=2, min_group_size=2, min_matchmaking_time=2.0,
               request_timeout=1.0, next_chunk_timeout=chunk_timeout, allreduce_timeout=allreduce_timeout, start=True)
honest = hivemind.averaging.DecentralizedAverager([torch.full((size,), 1.0)], first, **options)

# the attacker's copy of hivemind: her own slice as usual; to the other peer she sends her parts, then sleeps with
# the stream open and its answers unread. Her averager's process is forked now and keeps the patch.
communicate = AllReduceRunner._communicate_with_peer
async def deaf(self, peer_id):
    if peer_id == self.peer_id:
        return await communicate(self, peer_id)
    parts = self._generate_input_for_peer(self.ordered_peer_ids.index(peer_id))
    answers = await self._get_peer_stub(peer_id).rpc_aggregate_part(parts)
    await asyncio.sleep(3600)
AllReduceRunner._communicate_with_peer = deaf
mallory = hivemind.averaging.DecentralizedAverager([torch.full((size,), 3.0)], second, **options)
AllReduceRunner._communicate_with_peer = communicate

started = time.monotonic()
control = honest.step(wait=False, timeout=allreduce_timeout + 30)
mallory.step(wait=False, timeout=allreduce_timeout + 30)
try:
    group, error = control.result(timeout=allreduce_timeout + 60), None
except Exception as e:
    group, error = None, repr(e)[:200]
took = time.monotonic() - started
with honest.get_tensors() as tensors:
    averaged, kept = int((tensors[0] == 2.0).sum()), int((tensors[0] == 1.0).sum())
print(json.dumps({"took": took, "group": len(group) if group else 0, "error": error, "averaged": averaged,
                  "kept": kept}), flush=True)
honest.shutdown(); mallory.shutdown(); first.shutdown(); second.shutdown()
"""


def test_a_groupmate_that_never_reads_its_averaged_parts_does_not_hold_the_round() -> None:
    """Without the guard the honest peer's round was held until its all-reduce timeout every time, with nothing
    averaged (its handler stuck sending the deaf peer an answer, its reducer waiting for that peer's next part).
    With it the deaf peer is left out of the rest of the honest peer's slice after the reducer timeout: the round
    ends in seconds, and the deaf peer's own slice, which she reduces and answers honestly, is averaged."""
    tag = f"deaf-{uuid.uuid4().hex}"
    try:
        run = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(SIZE), str(CHUNK_TIMEOUT), str(ALLREDUCE_TIMEOUT)],
            capture_output=True,
            text=True,
            timeout=ALLREDUCE_TIMEOUT + 120,
            env=tagged_env(tag),
        )
    finally:
        kill_all(wait_gone(tag, 30))
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    assert lines, run.stderr[-3000:]
    result = json.loads(lines[-1])
    assert result["error"] is None and result["group"] == 2, (result, run.stderr[-3000:])
    assert result["took"] < ALLREDUCE_TIMEOUT / 2, result
    # her slice, reduced by her, came back averaged; the rest of the honest slice is the honest values or their
    # average with what she sent before she was left out
    assert result["averaged"] + result["kept"] == SIZE, result
    assert result["averaged"] >= SIZE // 3, result
