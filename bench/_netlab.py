"""Network namespaces with shaped links for ``bench/heterogeneous_network.py`` (not a benchmark itself).

As a module: :class:`Lab` builds a small LAN out of network namespaces (needs root and ``ip``/``tc``): one
*switch* namespace holding a bridge (``10.77.0.1/24``), where the server's processes run, and one namespace per
peer, joined to the bridge by a veth pair. Each peer's link is shaped by ``tbf`` in both directions (upload: the
peer side's egress; download: the switch side's egress). An *unreachable* peer can dial out but cannot accept
connections: the switch drops every TCP SYN (SYN set, ACK clear) headed for it, as a NAT or a firewall does
(no iptables/nft here: an ``htb`` root whose ``u32`` filter sends those SYNs to a class whose leaf is
``pfifo limit 0``, which drops everything; all other traffic goes through the ``tbf`` of the default class).
Namespaces are named ``shbhet<pid>-<role>``; :meth:`Lab.destroy` deletes them all, and :meth:`Lab.create` first
deletes those that a crashed run (whose pid is gone) left behind.

As a script (``python bench/_netlab.py ROLE ...``, started inside a namespace with ``ip netns exec``), every role
prints JSON lines on stdout:

- ``probe-server HOST PORT``: the server's real pre-flight routes (``swarmhub.server.routes.probe``: bandwidth
  probes and the reachability dial-back), served by uvicorn until SIGTERM; the login they require is waived;
- ``worker CONFIG``: ``swarmhub.worker.training.peer.train`` on one thread with the given client_mode, auxiliary,
  bandwidth and listen address, or, with ``preflight_url``, with what ``swarmhub join`` decides before it trains,
  by swarmhub's own functions: ``doctor.check_reachability`` (the server dials the peer back: client mode if it
  cannot) then ``doctor.measure_bandwidth`` (not in client mode). It waits for the file ``ready`` (the swarm peer
  listens) before it joins, and once in the DHT for the file ``go`` (every peer joined) before hivemind's
  optimizer starts. It prints a timestamped trace of hivemind's status lines (each gradient round's start and
  end with its group size, parameter rounds, state downloads; from the averager processes: which leader assembled
  each group, when each all-reduce ended) and leaves the swarm when its stdin closes;
- ``dht HOST PORT`` and ``allreduce CONFIG``: a bare hivemind DHT peer, and plain ``DecentralizedAverager``
  all-reduce rounds at fixed moments without training (``--allreduce`` of the benchmark).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREFIX = "shbhet"
SUBNET = "10.77.0"
SWITCH_IP = f"{SUBNET}.1"
_STALE_RE = re.compile(rf"^{PREFIX}(\d+)-")


class LabError(RuntimeError):
    """A namespace, link or qdisc could not be set up."""


@dataclass(frozen=True)
class Link:
    role: str  # short: part of the namespace and interface names
    ip: str
    mbit: float  # tbf rate, both directions
    unreachable: bool = False  # inbound TCP SYNs are dropped at the switch


def _run(argv: list[str], check: bool = True) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise LabError(f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()[:300]}")
    return done.stdout


def netns_available() -> str | None:
    """Why this machine cannot run the lab (None when it can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc): run it with sudo"
    for tool in ("ip", "tc"):
        if subprocess.run(["which", tool], capture_output=True).returncode != 0:
            return f"`{tool}` not found: install iproute2"
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        return "`ip netns` is unavailable on this machine"
    return None


