"""Adaptive collaboration with real peers on 127.0.0.1: mixed precision and an auxiliary peer in one swarm,
delayed averaging, a late joiner that loads the swarm's state, and a peer killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from swarmhub.common.protocol import Overlap

from .swarm_processes import TAG, LineReader, Swarm, kill_all, make_join, tagged_env, wait_gone

pytestmark = pytest.mark.swarm

# train() with the options in argv[1] (JSON); prints progress (with a wall-clock time) and the summary.
WORKER = """
import dataclasses, json, os, signal, sys, threading, time
from pathlib import Path
from swarmhub.common.protocol import JoinResponse
from swarmhub.worker.training.peer import train

opts = json.loads(sys.argv[1])
join = JoinResponse.model_validate_json(opts["join"])
stop, main_pid = threading.Event(), os.getpid()

def on_term(signum, frame):
    if os.getpid() == main_pid:
        stop.set()
    else:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

signal.signal(signal.SIGTERM, on_term)

def progress(p):
    print(json.dumps({"event": "progress", "t": time.time(), **dataclasses.asdict(p)}), flush=True)

def joined(peer_id, maddrs):
    print(json.dumps({"event": "joined", "t": time.time()}), flush=True)
    gate = opts.get("gate")  # peers started together train together: each waits, in the swarm, for the test's go
    while gate and not os.path.exists(gate) and not stop.is_set():
        time.sleep(0.1)

s = train(join, device="cpu", listen_maddrs=["/ip4/127.0.0.1/tcp/0"], identity_path=Path(opts["identity"]),
          max_steps=opts.get("steps"), max_minutes=opts.get("minutes"), auxiliary=opts.get("aux", False),
          precision=opts.get("precision", "auto"), bandwidth=opts.get("bandwidth"), stop_event=stop,
          on_progress=progress, on_joined=joined)
print(json.dumps({"event": "summary", "steps": s.steps, "epoch": s.epoch, "first_loss": s.first_loss,
                  "last_loss": s.last_loss, "stop_reason": s.stop_reason.value, "precision": s.precision,
                  "overlap": s.overlap,
                  "averaging_rounds": {str(k): v for k, v in s.averaging_rounds.items()}}), flush=True)
"""


class Workers:
    """Worker processes of one test, all carrying one tag, so that no hivemind process escapes the check."""

    def __init__(self, swarm: Swarm, tmp: Path, overlap: Overlap = Overlap.none):
        self.swarm, self.tmp, self.overlap = swarm, tmp, overlap
        self.tag = f"adaptive-{uuid.uuid4().hex}"
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.readers: dict[str, LineReader] = {}

    def start(self, name: str, **opts: Any) -> None:
        identity = self.tmp / f"{name}.key"
        join = make_join(self.swarm, worker_id=f"worker-{name}", identity=identity)
        overlap = opts.pop("overlap", self.overlap)
        update = {"overlap": overlap, **opts.pop("experiment", {})}
        join.experiment = join.experiment.model_copy(update=update)
        args = json.dumps({"join": join.model_dump_json(), "identity": str(identity), **opts})
        stderr = open(self.tmp / f"{name}.err", "w")  # noqa: SIM115
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-c", WORKER, args],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=tagged_env(self.tag),
            start_new_session=True,  # its own process group: a SIGKILL test can clean up after the victim
        )
        stderr.close()
        self.readers[name] = LineReader(self.procs[name])

    def events(self, name: str, timeout: float = 180) -> list[dict[str, Any]]:
        return self.readers[name].remaining_events(timeout=timeout)

    def wait_for(self, name: str, condition: Any, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.readers[name].next(timeout=max(deadline - time.monotonic(), 0.01))
            assert line is not None, f"{name} ended early: {self.stderr(name)}"
            if line.startswith("{") and condition(event := json.loads(line)):
                return event
        raise AssertionError(f"{name}: no such event within {timeout} s")

    def stderr(self, name: str) -> str:
        return (self.tmp / f"{name}.err").read_text()[-3000:]

    def close(self) -> list[Any]:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        left = wait_gone(self.tag, timeout=20)
        kill_all(left)
        return left


def summary_of(events: list[dict[str, Any]]) -> dict[str, Any]:
    assert events and events[-1]["event"] == "summary", events[-3:]
    return events[-1]


def until_averaged(group: int, steps: int) -> Any:
    """A condition on a peer's events: it has trained ``steps`` steps and reported a round with ``group`` peers."""
    seen = {"round": False}

    def condition(event: dict[str, Any]) -> bool:
        if event["event"] != "progress":
            return False
        seen["round"] = seen["round"] or event["averaged_peers"] == group
        return seen["round"] and event["step"] >= steps

    return condition


