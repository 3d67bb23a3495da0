"""Every honest volunteer is credited, on every registered task: a real server, an organizer's experiment of the
task (with its text or images, for a task that trains on a corpus), two real `swarmhub join` processes; each
volunteer has verified samples on the leaderboard within a bounded time, which only the server's witness (its
auxiliary peer) can give. Then each of the server's peer processes is killed as a crash would: the organizer's swarm
view says so within 10 s, with how it exited, and the peer is running again after its backoff.

A task registered without settings here fails its case: a promise is kept on every task, not on the one tested."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from swarmhub.server.corpus import text as corpus
from swarmhub.worker.tasks import available_tasks

from ..processes import SWARMHUB, http, outlived, running_server, signup, wait_volunteers

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

SLUG = "credited"
CREDIT_SECONDS = 240  # from the volunteers' start: on a busy 2-core machine most of it is start-up and joining
# Per task: the experiment (small enough for 2 cores) and, for a task that trains on a corpus, the text it is given.
EXPERIMENTS: dict[str, dict[str, Any]] = {
    "digits": {
        "task_params": {"hidden_size": 64, "batch_size": 32},
        "learning_rate": 0.003,
        "target_batch_size": 256,
    },
    "albert-mlm": {
        "task_params": {"size": "tiny", "batch_size": 16, "warmup_steps": 5, "total_steps": 2000},
        "optimizer": "lamb",
        "learning_rate": 0.01,
        "target_batch_size": 256,
        "checkpoint_minutes": 0.5,
        "corpus": {"bytes": 200_000, "vocab_size": "1000", "seq_length": "64"},
    },
    "swav": {
        "task_params": {"colour": "grey", "batch_size": 32, "prototypes": 16, "queue_length": 0},
        "optimizer": "adam",
        "learning_rate": 0.002,
        "target_batch_size": 256,
        "checkpoint_minutes": 0.5,
        "images": "builtin:shapes",  # the built-in image set, prepared by the server as an upload is
    },
}
PEER_MODULES = {
    "monitor": "swarmhub.server.swarm.bootstrap_peer",
    "witness": "swarmhub.server.swarm.aux_peer",
    "checkpoints": "swarmhub.server.swarm.checkpoint_peer",
}


def create(url: str, organizer: dict[str, str], task: str) -> None:
    settings = dict(EXPERIMENTS[task])
    text = settings.pop("corpus", None)
    images = settings.pop("images", None)
    body = {
        "slug": SLUG,
        "title": f"Credit on {task}",
        "task": task,
        "matchmaking_time": 2.0,
        "averaging_timeout": 20.0,
    }
    created = http.post(f"{url}/api/experiments", headers=organizer, json={**body, **settings})
    assert created.status_code == 201, created.text
    assert created.json()["aux_peer"] is True  # the witness runs by default
    if text is not None:
        uploaded = http.put(
            f"{url}/api/experiments/{SLUG}/corpus",
            headers=organizer,
            files={"file": ("text.txt", corpus.builtin_text("python-docstrings", max_bytes=text["bytes"]).encode())},
            data={"vocab_size": text["vocab_size"], "seq_length": text["seq_length"]},
            timeout=120,
        )
        assert uploaded.status_code == 200, uploaded.text
    if images is not None:
        given = http.put(
            f"{url}/api/experiments/{SLUG}/corpus", headers=organizer, data={"source": images}, timeout=120
        )
        assert given.status_code == 200, given.text
        assert given.json()["kind"] == "images", given.text
    started = http.post(f"{url}/api/experiments/{SLUG}/status", headers=organizer, json={"action": "start"})
    assert started.json()["status"] == "running", started.text


def join(url: str, tmp: Path, name: str) -> tuple[str, Any, subprocess.Popen]:
    env = {**os.environ, "SWARMHUB_SERVER": url, "SWARMHUB_TOKEN": signup(url, name)}
    for key in ("CONFIG", "STATE", "CACHE"):
        env[f"SWARMHUB_{key}_DIR"] = str(tmp / name)
    out = open(tmp / f"{name}.out", "wb")  # noqa: SIM115 - closed by wait_volunteers
    command = [*SWARMHUB, "join", SLUG, "--max-minutes", "6", "--listen", "/ip4/127.0.0.1/tcp/0"]
    return name, out, subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)


def verified(url: str, organizer: dict[str, str]) -> dict[str, dict[str, Any]]:
    board = http.get(f"{url}/api/experiments/{SLUG}/leaderboard", headers=organizer).json()
    return {row["username"]: row for row in board}


def server_peers(url: str, organizer: dict[str, str]) -> dict[str, dict[str, Any]]:
    view = http.get(f"{url}/api/experiments/{SLUG}/swarm", headers=organizer).json()
    return {state["kind"]: state for state in view["server_peers"]}


def peer_process(server: subprocess.Popen, kind: str) -> psutil.Process:
    (found,) = [
        child
        for child in psutil.Process(server.pid).children()
        if PEER_MODULES[kind] in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE
    ]
    return found


def wait_for(check: Any, timeout: float, what: str) -> float:
    """Seconds until ``check()`` holds; fails after ``timeout``."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.5)
    return time.monotonic() - started


@pytest.mark.parametrize("task", sorted(available_tasks()))
def test_each_volunteer_is_credited_and_each_server_peer_is_supervised(tmp_path: Path, task: str) -> None:
    assert task in EXPERIMENTS, f"the task {task!r} is registered: give it an experiment here"
    with running_server(tmp_path) as (url, server):
        organizer = {"Authorization": f"Bearer {signup(url, 'organizer')}"}
        create(url, organizer, task)
        workers = [join(url, tmp_path, name) for name in ("ada", "grace")]
        try:
            wait_for(
                lambda: all(verified(url, organizer).get(name, {}).get("samples", 0) > 0 for name in ("ada", "grace")),
                CREDIT_SECONDS,
                f"both volunteers credited verified samples on {task}: {verified(url, organizer)}",
            )
            credited = verified(url, organizer)
            states = server_peers(url, organizer)
            expected = {"monitor", "witness"} | (
                {"checkpoints"} if "checkpoint_minutes" in EXPERIMENTS[task] else set()
            )
            assert set(states) == expected, states
            assert all(s["state"] == "running" and s["restarts"] == 0 for s in states.values()), states

            for kind in sorted(expected):
                peer_process(server, kind).send_signal(signal.SIGKILL)  # as a crash would: no last words
                seen = wait_for(
                    lambda kind=kind: server_peers(url, organizer)[kind]["state"] == "restarting",
                    10,
                    f"the killed {kind} peer shown as restarting",
                )
                state = server_peers(url, organizer)[kind]
                assert state["last_error"] == "killed by signal 9", state
                assert state["next_attempt_at"] is not None, state
                wait_for(
                    lambda kind=kind: server_peers(url, organizer)[kind]["state"] == "running",
                    60,
                    f"the {kind} peer started again after its backoff",
                )
                assert server_peers(url, organizer)[kind]["restarts"] == 1
                assert seen <= 10
        finally:
            seen_children, outputs = wait_volunteers(workers, tmp_path, until=lambda: True)
    for name in ("ada", "grace"):
        assert credited[name]["samples"] > 0, credited
    assert outlived(seen_children) == set()
