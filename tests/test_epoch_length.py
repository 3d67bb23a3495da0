"""A trainer's epochs last at least ``matchmaking_time``, and each holds a whole target batch.

The shortest epoch keeps the peers of a swarm with a small target in step (``SwarmOptimizer``). A peer used to wait
after its epoch change; hivemind's estimate of the next epoch's end (its own record, extrapolated at its training
rate) then ran out during the wait, and the peer changed epoch again within a step or two of training and waited
again: alone it trained a few percent of the cap (``bench/epoch_guard.py`` at d0c6141: 3,500 samples/s against a
cap of 33,000). It now waits before the epoch's end, with its count complete. A real worker process (``train()``)
alone in a swarm with the server's peer.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from .swarm_processes import TEST_EXPERIMENT, LineReader, Swarm, kill_all, make_join, tagged_env, wait_gone
from .test_training_swarm import TRAIN_SCRIPT

pytestmark = pytest.mark.swarm

EPOCHS = 10
STEPS = EPOCHS * TEST_EXPERIMENT.target_batch_size // TEST_EXPERIMENT.task_params["batch_size"]


def test_a_worker_alone_trains_a_whole_target_batch_per_epoch_of_at_least_matchmaking_time(
    swarm_peer: Swarm, tmp_path: Path
) -> None:
    tag = f"alone-{uuid.uuid4().hex}"
    identity = tmp_path / "worker.key"
    join = make_join(swarm_peer, worker_id="worker-alone", identity=identity)
    with open(tmp_path / "worker.err", "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", TRAIN_SCRIPT, join.model_dump_json(), str(STEPS), str(identity)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=tagged_env(tag),
        )
    try:
        events = LineReader(proc).remaining_events(timeout=180)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        kill_all(wait_gone(tag, timeout=15))
    errors = (tmp_path / "worker.err").read_text()[-2000:]
    assert code == 0, errors
    summary = events[-1]
    assert summary["event"] == "summary" and summary["steps"] == STEPS, errors
    progress = [e for e in events if e["event"] == "progress"]
    # Each epoch held a whole target batch: a peer alone ends an epoch when its own count reaches the target (it
    # used to end most epochs a step or two after waiting, on an estimate that had run out during the wait)...
    assert EPOCHS - 2 <= summary["epoch"] <= EPOCHS, json.dumps(progress[-3:])
    # ...and none was shorter than matchmaking_time.
    shortest = (summary["epoch"] - 1) * TEST_EXPERIMENT.matchmaking_time
    assert progress[-1]["elapsed"] >= 0.95 * shortest, json.dumps(progress[-3:])