def list_namespaces() -> list[str]:
    return [line.split()[0] for line in _run(["ip", "netns", "list"]).splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _tbf(rate_mbit: float) -> list[str]:
    """A tbf of ``rate_mbit``: a burst of 10 ms at that rate (at least 16 KiB), a queue of at most 50 ms."""
    burst = max(16 * 1024, int(rate_mbit * 1e6 / 8 / 100))
    return ["tbf", "rate", f"{rate_mbit}mbit", "burst", str(burst), "latency", "50ms"]


class Lab:
    """The namespaces of one benchmark run. ``create()`` then ``destroy()`` (always, in a ``finally``)."""

    def __init__(self, links: list[Link]):
        self.links = links
        self.tag = f"{PREFIX}{os.getpid()}"
        self.switch = f"{self.tag}-sw"
        self.created: list[str] = []
        self.stale_removed: list[str] = []
        self.killed: list[int] = []  # processes destroy() found still inside a namespace

    def ns(self, role: str) -> str:
        return f"{self.tag}-{role}"

    def link(self, role: str) -> Link:
        return next(link for link in self.links if link.role == role)

    def exec_argv(self, ns: str, argv: list[str]) -> list[str]:
        """``argv`` inside namespace ``ns`` (``ip netns exec`` execs it: the pid is the command's own)."""
        return ["ip", "netns", "exec", ns, *argv]

    def _in(self, ns: str, *argv: str) -> str:
        return _run(["ip", "netns", "exec", ns, *argv])

    def remove_stale(self) -> None:
        for name in list_namespaces():
            match = _STALE_RE.match(name)
            if match and not _pid_alive(int(match.group(1))):
                _run(["ip", "netns", "del", name], check=False)
                self.stale_removed.append(name)

    def create(self) -> None:
        self.remove_stale()
        sw = self.switch
        self._add_ns(sw)
        self._in(sw, "ip", "link", "add", "br0", "type", "bridge")
        self._in(sw, "ip", "addr", "add", f"{SWITCH_IP}/24", "dev", "br0")
        self._in(sw, "ip", "link", "set", "br0", "up")
        for link in self.links:
            ns, port = self.ns(link.role), f"v-{link.role}"
            self._add_ns(ns)
            _run(["ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns])
            self._in(sw, "ip", "link", "set", port, "master", "br0")
            self._in(sw, "ip", "link", "set", port, "up")
            self._in(ns, "ip", "addr", "add", f"{link.ip}/24", "dev", "eth0")
            self._in(ns, "ip", "link", "set", "eth0", "up")
            # upload: what leaves the peer
            self._in(ns, "tc", "qdisc", "add", "dev", "eth0", "root", *_tbf(link.mbit))
            # download: what the switch sends to the peer
            if not link.unreachable:
                self._in(sw, "tc", "qdisc", "add", "dev", port, "root", *_tbf(link.mbit))
                continue
            self._in(sw, "tc", "qdisc", "add", "dev", port, "root", "handle", "1:", "htb", "default", "10")
            self._in(sw, "tc", "class", "add", "dev", port, "parent", "1:", "classid", "1:10", "htb",
                     "rate", "10gbit")  # fmt: skip
            self._in(sw, "tc", "qdisc", "add", "dev", port, "parent", "1:10", "handle", "10:", *_tbf(link.mbit))
            self._in(sw, "tc", "class", "add", "dev", port, "parent", "1:", "classid", "1:99", "htb",
                     "rate", "8kbit")  # fmt: skip
            self._in(sw, "tc", "qdisc", "add", "dev", port, "parent", "1:99", "handle", "99:", "pfifo", "limit", "0")
            # IPv4, TCP, a 20-byte IP header, then TCP flags (byte 33) with SYN set and ACK clear: a new inbound dial
            self._in(sw, "tc", "filter", "add", "dev", port, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
                     "match", "ip", "protocol", "6", "0xff", "match", "u8", "0x05", "0x0f", "at", "0",
                     "match", "u8", "0x02", "0x12", "at", "33", "flowid", "1:99")  # fmt: skip

    def _add_ns(self, ns: str) -> None:
        _run(["ip", "netns", "add", ns])
        self.created.append(ns)
        self._in(ns, "ip", "link", "set", "lo", "up")

    def counters(self) -> dict[str, dict[str, int]]:
        """Bytes sent so far over each peer's link: ``up`` (peer to switch), ``down`` (switch to peer), and
        ``syn_dropped`` (inbound dials dropped, unreachable peers only)."""
        out = {}
        for link in self.links:
            up = _qdisc_stats(self._in(self.ns(link.role), "tc", "-s", "-j", "qdisc", "show", "dev", "eth0"))
            down = _qdisc_stats(self._in(self.switch, "tc", "-s", "-j", "qdisc", "show", "dev", f"v-{link.role}"))
            out[link.role] = {
                "up": up.get("root", {}).get("bytes", 0),
                "down": down.get("root", {}).get("bytes", 0),
                "syn_dropped": down.get("99:", {}).get("drops", 0),
            }
        return out

    def pids(self, ns: str) -> list[int]:
        return [int(p) for p in _run(["ip", "netns", "pids", ns], check=False).split() if p.isdigit()]

    def destroy(self) -> list[str]:
        """Delete every namespace of this run (their veths and the bridge go with them). Processes still inside
        one (there should be none by now) are killed first. Returns what could not be deleted."""
        for ns in reversed(self.created):
            for pid in self.pids(ns):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
                    self.killed.append(pid)
        for ns in reversed(self.created):
            _run(["ip", "netns", "del", ns], check=False)
        present = set(list_namespaces())
        left = [ns for ns in self.created if ns in present]
        self.created = left
        return left


def _qdisc_stats(text: str) -> dict[str, dict[str, int]]:
    """``tc -s -j qdisc show``: {"root" or handle: {"bytes", "drops"}}."""
    stats: dict[str, dict[str, int]] = {}
    for q in json.loads(text or "[]"):
        key = "root" if q.get("root") else str(q.get("handle", "?"))
        stats[key] = {"bytes": int(q.get("bytes", 0)), "drops": int(q.get("drops", 0))}
    return stats


# -- roles (run inside a namespace) -------------------------------------------------------------------------


def _emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps({"t": time.time(), **event}) + "\n")
    sys.stdout.flush()


def run_probe_server(host: str, port: int) -> None:
    from types import SimpleNamespace

    import uvicorn
    from fastapi import FastAPI

    from swarmhub.server.http import deps
    from swarmhub.server.http.ratelimit import LIMITS, RateLimiter
    from swarmhub.server.routes import probe

    app = FastAPI()
    app.include_router(probe.router)
    # The probes' login and their per-account rate limit are not what is measured here: every peer is one account
    # (id 0), and the limiter lets every request through.
    app.dependency_overrides[deps.api_user] = lambda: SimpleNamespace(id=0)
    app.state.services = SimpleNamespace(ratelimiter=RateLimiter({action: (10**9, 1.0) for action in LIMITS}))
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False))

    def announce() -> None:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        if server.started:
            _emit({"event": "ready", "url": f"http://{host}:{port}"})

    threading.Thread(target=announce, daemon=True).start()
    server.run()  # in the main thread: SIGTERM stops it