# it runs beside the solo lane (tests/lanes.py): each peer trains until it has done what the test asserts (or its
# minutes are up), not for a fixed number of steps, which a busy machine once ended before the first shared round
def test_mixed_precision_peers_and_an_auxiliary_peer_average_together(swarm_peer: Swarm, tmp_path: Path) -> None:
    """An fp32 peer and a bf16 peer train together (parameters and averaged tensors are fp32 on both), and an
    auxiliary peer (no gradients, measured bandwidth) joins their averaging groups."""
    workers = Workers(swarm_peer, tmp_path)
    trainers = ("fp32", "bf16")
    try:
        workers.start("aux", aux=True, minutes=5, bandwidth=1000.0)
        workers.wait_for("aux", lambda e: e["event"] == "joined", timeout=60)
        gate = tmp_path / "go"  # both in the swarm before either trains
        for name in trainers:
            workers.start(name, minutes=4, precision=name, bandwidth=100.0, gate=str(gate))
        for name in trainers:
            workers.wait_for(name, lambda e: e["event"] == "joined", timeout=120)
        gate.touch()
        for name in trainers:  # both trainers and the auxiliary peer in one group, after 40 steps at least
            workers.wait_for(name, until_averaged(3, steps=40), timeout=150)
        for name in trainers:
            workers.procs[name].send_signal(signal.SIGTERM)
        results = {name: workers.events(name) for name in trainers}
        workers.procs["aux"].send_signal(signal.SIGTERM)
        aux = workers.events("aux", timeout=60)
    finally:
        left = workers.close()
    assert not left, f"processes left behind: {[p.name() for p in left]}"
    for name, events in results.items():
        summary = summary_of(events)
        assert summary["precision"] == name
        assert summary["stop_reason"] == "stop_event", workers.stderr(name)
        assert summary["last_loss"] < summary["first_loss"], (name, summary)
        rounds = {int(size): count for size, count in summary["averaging_rounds"].items()}
        assert rounds.get(3, 0) >= 1, (name, rounds)  # both trainers and the auxiliary peer in one group
    assert summary_of(aux)["steps"] == 0  # it computed nothing
    assert workers.procs["aux"].returncode == 0, workers.stderr("aux")


# a fixed number of steps, not minutes: it runs beside the solo lane (tests/lanes.py)
def test_a_peer_averaging_in_the_background_trains_together_with_one_that_does_not(
    swarm_peer: Swarm, tmp_path: Path
) -> None:
    """overlap "auto" lets each peer choose: a swarm holds peers of both choices, and they average together."""
    workers = Workers(swarm_peer, tmp_path)
    chosen = {"a": Overlap.none, "b": Overlap.delayed_averaging}
    # A target batch that one peer alone takes over a second to fill. At the suite's 128 (4 steps of one peer,
    # milliseconds) the peer that started first, by half a second on a busy machine, ended its first epoch alone,
    # and the two leapfrogged for good: the other found itself out of sync after each of its epoch changes, and
    # hivemind publishes no progress record for an out-of-sync peer, so each believed itself alone at its epoch's
    # end and neither averaged in 10 epochs. Real experiments' epochs are far longer than such a head start.
    experiment = {"target_batch_size": 16384}
    try:
        gate = tmp_path / "go"  # both in the swarm before either trains
        for name, overlap in chosen.items():
            workers.start(name, steps=4000, overlap=overlap, gate=str(gate), experiment=experiment)
        for name in chosen:
            workers.wait_for(name, lambda e: e["event"] == "joined", timeout=120)
        gate.touch()
        results = {name: workers.events(name) for name in chosen}
    finally:
        left = workers.close()
    assert not left
    for name, events in results.items():
        summary = summary_of(events)
        assert summary["overlap"] == chosen[name].value
        assert summary["stop_reason"] == "max_steps", workers.stderr(name)
        assert summary["averaging_rounds"].get("2", 0) >= 2, (name, summary)  # rounds with the other one
        assert summary["last_loss"] < summary["first_loss"], (name, summary)
    # in step while both trained: when the first one stopped, the other's last report was within two epochs of it
    # (one apart in most runs; two once, at epochs of about a second on a slow, busy machine, where a report can lag
    # its epoch change: the delayed-averaging peer also applies each epoch's averaged gradients an epoch late)
    progress = {name: [e for e in events if e["event"] == "progress"] for name, events in results.items()}
    first, other = sorted(progress, key=lambda name: progress[name][-1]["t"])
    stopped = progress[first][-1]
    then = [e["epoch"] for e in progress[other] if e["t"] <= stopped["t"]]
    assert then and abs(then[-1] - stopped["epoch"]) <= 2, (stopped, then[-3:])


