"""Real hivemind peers on 127.0.0.1: the server's swarm peer and worker processes that train digits together
(the peers and their tools: tests/swarm_processes.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from swarmhub.worker.client import ExitCode

from .swarm_processes import LineReader, Swarm, kill_all, make_join, tagged_env, tagged_processes, wait_gone

pytestmark = pytest.mark.swarm

STEPS = 30  # per worker: about 10 swarm epochs

# Trains with train() and prints each progress snapshot and the summary as JSON lines.
TRAIN_SCRIPT = """
import dataclasses, json, sys
from pathlib import Path
from swarmhub.common.protocol import JoinResponse
from swarmhub.worker.training.peer import train

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
from swarmhub.worker.join.session import run_session
from swarmhub.common.protocol import JoinResponse

join = JoinResponse.model_validate_json(sys.argv[1])
code = run_session(join, device="cpu", listen_maddrs=["/ip4/127.0.0.1/tcp/0"], log_path=Path(sys.argv[2]),
                   restore_stderr=False, identity_path=Path(sys.argv[3]))
sys.exit(code)
"""


# a fixed number of steps, not minutes: it runs beside the solo lane (tests/lanes.py)
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
        results = [reader.remaining_events(timeout=120) for reader in readers]
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
