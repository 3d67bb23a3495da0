"""Real hivemind peers on 127.0.0.1 for the swarm tests: the server's swarm peer, the join answer a worker gets,
and the tools that find every process a test started.

Each peer is its own OS process (hivemind objects must not cross a ``spawn``). Every process a test starts
carries a unique environment tag, inherited by hivemind's children (DHT, averagers, ``p2pd``), so the
tests can find orphans even after they were re-parented to init.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
from hivemind.utils.crypto import RSAPrivateKey

from swarmhub.worker import swarm_access
from swarmhub.worker.protocol import ExperimentConfig, JoinResponse, SwarmToken

TAG = "SWARMHUB_TEST_TAG"


def tagged_env(tag: str) -> dict[str, str]:
    return {**os.environ, TAG: tag, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def tagged_processes(tag: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(TAG) == tag and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def wait_gone(tag: str, timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while (left := tagged_processes(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def kill_all(procs: list[psutil.Process]) -> None:
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


class LineReader:
    """Reads a process's stdout lines in a thread, so a test can wait for one with a timeout."""

    def __init__(self, proc: subprocess.Popen[str]):
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, args=(proc,), daemon=True).start()

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next(self, timeout: float) -> str | None:
        line = self.lines.get(timeout=timeout)
        if line is not None:
            self.seen.append(line)
        return line

    def events(self, timeout: float) -> list[dict[str, Any]]:
        """All JSON lines until the stream closes."""
        deadline = time.monotonic() + timeout
        events = []
        while (line := self.next(max(deadline - time.monotonic(), 0.01))) is not None:
            if line.startswith("{"):
                events.append(json.loads(line))
        return events


@dataclass
class Swarm:
    maddrs: list[str]
    run_id: str
    signing_key: RSAPrivateKey
    key_text: str  # the signing key as the server stores it
    deny_file: Path  # the deny-list the server keeps beside the key (SwarmHost.write_denied)
    output: LineReader | None = None  # the peer's JSON lines after "ready": its progress reads


@contextlib.contextmanager
def loopback_dhts(count: int) -> Iterator[list[Any]]:
    """``count`` plain hivemind DHT peers on 127.0.0.1, the others bootstrapped from the first; shut down after."""
    import hivemind

    first = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    dhts = [first]
    try:
        initial = [str(m) for m in first.get_visible_maddrs()]
        dhts += [
            hivemind.DHT(initial_peers=initial, host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
            for _ in range(count - 1)
        ]
        yield dhts
    finally:
        for dht in dhts:
            dht.shutdown()


@contextlib.contextmanager
def running_swarm_peer(folder: Path) -> Iterator[Swarm]:
    """The server's bootstrap/monitor peer for a new run (files in ``folder``); stopped with SIGTERM and checked
    for orphans. The ``swarm_peer`` fixture (tests/conftest.py)."""
    tag = f"peer-{uuid.uuid4().hex}"
    run_id = f"t-{uuid.uuid4().hex[:8]}"
    key_text = swarm_access.new_signing_key_der()
    (folder / "signing").write_text(key_text)
    log = open(folder / "stderr.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "swarmhub.server.swarm.bootstrap_peer",
            "--run-id",
            run_id,
            "--host",
            "127.0.0.1",
            "--signing-key-file",
            str(folder / "signing"),
            "--identity",
            str(folder / "peer.key"),
        ],
        stdin=subprocess.PIPE,  # the peer stops when its stdin closes: keep it open
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=tagged_env(tag),
    )
    try:
        reader = LineReader(proc)
        deadline = time.monotonic() + 60
        maddrs = None
        while maddrs is None and time.monotonic() < deadline:
            line = reader.next(timeout=max(deadline - time.monotonic(), 0.01))
            assert line is not None, "the swarm peer exited before it was ready"
            event = json.loads(line)
            if event.get("event") == "ready":
                maddrs = event["maddrs"]
        assert maddrs, "the swarm peer never printed its ready line"
        signing_key = swarm_access.signing_key_from_text(key_text)
        yield Swarm(maddrs, run_id, signing_key, key_text, folder / "signing.deny", reader)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        left = wait_gone(tag, timeout=10)
        assert not left, f"the swarm peer left processes behind: {[p.name() for p in left]}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_all(tagged_processes(tag))
        log.close()


def make_join(swarm: Swarm, worker_id: str, identity: Path) -> JoinResponse:
    """What the server's join answers, for the key at ``identity``: a token signed by the run's key."""
    experiment = ExperimentConfig(
        slug="digits-test",
        title="Digits test",
        task="digits",
        task_params={"batch_size": 32, "hidden_size": 32},
        optimizer="adam",
        learning_rate=3e-3,
        target_batch_size=128,
        matchmaking_time=2.0,
        averaging_timeout=5.0,  # the last round after a peer left fails fast
    )
    public_key = swarm_access.load_or_create_identity(identity).get_public_key().to_bytes()
    token = swarm_access.sign_token(swarm.signing_key, swarm.run_id, "tester", public_key, timedelta(hours=1))
    return JoinResponse(
        experiment=experiment,
        run_id=swarm.run_id,
        initial_peers=swarm.maddrs,
        worker_id=worker_id,
        username="tester",
        report_path="/ws/experiments/digits-test/report",
        swarm_token=SwarmToken(**swarm_access.token_to_wire(token)),
        token_path="/api/experiments/digits-test/swarm-token",
        experiment_public_key=swarm.signing_key.get_public_key().to_bytes().decode(),
        server_time=time.time(),
    )
