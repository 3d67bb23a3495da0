"""Real hivemind peers on 127.0.0.1: the server's swarm peer and worker processes that train digits together.

Each peer is its own OS process (hivemind objects must not cross a ``spawn``). Every process a test starts
carries a unique environment tag, inherited by hivemind's children (DHT, averagers, ``p2pd``), so the
tests can find orphans even after they were re-parented to init.
"""

from __future__ import annotations

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
import pytest
from hivemind.utils.crypto import RSAPrivateKey

from swarmhub.worker import swarm_access
from swarmhub.worker.client import ExitCode
from swarmhub.worker.protocol import ExperimentConfig, JoinResponse, SwarmToken

pytestmark = pytest.mark.swarm

TAG = "SWARMHUB_TEST_TAG"
STEPS = 30  # per worker: about 10 swarm epochs

# Trains with train() and prints each progress snapshot and the summary as JSON lines.
TRAIN_SCRIPT = """
import dataclasses, json, sys
from pathlib import Path
from swarmhub.worker.protocol import JoinResponse
from swarmhub.worker.training import train

join = JoinResponse.model_validate_json(sys.argv[1])

def progress(p):
    print(json.dumps({"event": "progress", **dataclasses.asdict(p)}), flush=True)

s = train(join, device="cpu", listen_maddrs=["/ip4/127.0.0.1/tcp/0"], max_steps=int(sys.argv[2]),
          on_progress=progress, identity_path=Path(sys.argv[3]), client_mode=sys.argv[4:] == ["client"])
print(json.dumps({"event": "summary", "steps": s.steps, "epoch": s.epoch, "first_loss": s.first_loss,
                  "last_loss": s.last_loss, "stop_reason": s.stop_reason.value,
                  "averaging_rounds": {str(k): v for k, v in s.averaging_rounds.items()}}), flush=True)
"""

# Runs what `swarmhub join` runs after the HTTP join (signals, log routing, exit codes), without a reporter.
SESSION_SCRIPT = """
import sys
from pathlib import Path
from swarmhub.worker.cli import run_session
from swarmhub.worker.protocol import JoinResponse

join = JoinResponse.model_validate_json(sys.argv[1])
code = run_session(join, device="cpu", listen_maddrs=["/ip4/127.0.0.1/tcp/0"], log_path=Path(sys.argv[2]),
                   restore_stderr=False, identity_path=Path(sys.argv[3]))
sys.exit(code)
"""


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


@pytest.fixture
def swarm_peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    """The server's bootstrap/monitor peer for a new run; stopped with SIGTERM and checked for orphans."""
    tag = f"peer-{uuid.uuid4().hex}"
    folder = tmp_path_factory.mktemp("peer")
    run_id = f"t-{uuid.uuid4().hex[:8]}"
    key_text = swarm_access.new_signing_key_der()
    (folder / "signing").write_text(key_text)
    log = open(folder / "stderr.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "swarmhub.server.swarm_peer",
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


@pytest.mark.parametrize("modes", [("public", "public"), ("public", "client")], ids=["public", "one-client"])
def test_two_workers_average_gradients_and_leave_no_processes(
    swarm_peer: Swarm, tmp_path: Path, modes: tuple[str, str]
) -> None:
    """Two workers average together; a worker in client mode (which no one can dial, as behind a NAT)
    still averages through the reachable one."""
    tag = f"workers-{uuid.uuid4().hex}"
    procs = []
    try:
        for name, mode in zip(("a", "b"), modes, strict=True):
            identity = tmp_path / f"{name}.key"
            join = make_join(swarm_peer, worker_id=f"worker-{name}", identity=identity)
            stderr = open(tmp_path / f"{name}.err", "w")  # noqa: SIM115
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", TRAIN_SCRIPT, join.model_dump_json(), str(STEPS), str(identity), mode],
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    text=True,
                    env=tagged_env(tag),
                )
            )
            stderr.close()
        readers = [LineReader(proc) for proc in procs]
        results = [reader.events(timeout=120) for reader in readers]
        codes = [proc.wait(timeout=30) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        left = wait_gone(tag, timeout=15)
        kill_all(left)
    errors = {name: (tmp_path / f"{name}.err").read_text()[-2000:] for name in ("a", "b")}
    assert codes == [0, 0], errors
    assert not left, f"workers left processes behind: {[p.name() for p in left]}"

    for events, name in zip(results, ("a", "b"), strict=True):
        summary = events[-1]
        assert summary["event"] == "summary", errors[name]
        assert summary["stop_reason"] == "max_steps"
        assert summary["steps"] == STEPS
        assert summary["averaging_rounds"].get("2", 0) >= 3, (name, summary)
        assert summary["last_loss"] < summary["first_loss"], (name, summary)
        progress = [e for e in events if e["event"] == "progress"]
        assert sum(1 for e in progress if e["averaged_peers"] == 2) >= 1
        assert progress[-1]["epoch"] >= 3


@pytest.mark.parametrize(
    ("signum", "code", "said"),
    [(signal.SIGTERM, ExitCode.TERMINATED, "SIGTERM"), (signal.SIGINT, ExitCode.INTERRUPTED, "Ctrl-C")],
    ids=["SIGTERM", "SIGINT"],
)
def test_a_signal_leaves_the_swarm_cleanly(
    swarm_peer: Swarm, tmp_path: Path, signum: int, code: int, said: str
) -> None:
    """What `swarmhub join` does on SIGTERM / Ctrl-C: stop, leave the swarm, exit 143 / 130, no orphans.

    SIGINT matters on its own: hivemind's averagers set it to SIG_IGN in the parent process.
    """
    tag = f"signal-{uuid.uuid4().hex}"
    identity = tmp_path / "worker.key"
    join = make_join(swarm_peer, worker_id=f"worker-{said.lower()}", identity=identity)
    log_path = tmp_path / "logs" / "digits-test.log"
    proc = subprocess.Popen(
        [sys.executable, "-c", SESSION_SCRIPT, join.model_dump_json(), str(log_path), str(identity)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=tagged_env(tag),
    )
    try:
        reader = LineReader(proc)
        first = reader.next(timeout=60)  # the first progress line: training is under way
        assert first is not None and "samples" in first, proc.stderr.read() if proc.stderr else ""
        assert len(tagged_processes(tag)) >= 4  # python, DHT, averagers, p2pd: what must not be orphaned
        proc.send_signal(signum)
        exit_code = proc.wait(timeout=60)
        left = wait_gone(tag, timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
        kill_all(tagged_processes(tag))
    stderr = proc.stderr.read() if proc.stderr else ""
    assert exit_code == code, stderr
    assert not left, f"{said} left processes behind: {[p.name() for p in left]}"
    assert f"Left the swarm ({said})" in stderr
    # hivemind's forked children inherit the handler; only the worker itself may react to the signal
    assert stderr.count("Stopping: leaving the swarm") == 1 and "Forcing" not in stderr, stderr
    # hivemind's shutdown noise went to the log file, not to the volunteer's console
    assert "Traceback" not in stderr and "Task was destroyed" not in stderr, stderr
    assert log_path.exists()
