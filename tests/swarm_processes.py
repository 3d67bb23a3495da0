"""Real processes for the tests and the benchmarks (``bench/_common.py`` imports this module): the server's
bootstrap/monitor peer, the join answer a worker gets, a reader of a process's stdout, and the tools that find
every process a test or benchmark started.

Each peer is its own OS process (hivemind objects must not cross a ``spawn``). Every process carries a unique
environment tag, inherited by hivemind's children (DHT, averagers, ``p2pd``), so orphans can be found even after
they were re-parented to init.
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
from typing import Any, Protocol

import psutil
from hivemind.utils.crypto import RSAPrivateKey

from swarmhub.common.protocol import ExperimentConfig, JoinResponse, OptimizerName, SwarmToken
from swarmhub.worker.swarm import access as swarm_access

TAG = "SWARMHUB_PROCESS_TAG"


class OutputError(RuntimeError):
    """A process did not print what was waited for: it exited first, or the wait timed out."""


def tagged_env(tag: str, **extra: str) -> dict[str, str]:
    """The environment of a tagged process: one compute thread (these machines have 2 cores), unbuffered output."""
    return {
        **os.environ,
        TAG: tag,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


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
    """Reads a process's stdout in a thread, so a caller can wait for a line or an event with a timeout.

    Every JSON line is also kept in ``events`` (and every other line in ``text``) as it arrives; ``next``,
    ``wait_for`` and ``remaining_events`` consume the lines in order, each line once."""

    def __init__(self, proc: subprocess.Popen[str], name: str = "the process", copy_to: Path | None = None):
        self.name = name
        self._copy = open(copy_to, "w") if copy_to is not None else None  # noqa: SIM115 - closed by the pump
        self.events: list[dict[str, Any]] = []
        self.text: list[str] = []
        self.seen: list[str] = []  # the lines consumed so far
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._pump, args=(proc,), daemon=True)
        self._thread.start()

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if self._copy is not None:
                self._copy.write(line)
                self._copy.flush()
            event = _event(line)
            if event is None:
                self.text.append(line)
            else:
                self.events.append(event)
            self._lines.put(line)
        if self._copy is not None:
            self._copy.close()
        self._lines.put(None)

    def next(self, timeout: float) -> str | None:
        """The next line (None: the stream closed); ``queue.Empty`` after ``timeout`` seconds."""
        line = self._lines.get(timeout=timeout)
        if line is not None:
            self.seen.append(line)
        return line

    def wait_for(self, kind: str, timeout: float) -> dict[str, Any]:
        """The next event whose ``event`` is ``kind`` (the lines before it are consumed)."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.next(left)
            except queue.Empty:
                break
            if line is None:
                raise OutputError(f"{self.name}: exited before its {kind!r} event")
            event = _event(line)
            if event is not None and event.get("event") == kind:
                return event
        raise OutputError(f"{self.name}: no {kind!r} event within {timeout:.0f} s")

    def remaining_events(self, timeout: float) -> list[dict[str, Any]]:
        """The JSON lines not consumed yet, until the stream closes."""
        deadline = time.monotonic() + timeout
        events = []
        while (line := self.next(max(deadline - time.monotonic(), 0.01))) is not None:
            if (event := _event(line)) is not None:
                events.append(event)
        return events

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def _event(line: str) -> dict[str, Any] | None:
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def wait_healthy(url: str, process: subprocess.Popen[Any], timeout: float = 60, log: Path | None = None) -> None:
    """Until a swarmhub server at ``url`` answers its health check; ``OutputError`` (with the tail of ``log``) when it
    exits first or does not answer within ``timeout`` seconds."""
    import httpx

    def fail(why: str) -> OutputError:
        tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
        return OutputError(f"the server {why}" + (f":\n{tail}" if tail else ""))

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise fail("exited during start-up")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise fail(f"did not become healthy within {timeout:.0f} s")


def bootstrap_peer_command(folder: Path, run_id: str) -> tuple[list[str], str]:
    """The server's bootstrap/monitor peer for a new run, as the server starts it: the command line, and the
    run's new signing key (written to ``folder/signing``, as the server keeps it)."""
    key_text = swarm_access.new_signing_key_der()
    (folder / "signing").write_text(key_text)
    argv = [
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
    ]
    return argv, key_text


class RunPeer(Protocol):
    """What a join answer needs of the server's peer: the run, where to find it, the key that signs its tokens."""

    @property
    def run_id(self) -> str: ...
    @property
    def maddrs(self) -> list[str]: ...
    @property
    def signing_key(self) -> RSAPrivateKey: ...


TEST_EXPERIMENT = ExperimentConfig(
    slug="digits-test",
    title="Digits test",
    task="digits",
    task_params={"batch_size": 32, "hidden_size": 32},
    optimizer=OptimizerName.adam,
    learning_rate=3e-3,
    target_batch_size=128,
    matchmaking_time=2.0,
    averaging_timeout=5.0,  # the last round after a peer left fails fast
)


def make_join(
    peer: RunPeer,
    worker_id: str,
    identity: Path,
    experiment: ExperimentConfig = TEST_EXPERIMENT,
    username: str = "tester",
) -> JoinResponse:
    """What the server's join answers, for the key at ``identity``: a token signed by the run's key."""
    public_key = swarm_access.load_or_create_identity(identity).get_public_key().to_bytes()
    token = swarm_access.sign_token(peer.signing_key, peer.run_id, username, public_key, timedelta(hours=1))
    return JoinResponse(
        experiment=experiment,
        run_id=peer.run_id,
        initial_peers=peer.maddrs,
        worker_id=worker_id,
        username=username,
        report_path=f"/ws/experiments/{experiment.slug}/report",
        swarm_token=SwarmToken(**swarm_access.token_to_wire(token)),
        token_path=f"/api/experiments/{experiment.slug}/swarm-token",
        experiment_public_key=peer.signing_key.get_public_key().to_bytes().decode(),
        server_time=time.time(),
    )


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
    argv, key_text = bootstrap_peer_command(folder, run_id)
    log = open(folder / "stderr.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,  # the peer stops when its stdin closes: keep it open
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=tagged_env(tag),
    )
    try:
        reader = LineReader(proc, "the swarm peer")
        maddrs = reader.wait_for("ready", timeout=60)["maddrs"]
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