def preflight(url: str, listen: str) -> dict[str, Any]:
    """What ``swarmhub join`` does before training (worker/join/prepare.py): can the server dial this peer back (if not,
    client mode), then this peer's bandwidth for hivemind's load balancing (not measured in client mode)."""
    from swarmhub.worker.client import ApiClient
    from swarmhub.worker.join import doctor

    with ApiClient(url, "bench") as client:
        reach, probed = doctor.check_reachability(client, [listen])
        client_mode = reach.status != doctor.OK
        bandwidth = None if client_mode else doctor.measure_bandwidth(client)
    return {"client_mode": client_mode, "bandwidth": bandwidth, "reachability": reach.line(), "listen": probed}


_STATUS = [
    ("round_begin", re.compile(r"Beginning optimizer step #(\d+)")),
    ("round_ok", re.compile(r"Averaged gradients with (\d+) peers")),
    ("round_failed", re.compile(r"Averaging gradients failed with (.{0,160})")),
    ("round_skipped", re.compile(r"Skipped averaging: there are no other peers")),
    ("round_alone", re.compile(r"Skipping pre-scheduled averaging round: there are no other peers")),
    ("round_tag_along", re.compile(r"Tagging along for a pre-scheduled gradient averaging round")),
    ("epoch", re.compile(r"Transitioning to epoch (\d+)")),
    ("out_of_sync", re.compile(r"Peer is out of sync")),
    ("state_ok", re.compile(r"Averaged parameters with (\d+) peers")),
    ("state_failed", re.compile(r"Averaging failed with (.{0,160})")),
    # in the averager processes (forked from the worker: they inherit this handler)
    ("group_assembled", re.compile(r"^(\S+) - assembled group of \d+ peers")),  # value: the leader's peer ID
    ("group_assembled", re.compile(r"follower assembled group with leader (\S+)")),
    ("allreduce_finished", re.compile(r"group_size=(\d+)\) - finished$")),
    ("allreduce_failed", re.compile(r"group_size=(\d+)\) - (?:caught|cancelled)")),
    ("allreduce_partial", re.compile(r"Averaging: received ([0-9.]+)% results")),  # some parts were not averaged
    ("allreduce_partial", re.compile(r"Reducer: received ([0-9.]+)% of input tensors")),
    ("state_download", re.compile(r"Finished downloading state in ([0-9.]+)s")),
]
_TRACED = (
    "hivemind.optim.optimizer",
    "hivemind.optim.state_averager",
    "hivemind.averaging.matchmaking",
    "hivemind.averaging.allreduce",
    "hivemind.averaging.averager",
    "hivemind.averaging.partition",
)