@pytest.mark.solo  # how far it trains is asserted: see tests/lanes.py
def test_a_late_joiner_loads_the_state_and_a_killed_peer_stalls_no_one_for_long(
    swarm_peer: Swarm, tmp_path: Path
) -> None:
    averaging_timeout = make_join(swarm_peer, "probe", tmp_path / "probe.key").experiment.averaging_timeout
    workers = Workers(swarm_peer, tmp_path)
    try:
        workers.start("a", minutes=2.5)
        workers.start("b", minutes=2.5)
        reached = workers.wait_for("a", lambda e: e["event"] == "progress" and e["epoch"] >= 4, timeout=120)
        workers.start("late", minutes=2.5)
        first = workers.wait_for("late", lambda e: e["event"] == "progress", timeout=90)
        # It started from the swarm's state, not from epoch 0.
        assert first["epoch"] >= reached["epoch"], (first, reached)
        workers.wait_for("late", lambda e: e["event"] == "progress" and e["averaged_peers"] >= 2, timeout=90)

        victim = workers.procs["b"]
        os.kill(victim.pid, signal.SIGKILL)  # no goodbye: its peers find out when a round needs it
        killed_at = time.time()
        os.killpg(victim.pid, signal.SIGKILL)  # hivemind's children of the victim, so that none outlives the test
        times = []
        while time.time() - killed_at < 30:  # long enough for rounds that need the dead peer to time out
            event = workers.wait_for("a", lambda e: e["event"] == "progress", timeout=60)
            times.append(event["t"])
        after = workers.wait_for("a", lambda e: e["event"] == "progress" and e["averaged_peers"] >= 2, timeout=60)
    finally:
        left = workers.close()
    assert not left, f"processes left behind: {[p.name() for p in left]}"
    gaps = [later - earlier for earlier, later in zip([killed_at, *times], times, strict=False)]
    # The longest pause of the survivor's progress: at most one averaging round that times out waiting for
    # the dead peer, plus matchmaking and the reporting interval.
    assert max(gaps) <= averaging_timeout + 10, gaps
    assert after["averaged_peers"] >= 2  # the survivors still average with each other


def test_the_server_runs_an_auxiliary_peer_when_the_organizer_asks(tmp_path: Path, monkeypatch) -> None:
    from swarmhub.common.protocol import ExperimentConfig
    from swarmhub.server.swarm import SwarmHost
    from swarmhub.worker.swarm import access as swarm_access

    tag = f"host-{uuid.uuid4().hex}"
    monkeypatch.setenv(TAG, tag)  # inherited by every process the host starts
    host = SwarmHost(tmp_path, "127.0.0.1")
    run_id = f"t-{uuid.uuid4().hex[:8]}"
    key = swarm_access.new_signing_key_der()
    experiment = ExperimentConfig(slug="aux-run", title="Aux run", task="digits", target_batch_size=128)
    config = {"experiment": experiment.model_dump(mode="json"), "corpus": None}
    log = tmp_path / "peers" / f"{run_id}.aux.log"

    def witness_in_swarm() -> bool:
        return any(s.kind == "witness" and s.in_swarm for s in host.supervisor.states(run_id))

    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not witness_in_swarm():
            host.reconcile({run_id: (key, [], config, None)})  # as the server's reconcile loop does, every few seconds
            time.sleep(1)
        assert witness_in_swarm(), log.read_text()[-3000:] if log.exists() else "no log"
        assert host.aux_running(run_id)
        host.reconcile({run_id: (key, [], None, None)})  # the organizer turned it off
        assert not host.aux_running(run_id)
        assert [s.kind for s in host.supervisor.states(run_id)] == ["monitor"]
        host.reconcile({run_id: (key, [], config, None)})
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not witness_in_swarm():
            time.sleep(0.5)
        assert host.stop_aux(run_id) == 0, log.read_text()[-3000:]  # it leaves the swarm cleanly
    finally:
        host.close()
    left = wait_gone(tag, timeout=20)
    kill_all(left)
    assert not left, f"processes left behind: {[p.name() for p in left]}"