def trace_hivemind() -> None:
    """Print hivemind's status lines that matter here as timestamped JSON events (``_STATUS``), also from the
    averager processes that hivemind forks later (they inherit the handler)."""
    import logging

    class StatusTrace(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            for kind, pattern in _STATUS:
                match = pattern.search(message)
                if match:
                    value = match.group(1) if pattern.groups else None
                    value = int(value) if value and value.isdigit() else value
                    _emit({"event": kind, "value": value, "process": record.processName})
                    return

    trace = StatusTrace(level=logging.DEBUG)
    for name in _TRACED:
        logger = logging.getLogger(name)
        if name.endswith(("optimizer", "state_averager", "matchmaking", "allreduce")):
            logger.setLevel(logging.DEBUG)  # their status lines are DEBUG (verbose=False); averager's are INFO
        logger.addHandler(trace)


def run_worker(cfg: dict[str, Any]) -> None:
    from _worker import watch_stdin  # imports torch and sets one thread

    from swarmhub.common.protocol import JoinResponse
    from swarmhub.worker.training import peer as training

    trace_hivemind()
    stop = threading.Event()
    watch_stdin(stop.set)
    last_epoch = [0]  # every run's swarm starts at epoch 0

    def on_progress(p: Any) -> None:
        change = p.epoch != last_epoch[0]
        last_epoch[0] = p.epoch
        _emit({"event": "progress", "samples": p.samples, "step": p.step, "epoch": p.epoch, "epoch_change": change,
               "peers": p.peers, "averaged_peers": p.averaged_peers})  # fmt: skip

    client_mode, bandwidth, listen = cfg["client_mode"], cfg["bandwidth"], cfg["listen"]
    if cfg.get("preflight_url"):
        found = preflight(cfg["preflight_url"], listen)
        _emit({"event": "preflight", **found})
        client_mode, bandwidth, listen = found["client_mode"], found["bandwidth"], found["listen"][0]

    def joined(peer_id: str, maddrs: list[str]) -> None:
        """In the swarm's DHT: wait for the harness's go (every peer joined) before hivemind's optimizer starts,
        so that all peers begin at epoch 0 together instead of downloading each other's state on slow links."""
        _emit({"event": "joined", "maddrs": maddrs, "client_mode": client_mode, "bandwidth": bandwidth})
        _wait_for(Path(cfg["go"]), stop)

    _wait_for(Path(cfg["ready"]), stop)  # the swarm peer (started with this process) is listening
    join = JoinResponse.model_validate_json(cfg["join"])
    summary = training.train(
        join,
        device="cpu",
        listen_maddrs=[listen],
        client_mode=client_mode,
        auxiliary=cfg["auxiliary"],
        bandwidth=bandwidth,
        precision="fp32",
        on_progress=on_progress,
        on_joined=joined,
        stop_event=stop,
        identity_path=Path(cfg["identity"]),
    )
    _emit(
        {
            "event": "summary",
            "steps": summary.steps,
            "epoch": summary.epoch,
            "stop_reason": summary.stop_reason.value,
            "averaging_rounds": {str(k): v for k, v in summary.averaging_rounds.items()},
        }
    )


def run_dht(host: str, port: int) -> None:
    """A bare hivemind DHT peer to bootstrap from (for the all-reduce-only measurement); stops on SIGTERM."""
    import signal

    import hivemind

    dht = hivemind.DHT(host_maddrs=[f"/ip4/{host}/tcp/{port}"], start=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    _emit({"event": "ready", "maddrs": [str(m) for m in dht.get_visible_maddrs()]})
    stop.wait()
    dht.shutdown()


def run_allreduce(cfg: dict[str, Any]) -> None:
    """Plain hivemind all-reduce rounds, without training: a ``DecentralizedAverager`` (what hivemind.Optimizer's
    gradient averager is) over a vector of ``size`` fp32 values, with the given bandwidth, client mode and
    auxiliary mode. Once ready it waits for the file ``go``, which holds the time of the first round; every peer
    steps at the same moments (first + k * ``period``), so every round holds every peer and nothing else competes
    for the links."""
    import hivemind
    import torch

    torch.set_num_threads(1)
    trace_hivemind()
    extra = {}
    if cfg["swarmhub_split"]:  # as train() does: the split with a floor, cut where each share ends
        from swarmhub.worker.swarm import load_balancing

        load_balancing.install()
    if cfg.get("as_trainer"):  # swarmhub's guarded all-reduce and hivemind.Optimizer's chunk timeouts, as train()
        import hivemind.averaging.averager as averager_module

        from swarmhub.worker.swarm import robust

        averager_module.AllReduceRunner = robust.make_runner_class()
        extra["next_chunk_timeout"] = cfg["matchmaking_time"]
    dht = hivemind.DHT(
        initial_peers=cfg["initial_peers"], host_maddrs=[cfg["listen"]], client_mode=cfg["client_mode"], start=True
    )
    averager = hivemind.averaging.DecentralizedAverager(
        [torch.randn(cfg["size"])],
        dht,
        prefix=cfg["prefix"],
        target_group_size=16,
        min_matchmaking_time=cfg["matchmaking_time"],
        request_timeout=1.0,
        bandwidth=cfg["bandwidth"],
        client_mode=cfg["client_mode"],
        auxiliary=cfg["auxiliary"],
        start=True,
        **extra,
    )
    _emit({"event": "ready"})
    go = Path(cfg["go"])
    _wait_for(go, threading.Event())
    t0 = float(go.read_text())
    try:
        for k in range(cfg["rounds"]):
            time.sleep(max(t0 + k * cfg["period"] - time.time(), 0.0))
            try:
                averager.step(timeout=cfg["period"] - 1.0)
            except Exception as exc:  # a failed round is a result, not an error of the benchmark
                _emit({"event": "step_failed", "value": repr(exc)[:160]})
    finally:
        averager.shutdown()
        dht.shutdown()


def _wait_for(path: Path, stop: threading.Event) -> None:
    while not path.exists() and not stop.is_set():
        time.sleep(0.1)


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "probe-server":
        run_probe_server(sys.argv[2], int(sys.argv[3]))
    elif role == "worker":
        run_worker(json.loads(sys.argv[2]))
    elif role == "dht":
        run_dht(sys.argv[2], int(sys.argv[3]))
    elif role == "allreduce":
        run_allreduce(json.loads(sys.argv[2]))
    else:
        raise SystemExit(f"unknown role {role!r}")
