"""Heterogeneous network: do swarmhub's adaptations (the measured bandwidth passed to hivemind's load balancing,
client mode for a peer that cannot be dialed, an auxiliary peer on a fast link) make averaging rounds faster when
the peers' links are uneven?

Setup (``bench/_netlab.py``): every peer runs in a network namespace of its own, joined by a veth pair to a bridge
in a *switch* namespace, where the server's bootstrap/monitor peer (``python -m
swarmhub.server.swarm.bootstrap_peer``) and the server's real probe routes (``swarmhub.server.routes.probe``) run.
Each link is shaped by ``tbf`` in both
directions: ``fast`` 100 Mbit/s, ``slow1`` and ``slow2`` 10 Mbit/s, ``nat`` 20 Mbit/s and unreachable (the switch
drops every TCP SYN headed for it, as a NAT does: it can dial out, nobody can dial in), ``aux`` 100 Mbit/s (only
the adaptive variant has a peer there). Four trainers (fast, slow1, slow2, nat) run ``train()`` on digits' MLP at
its widest (hidden_size 4096: 307,210 parameters, 1.2 MiB of fp32 gradients a round, and as much of parameters,
which hivemind averages after each round), one thread each, with the experiment defaults matchmaking_time 3 s and
averaging_timeout 30 s. Every peer joins the DHT first and all start training together (a barrier), as if the
swarm had been running: the window starts when every trainer has been through a round.

Variants (the same namespaces, links and trainers; a fresh swarm for each run):

- adaptive: what ``swarmhub join`` does. Each peer runs join's pre-flight with swarmhub's own functions:
  ``doctor.check_reachability`` (the server dials the peer back; the nat peer cannot be dialed, so it joins in
  client mode) and ``doctor.measure_bandwidth`` (2 MiB down and up over the peer's shaped link to the probe
  routes; measured, not configured), whose result goes to ``train(bandwidth=...)``. Plus an auxiliary peer
  (``auxiliary=True``, measured bandwidth) on the ``aux`` link;
- naive: ``bandwidth=None`` for every peer (hivemind then splits the vector evenly), every peer in normal mode (the
  unreachable one too, as a volunteer who knows nothing about NAT would), no auxiliary peer.

Metric: the averaging round time, per trainer and round: from the moment the round's all-reduce could begin (its
group is assembled and every trainer in it has finished its share of the batch) to the moment that trainer's
all-reduce is over; a round in which no group formed counts whole (hivemind gives up after averaging_timeout). It
isolates communication: compute and the matchmaking lead time that hivemind schedules before each epoch's end are
out, and the time a trainer waits for slower trainers to finish computing is out too (those depend on the CPU, not
on the network), while the all-reduce itself, waiting for slow links, retries and failures are in. The groups are
read from hivemind's own debug lines (which peers a leader assembled, when each all-reduce ended). Median over the
rounds of a window (16 trainer rounds, at most 50 s) per run; median and min..max over 3 runs per variant, which
alternate (adaptive first in odd runs). Also printed: averaged gradients per minute end to end, group sizes,
rounds not fully averaged (failed, or "received N% results": the parts an unreachable peer was to reduce were
lost), state downloads, each link's round time and the MB it carried per round (tc counters).

Target: averaging rounds at least 1.3x faster adaptive than naive (median naive round time / median adaptive round
time >= 1.3). Prints PASS or MISS and exits 0 either way; nonzero only when the benchmark itself fails. Deletes
every namespace it created, also on an error or Ctrl-C, and leaves no process behind (no p2pd).

``--compare-overlap`` runs the adaptive variant with the experiment's ``overlap`` at ``none`` and at
``delayed-averaging`` instead, two trainers only (slow1 and slow2, 10 Mbit/s each; no auxiliary peer), and prints
the trainers' samples/s together: on links this slow the all-reduce is a large share of each epoch, which is what
averaging in the background is meant to hide.

``--allreduce`` times plain hivemind all-reduce rounds instead (no training, every peer in every round), under each
of the adaptations on its own: it shows where the time of a round goes.

Command (needs root, ``ip netns`` and ``tc``): ``sudo .venv/bin/python bench/heterogeneous_network.py [--quick]``
(full: 3 runs of each variant, about 7-8 minutes on a 2-core machine; --quick: one short run of each with a smaller
model, a smoke run of about 90 s on an idle machine); ``... --allreduce`` about 6 minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common as c
import _netlab as net

NETLAB = str(Path(__file__).resolve().with_name("_netlab.py"))
PROBE_PORT = 8080
PEER_PORT = 41000  # the swarm peer's port in the switch namespace: one per run
TARGET_SPEEDUP = 1.3
TRAINERS: tuple[str, ...] = ("fast", "slow1", "slow2", "nat")
LINKS = [
    net.Link("fast", f"{net.SUBNET}.11", 100.0),
    net.Link("slow1", f"{net.SUBNET}.12", 10.0),
    net.Link("slow2", f"{net.SUBNET}.13", 10.0),
    net.Link("nat", f"{net.SUBNET}.14", 20.0, unreachable=True),
    net.Link("aux", f"{net.SUBNET}.15", 100.0),
]
VARIANTS: tuple[str, ...] = ("adaptive", "naive")
WITH_AUX = True  # --no-aux: the adaptive variant without its auxiliary peer
OVERLAPS = ("none", "delayed-averaging")  # --compare-overlap: the adaptive variant with each, two slow trainers


@dataclass(frozen=True)
class Mode:
    name: str
    runs: int  # of each variant
    max_warmup: float  # the window starts when every trainer has been through a round, or after this many seconds
    rounds: int  # the window ends after this many gradient rounds of the trainers (all four together)...
    max_window: float  # ...or after this many seconds
    epoch_seconds: float  # the target batch is what the 4 trainers compute in this time (bare loop, one thread)
    target_batch_size: int = 0  # set in main(): sized for the machine, or --target-batch-size
    hidden_size: int = c.HIDDEN_SIZE  # 4096, the widest digits allows: 307,210 parameters, 1.2 MiB in fp32
    batch_size: int = 256


# full: the 4 trainers' batch is what the bare loop computes in 2.5 s x 4 (on 2 cores an epoch takes 6 to 8 s, then
# the round), longer than matchmaking_time (3 s): with shorter epochs hivemind pre-schedules each round for 3 s after
# the previous one, peers reach their epoch's end at different moments in that wait, and the groups split (measured:
# epochs of 0.3 s of compute gave groups of 3 and 4 out of 5, and rounds that waited out a timeout for a reducer
# that was in another group). Twice that batch (epochs of 15 s, 2026-12-05) left one round per trainer in a 25 s
# window: a run's median was one round. 16 trainer rounds (four each) or 50 s; at most ~110 s a run
FULL = Mode("full", runs=3, max_warmup=15, rounds=16, max_window=50, epoch_seconds=2.5)
# quick: a smoke run (one short run of each variant; a smaller model, so that peers start quicker)
QUICK = Mode("quick", runs=1, max_warmup=0, rounds=4, max_window=10, epoch_seconds=1.5, hidden_size=1024)


def experiment(mode: Mode, overlap: str | None = None) -> dict[str, Any]:
    # matchmaking_time and averaging_timeout: the experiment defaults (TrainingSettings)
    return c.experiment_config(
        hidden_size=mode.hidden_size,
        batch_size=mode.batch_size,
        target_batch_size=mode.target_batch_size,
        matchmaking_time=3.0,
        averaging_timeout=30.0,
        overlap=overlap,
    )


# -- processes ----------------------------------------------------------------------------------------------


def start_probe_server(h: c.Harness, lab: net.Lab) -> str:
    argv = lab.exec_argv(lab.switch, [sys.executable, NETLAB, "probe-server", net.SWITCH_IP, str(PROBE_PORT)])
    proc = h.spawn("probe-server", argv, stop_signal=signal.SIGTERM)
    try:
        return proc.reader.wait_for("ready", 60)["url"]
    except c.BenchError as exc:
        raise c.BenchError(f"{exc}\n{proc.log_tail()}") from None


def swarm_peer_argv(h: c.Harness, lab: net.Lab, name: str, port: int) -> tuple[list[str], c.SwarmPeer]:
    """The server's bootstrap/monitor peer, as the server starts it, on the switch's address: its key and port
    are chosen here, so that its address is known before it runs and the workers can start at the same time."""
    from swarmhub.worker.swarm import access as swarm_access

    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    folder = h.tmp / name
    folder.mkdir()
    key_text = swarm_access.new_signing_key_der()
    (folder / "signing").write_text(key_text)
    identity = swarm_access.load_or_create_identity(folder / "peer.key")
    peer_id = swarm_access.peer_id_for_public_key(identity.get_public_key().to_bytes())
    argv = [sys.executable, "-m", "swarmhub.server.swarm.bootstrap_peer", "--run-id", run_id, "--host", net.SWITCH_IP,
            "--port", str(port), "--signing-key-file", str(folder / "signing"),
            "--identity", str(folder / "peer.key")]  # fmt: skip
    maddr = f"/ip4/{net.SWITCH_IP}/tcp/{port}/p2p/{peer_id}"
    signing_key = swarm_access.signing_key_from_text(key_text)
    return lab.exec_argv(lab.switch, argv), c.SwarmPeer(None, run_id, [maddr], signing_key)  # type: ignore[arg-type]


def wait_rounds(procs: list[c.Proc], events: Any, since: float, rounds: int, timeout: float, each: bool) -> float:
    """Until the trainers have completed ``rounds`` gradient averaging rounds after ``since`` (``each``: every
    trainer that many), or for ``timeout`` seconds; returns that moment."""
    while (now := time.time()) < since + timeout:
        c.check_alive(procs)
        done = round_times(events(), since, now)
        counts = [len(done[role]) for role in TRAINERS]
        if (min(counts) if each else sum(counts)) >= rounds:
            return now
        time.sleep(0.5)
    return time.time()


def run_variant(
    h: c.Harness, lab: net.Lab, variant: str, run: int, mode: Mode, probe_url: str, overlap: str | None = None
) -> dict[str, Any]:
    prefix = f"r{run}-{variant}" + (f"-{overlap}" if overlap else "")
    adaptive = variant == "adaptive"
    spawned = time.time()
    slot = OVERLAPS.index(overlap) if overlap else adaptive  # the swarm peer's port: one per run and variant
    argv, peer = swarm_peer_argv(h, lab, f"{prefix}-peer", PEER_PORT + 2 * run + slot)
    peer.proc = h.spawn(f"{prefix}-peer", argv)
    exp = experiment(mode, overlap)
    roles = [*TRAINERS, "aux"] if adaptive and WITH_AUX else list(TRAINERS)
    ready, go = h.tmp / f"{prefix}.ready", h.tmp / f"{prefix}.go"
    procs: dict[str, c.Proc] = {}
    for role in roles:
        link = lab.link(role)
        identity = h.tmp / f"{prefix}-{role}.key"
        cfg = {
            "join": c.join_json(peer, f"worker-{role}", identity, exp),
            "identity": str(identity),
            "listen": f"/ip4/{link.ip}/tcp/0",
            "client_mode": False,
            "auxiliary": role == "aux",
            "bandwidth": None,
            "preflight_url": probe_url if adaptive else None,  # join's checks decide client mode and bandwidth
            "ready": str(ready),
            "go": str(go),
        }
        argv = lab.exec_argv(lab.ns(role), [sys.executable, NETLAB, "worker", json.dumps(cfg)])
        procs[role] = h.spawn(f"{prefix}-{role}", argv)
    trainers = [procs[role] for role in TRAINERS]
    everyone = [*procs.values(), peer.proc]
    phases = {}
    try:
        maddrs = peer.proc.reader.wait_for("ready", 120)["maddrs"]
    except c.BenchError as exc:
        raise c.BenchError(f"{exc}\n{peer.proc.log_tail()}") from None
    if peer.maddrs[0] not in maddrs:
        raise c.BenchError(f"the swarm peer listens on {maddrs}, not on {peer.maddrs}")
    ready.touch()  # the workers may join now
    phases["peer"] = time.time()
    joined = {}
    for role, proc in procs.items():
        try:
            joined[role] = proc.reader.wait_for("joined", 240)
        except c.BenchError as exc:
            raise c.BenchError(f"{exc}\n{proc.log_tail()}") from None
        if adaptive and joined[role]["client_mode"] != lab.link(role).unreachable:
            found = next(e for e in proc.events if e.get("event") == "preflight")
            raise c.BenchError(
                f"{role}: join's pre-flight chose client_mode={joined[role]['client_mode']} "
                f"({found['reachability']}): the lab's links are not as intended"
            )
    go.touch()  # every peer is in the DHT: all start hivemind's optimizer at epoch 0 together
    phases["joined"] = time.time()
    c.wait_progress(trainers, 300)  # hivemind starts slowly on a loaded machine
    phases["training"] = time.time()

    def events() -> dict[str, list[dict[str, Any]]]:
        return {role: proc.events for role, proc in procs.items()}

    # warm-up: until every trainer has been through a gradient round (they start together, and the first epoch
    # also holds everyone's initial state download)
    t0 = phases["warm"] = wait_rounds(everyone, events, phases["training"], 1, mode.max_warmup, each=True)
    bytes0, cpu0 = lab.counters(), c.cpu_seconds(everyone)
    t1 = phases["window"] = wait_rounds(everyone, events, t0, mode.rounds, mode.max_window, each=False)
    bytes1, cpu = lab.counters(), c.cpu_share(cpu0, c.cpu_seconds(everyone), t1 - t0)
    # the measurement is over: every process is asked to leave (stdin closed), and whatever is still there after
    # 5 s (a worker in a round whose partner left waits up to averaging_timeout) is stopped with its process group
    # (SIGTERM, then SIGKILL: its DHT, averagers and p2pd included)
    codes = h.stop(everyone, timeout=5)
    phases["stopped"] = time.time()
    if any(code not in (0, None) for code in codes):
        tails = "\n".join(f"--- {p.name}\n{p.log_tail(1500)}" for p in everyone)
        raise c.BenchError(f"{prefix}: exit codes {codes}\n{tails}")
    for role, proc in procs.items():  # for a look afterwards (kept with SWARMHUB_BENCH_KEEP=1)
        (h.tmp / f"{prefix}-{role}.events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in proc.events))
    (h.tmp / f"{prefix}.window.json").write_text(json.dumps({"t0": t0, "t1": t1}))
    result = analyse({role: procs[role].events for role in procs}, t0, t1)
    result["samples_per_second"] = c.swarm_rate(trainers, t0, t1)[0]  # the trainers' together
    last = spawned
    result["phases"] = {}
    for name, t in phases.items():
        result["phases"][name] = t - last
        last = t
    result["cpu"] = cpu
    result["bandwidth"] = {role: e["bandwidth"] for role, e in joined.items()}
    result["client_mode"] = {role: e["client_mode"] for role, e in joined.items()}
    result["bytes"] = {
        role: {key: bytes1[role][key] - bytes0[role][key] for key in bytes1[role]} for role in bytes1 if role in roles
    }
    return result


# -- analysis -----------------------------------------------------------------------------------------------

GRADIENTS = "GradientAverager"  # hivemind's averager processes are named after their class
PARAMETERS = "TrainingStateAverager"


@dataclass
class Group:
    """One all-reduce of one averager (gradients or parameters): the peers that the same leader assembled."""

    leader: str
    # role: (assembled, end, ok); ok: the all-reduce finished and averaged every part (no "received N% results")
    members: dict[str, tuple[float, float, bool]] = field(default_factory=dict)
    start: float = 0.0  # when the all-reduce could begin: assembled, and every member's round begun

    @property
    def assembled(self) -> float:
        return min(m[0] for m in self.members.values())

    @property
    def end(self) -> float:
        return max(m[1] for m in self.members.values())

    @property
    def ok(self) -> bool:
        return all(m[2] for m in self.members.values())

    @property
    def duration(self) -> float:
        return max(self.end - self.start, 0.0)


def groups_of(events: dict[str, list[dict[str, Any]]], averager: str) -> list[Group]:
    """Every all-reduce of ``averager`` that the peers' traces show: members are matched by their leader's peer ID
    and assembled within 1.5 s of each other (they are told at once; a leader leads one group at a time)."""
    found = []  # (leader, assembled, role, end, ok)
    for role, trace in events.items():
        current: tuple[float, str] | None = None
        partial = False
        for e in trace:
            if not str(e.get("process") or "").startswith(averager):
                continue
            if e["event"] == "group_assembled":
                current, partial = (e["t"], str(e["value"])), False
            elif e["event"] == "allreduce_partial":
                partial = True  # "received 14.7% results": the parts of an unreachable reducer were not averaged
            elif e["event"] in ("allreduce_finished", "allreduce_failed") and current is not None:
                ok = e["event"] == "allreduce_finished" and not partial
                found.append((current[1], current[0], role, e["t"], ok))
                current = None
    found.sort(key=lambda x: (x[0], x[1]))
    groups: list[Group] = []
    for leader, assembled, role, end, ok in found:
        last = groups[-1] if groups else None
        if last is None or last.leader != leader or role in last.members or assembled - last.assembled > 1.5:
            last = Group(leader)
            groups.append(last)
        last.members[role] = (assembled, end, ok)
    for group in groups:
        # A trainer's gradient round begins when it reaches the end of its epoch ("Beginning optimizer step"): the
        # all-reduce cannot run before every trainer of the group is there. (Not the auxiliary peer's: it takes
        # part through its pre-scheduled round; when it is late, that is in the round's time.)
        begun = [_last_before(events[role], "round_begin", m[1]) for role, m in group.members.items() if role != "aux"]
        group.start = max([max(m[0] for m in group.members.values()), *[b for b in begun if b is not None]])
    return sorted(groups, key=lambda g: g.assembled)


def _last_before(trace: list[dict[str, Any]], kind: str, t: float) -> float | None:
    times = [e["t"] for e in trace if e.get("event") == kind and e["t"] <= t]
    return times[-1] if times else None


def trainer_rounds(trace: list[dict[str, Any]]) -> list[tuple[float, float, str]]:
    """A trainer's gradient rounds as its loop saw them: (begin, end, outcome), from "Beginning optimizer step"
    to the line that says how it ended (averaged, failed, or no round: alone or tagging along)."""
    rounds, begun = [], None
    for e in trace:
        kind = e.get("event")
        if kind == "round_begin":
            begun = e["t"]
        elif begun is not None and kind in _ENDS:
            rounds.append((begun, e["t"], kind.removeprefix("round_")))
            begun = None
    return rounds


_ENDS = ("round_ok", "round_failed", "round_skipped", "round_alone", "round_tag_along")


def round_times(
    events: dict[str, list[dict[str, Any]]], t0: float, t1: float
) -> dict[str, list[tuple[float, bool, int]]]:
    """Each trainer's gradient averaging rounds inside [t0, t1]: (seconds, averaged, group size).

    The time of a round is its communication: from the moment its all-reduce could begin (the group is assembled
    and every member has reached the end of its epoch) to the moment this trainer's all-reduce is over. A round
    in which no group formed at all (hivemind's "could not find a group", after averaging_timeout) counts from its
    "Beginning optimizer step" to its end: all of it was spent trying to communicate."""
    groups = [g for g in groups_of(events, GRADIENTS) if len(g.members) >= 2]
    out: dict[str, list[tuple[float, bool, int]]] = {role: [] for role in TRAINERS}
    for role in TRAINERS:
        spans = []
        for g in groups:
            if role in g.members and g.assembled >= t0 and g.members[role][1] <= t1:
                assembled, end, ok = g.members[role]
                out[role].append((max(end - g.start, 0.0), ok, len(g.members)))
                spans.append((assembled, end))
        for begin, end, outcome in trainer_rounds(events[role]):
            grouped = any(begin - 1.0 <= s_end <= end + 1.0 for _, s_end in spans)
            if outcome == "failed" and begin >= t0 and end <= t1 and not grouped:
                out[role].append((end - begin, False, 0))
    return out


def analyse(events: dict[str, list[dict[str, Any]]], t0: float, t1: float) -> dict[str, Any]:
    rounds = round_times(events, t0, t1)
    every = [r for role in TRAINERS for r in rounds[role]]
    groups = [g for g in groups_of(events, GRADIENTS) if g.assembled >= t0 and g.end <= t1 and len(g.members) >= 2]
    params = [g for g in groups_of(events, PARAMETERS) if g.assembled >= t0 and g.end <= t1 and len(g.members) >= 2]
    minutes = max(t1 - t0, 1e-9) / 60.0
    blocked = {}
    for role in TRAINERS:
        inside = [r for r in trainer_rounds(events[role]) if r[0] >= t0 and r[1] <= t1 and r[2] in ("ok", "failed")]
        blocked[role] = c.median([end - begin for begin, end, _ in inside])

    def count(kind: str) -> int:
        return sum(1 for role in TRAINERS for e in events[role] if e.get("event") == kind and t0 <= e["t"] <= t1)

    return {
        "round_time": c.median([seconds for seconds, _, _ in every]),  # the headline
        "round_time_ok": c.median([seconds for seconds, ok, _ in every if ok]),
        "rounds": len(every),
        "failed": sum(1 for _, ok, _ in every if not ok),
        "no_group": sum(1 for _, _, size in every if size == 0),
        "group_size": c.median([size for _, ok, size in every if size]),
        "per_role": {role: f"{sum(1 for r in rounds[role] if r[1])}/{len(rounds[role])}" for role in TRAINERS},
        "role_time": {role: c.median([r[0] for r in rounds[role]]) for role in TRAINERS},
        "averaged_per_min": sum(1 for _, ok, _ in every if ok) / minutes,
        "sizes": dict(sorted(defaultdict_count(len(g.members) for g in groups).items())),
        "aux_groups": sum(1 for g in groups if "aux" in g.members),
        "blocked": blocked,
        "param_rounds": f"{sum(1 for g in params if g.ok)}/{len(params)}",
        "out_of_sync": count("out_of_sync"),
        "state_downloads": count("state_download"),
        "rounds_of_role": {role: sum(1 for g in groups if role in g.members) for role in events},
        "window": t1 - t0,
    }


def defaultdict_count(items: Any) -> dict[Any, int]:
    counts: dict[Any, int] = defaultdict(int)
    for item in items:
        counts[item] += 1
    return counts


# -- report -------------------------------------------------------------------------------------------------


def report(results: dict[str, list[dict[str, Any]]], mode: Mode, elapsed: float) -> bool:
    runs = mode.runs
    print()
    print(f"results ({runs} run(s) of each variant, {elapsed:.0f} s; median and min..max over runs):")
    headers = ["metric", *[f"run {i + 1}" for i in range(runs)], "median", "spread"]
    rows = []

    def add(label: str, key: str | Any, fmt: str = "{:.2f}") -> None:
        for variant in VARIANTS:
            values = [key(r) if callable(key) else r[key] for r in results[variant]]
            numbers = [v for v in values if isinstance(v, (int, float)) and v == v]  # NaN: no such round
            summary = [fmt.format(c.median(numbers)), c.spread(numbers)] if numbers else ["-", "-"]
            rows.append([f"{variant}: {label}", *[fmt.format(v) for v in values], *summary])

    add("averaging round time (s)", "round_time")
    add("rounds per minute of communication", lambda r: 60.0 / r["round_time"], "{:.1f}")
    ratios = [n["round_time"] / a["round_time"] for a, n in zip(results["adaptive"], results["naive"], strict=True)]
    shown = [r for r in ratios if r == r]
    rows.append(["adaptive speed-up (naive/adaptive, paired)", *[f"{r:.2f}" for r in ratios],
                 f"{c.median(shown):.2f}" if shown else "-", c.spread(shown)])  # fmt: skip
    add("round time, averaged rounds only (s)", "round_time_ok")
    add("trainer rounds (not fully averaged, no group)", lambda r: f"{r['rounds']} ({r['failed']}, {r['no_group']})",
        "{}")  # fmt: skip
    add("group size (median, aux included)", "group_size", "{:.1f}")
    add("gradients averaged per minute", "averaged_per_min", "{:.1f}")
    add("trainer blocked per round (s)", lambda r: c.median([v for v in r["blocked"].values() if v == v]))
    add("state downloads (fell out of sync)", "state_downloads", "{}")
    print(c.table(headers, [[str(x) for x in row] for row in rows]))

    print()
    print("per link (medians over runs): its rate, what join's pre-flight measured (Mbit/s), the trainer's median")
    print("round time (s), its rounds averaged/all, and MB it sent up/down per gradient round it took part in")
    print("(parameter averaging, DHT traffic and state downloads included):")
    link_rows = []
    for link in LINKS:
        row: list[Any] = [link.role, f"{link.mbit:g}", _bw(results["adaptive"], link.role)]
        for variant in VARIANTS:
            times = [r["role_time"].get(link.role, float("nan")) for r in results[variant]]
            times = [t for t in times if t == t]
            row.append(f"{c.median(times):.2f}" if times else "-")
            row.append(" ".join(r["per_role"].get(link.role, "-") for r in results[variant]))
            per_round = [_mb_per_round(r, link.role) for r in results[variant]]
            ups = [u for u, _ in per_round if u == u]
            downs = [d for _, d in per_round if d == d]
            row.append(f"{c.median(ups):.2f}/{c.median(downs):.2f}" if ups else "-")
        link_rows.append(row)
    headers = [
        "link",
        "Mbit/s",
        "measured",
        "adaptive s",
        "averaged",
        "MB up/down",
        "naive s",
        "averaged",
        "MB up/down",
    ]
    print(c.table(headers, link_rows))

    for variant in VARIANTS:
        for i, r in enumerate(results[variant]):
            syn = r["bytes"].get("nat", {}).get("syn_dropped", 0)
            print(
                f"{variant} run {i + 1}: phases (s) {_phases(r['phases'])}; groups by size {r['sizes']}"
                + (f", {r['aux_groups']} with aux" if variant == "adaptive" else "")
                + f"; parameter rounds ok {r['param_rounds']}; dials to nat dropped {syn}"
            )
            print(f"  cores used in the window (main process + its hivemind helpers): {r['cpu']}")
    naive = c.median([r["round_time"] for r in results["naive"] if r["round_time"] == r["round_time"]])
    adaptive = c.median([r["round_time"] for r in results["adaptive"] if r["round_time"] == r["round_time"]])
    speedup = naive / adaptive if adaptive == adaptive and naive == naive else float("nan")
    met = speedup >= TARGET_SPEEDUP
    print(
        f"averaging round time, naive / adaptive: {naive:.2f} s / {adaptive:.2f} s = adaptive {speedup:.2f}x faster "
        f"(target >= {TARGET_SPEEDUP}x): {c.verdict(met)}"
    )
    return met


def report_overlap(results: dict[str, list[dict[str, Any]]]) -> None:
    """--compare-overlap: the two slow trainers' samples/s with each overlap, run by run."""
    none, delayed = ([r["samples_per_second"] for r in results[o]] for o in OVERLAPS)
    ratios = [d / n for d, n in zip(delayed, none, strict=True)]
    print()
    print("overlap on slow links (two trainers on 10 Mbit/s, one thread each): the trainers' samples/s together")
    headers = ["overlap", *[f"run {i + 1}" for i in range(len(none))], "median", "spread"]
    rows = [
        c.summary_row("none", none),
        c.summary_row("delayed-averaging", delayed),
        c.summary_row("ratio delayed-averaging/none", ratios),
    ]
    print(c.table(headers, rows))
    for overlap in OVERLAPS:
        rs = results[overlap]
        times = ", ".join(f"{r['round_time']:.2f}" for r in rs)
        per_minute = ", ".join(f"{r['averaged_per_min']:.1f}" for r in rs)
        failed = ", ".join(str(r["failed"]) for r in rs)
        print(
            f"{overlap}: averaging round time (median per run) {times} s; gradients averaged a minute {per_minute}; "
            f"trainer rounds not fully averaged {failed}; cores {', '.join(str(r['cpu']) for r in rs)}"
        )
    print(f"delayed-averaging / none = {c.median(ratios):.3f}")


def _mib(hidden: int) -> float:
    return (64 * hidden + hidden + hidden * 10 + 10) * 4 / 2**20


def _phases(phases: dict[str, float]) -> str:
    return " ".join(f"{name} {seconds:.0f}" for name, seconds in phases.items())


def _bw(adaptive: list[dict[str, Any]], role: str) -> str:
    """What join's pre-flight measured for this link in the adaptive runs (median)."""
    if any(r["client_mode"].get(role) for r in adaptive):
        return "client mode"
    values = [r["bandwidth"][role] for r in adaptive if r["bandwidth"].get(role) is not None]
    return f"{c.median(values):.1f}" if values else "-"


def _mb_per_round(result: dict[str, Any], role: str) -> tuple[float, float]:
    rounds = result["rounds_of_role"].get(role, 0)
    counted = result["bytes"].get(role)
    if not counted or rounds <= 0:
        return float("nan"), float("nan")
    return counted["up"] / 1e6 / rounds, counted["down"] / 1e6 / rounds


# -- the all-reduce alone (--allreduce) ----------------------------------------------------------------------

# role: (bandwidth, client_mode, auxiliary); bandwidth "rate" is the link's configured rate (the load balancing
# uses only the ratios of the peers' bandwidths, and join's pre-flight measures within ~5% of the rates)
ALLREDUCE_CONFIGS: dict[str, dict[str, tuple[str | None, bool, bool]]] = {
    "naive: no bandwidth, all in normal mode": {r: (None, False, False) for r in TRAINERS},
    "client mode for nat only": {**{r: (None, False, False) for r in TRAINERS}, "nat": (None, True, False)},
    "bandwidth only (nat in normal mode)": {r: ("rate", False, False) for r in TRAINERS},
    "bandwidth + client mode for nat": {**{r: ("rate", False, False) for r in TRAINERS}, "nat": (None, True, False)},
    "adaptive: bandwidth + client mode + aux": {
        **{r: ("rate", False, False) for r in TRAINERS},
        "nat": (None, True, False),
        "aux": ("rate", False, True),
    },
}
# Every configuration splits the vector as swarmhub's workers do (``worker/swarm/load_balancing.py``: hivemind's split,
# every reachable peer at least 1 %), except this one, which shows hivemind's own split for comparison.
HIVEMIND_SPLIT = "adaptive, hivemind's own split (slow peers may get 0)"
ALLREDUCE_CONFIGS[HIVEMIND_SPLIT] = ALLREDUCE_CONFIGS["adaptive: bandwidth + client mode + aux"]
# The adaptive set-up as train() runs its gradient rounds: swarmhub's guarded all-reduce (robust.py) and
# hivemind.Optimizer's chunk timeouts (a sender that sends nothing for matchmaking_time is left out).
AS_TRAINER = "adaptive, as train() averages (guarded all-reduce, chunk timeouts)"
ALLREDUCE_CONFIGS[AS_TRAINER] = ALLREDUCE_CONFIGS["adaptive: bandwidth + client mode + aux"]


def allreduce_comparison(h: c.Harness, lab: net.Lab, rounds: int, period: float, only: str | None = None) -> None:
    """The same links and peers, no training: plain hivemind all-reduce rounds of a vector as large as the model's
    gradients, every peer in every round, one configuration of swarmhub's adaptations at a time."""
    argv = lab.exec_argv(lab.switch, [sys.executable, NETLAB, "dht", net.SWITCH_IP, str(PEER_PORT - 1)])
    boot = h.spawn("dht", argv, stop_signal=signal.SIGTERM)
    initial_peers = boot.reader.wait_for("ready", 60)["maddrs"]
    size = 64 * c.HIDDEN_SIZE + c.HIDDEN_SIZE + c.HIDDEN_SIZE * 10 + 10
    rows = []
    for n, (name, config) in enumerate(ALLREDUCE_CONFIGS.items()):
        if only is not None and only not in name:
            continue
        with c.phase(f"all-reduce only: {name}"):
            go = h.tmp / f"allreduce-{n}.go"
            procs = {}
            for role, (bandwidth, client_mode, auxiliary) in config.items():
                link = lab.link(role)
                cfg = {"initial_peers": initial_peers, "listen": f"/ip4/{link.ip}/tcp/0", "size": size,
                       "prefix": f"allreduce{n}" + ("_grad_averager" if name == AS_TRAINER else ""),
                       "as_trainer": name == AS_TRAINER, "bandwidth": link.mbit if bandwidth else None,
                       "client_mode": client_mode, "auxiliary": auxiliary, "matchmaking_time": 3.0,
                       "rounds": rounds, "period": period, "go": str(go),
                       "swarmhub_split": name != HIVEMIND_SPLIT}  # fmt: skip
                argv = lab.exec_argv(lab.ns(role), [sys.executable, NETLAB, "allreduce", json.dumps(cfg)])
                procs[role] = h.spawn(f"allreduce-{n}-{role}", argv)
            for proc in procs.values():
                proc.reader.wait_for("ready", 120)
            t0 = time.time() + 2.0
            go.write_text(repr(t0))
            before = lab.counters()
            deadline = t0 + rounds * period + 30
            while any(p.popen.poll() is None for p in procs.values()) and time.time() < deadline:
                time.sleep(0.5)
            after = lab.counters()
            h.stop(list(procs.values()), timeout=5)
            events = {role: proc.events for role, proc in procs.items()}
            groups = [g for g in groups_of(events, "DecentralizedAverager") if g.assembled >= t0 + period - 1.0]
            times = [g.duration for g in groups if len(g.members) >= 2]
            failed = sum(1 for g in groups if not g.ok) + sum(
                1 for e in events.values() for x in e if x.get("event") == "step_failed" and x["t"] >= t0 + period
            )
            counted = max(rounds - 1, 1)  # the first round is a warm-up
            traffic = " ".join(
                f"{role} {(after[role]['up'] - before[role]['up']) / 1e6 / rounds:.1f}/"
                f"{(after[role]['down'] - before[role]['down']) / 1e6 / rounds:.1f}"
                for role in config
            )
            sizes = sorted({len(g.members) for g in groups})
            rows.append(
                [name, c.median(times), c.spread(times), f"{len(times)}/{counted}", failed, str(sizes), traffic]
            )
    h.stop([boot])
    print()
    print(f"the all-reduce alone ({rounds - 1} timed rounds per configuration, {size:,} fp32 values; round time from")
    print("the group's assembly to its last member's end; MB each peer sent up/down per round):")
    print(c.table(["configuration", "median s", "spread", "rounds", "failed", "group sizes", "MB up/down"], rows))


# -- main ---------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of about 90 s")
    parser.add_argument("--runs", type=int, default=None, help="override the number of runs of each variant")
    parser.add_argument("--rounds", type=int, default=None, help="override the rounds of all 4 trainers per window")
    parser.add_argument("--max-window", type=float, default=None, help="override the longest window (s)")
    parser.add_argument(
        "--target-batch-size",
        type=int,
        default=None,
        help="override the swarm's batch (default: what its 4 trainers compute in the mode's epoch time here)",
    )
    parser.add_argument(
        "--no-aux", action="store_true", help="the adaptive variant without its auxiliary peer (bandwidth, client mode)"
    )
    parser.add_argument(
        "--compare-overlap",
        action="store_true",
        help="instead: the adaptive variant with overlap none against delayed-averaging, two trainers on 10 Mbit/s "
        "links (slow1, slow2), no auxiliary peer: do the trainers train faster when averaging runs in the background?",
    )
    parser.add_argument(
        "--allreduce",
        action="store_true",
        help="instead: time plain hivemind all-reduce rounds (no training) under each of swarmhub's adaptations",
    )
    parser.add_argument(
        "--only",
        default=None,
        help="with --allreduce: only the configurations whose name contains this text (e.g. 'adaptive')",
    )
    args = parser.parse_args()
    global WITH_AUX, TRAINERS, VARIANTS
    WITH_AUX = not args.no_aux and not args.compare_overlap
    if args.compare_overlap:
        TRAINERS, VARIANTS = ("slow1", "slow2"), OVERLAPS
    why = net.netns_available()
    if why is not None:
        print(f"error: heterogeneous_network {why}", file=sys.stderr)
        return 2
    mode = QUICK if args.quick else FULL
    print(f"heterogeneous_network ({mode.name}): {c.machine_line()}")
    target = c.sized_target(
        args.target_batch_size, len(TRAINERS), mode.epoch_seconds, mode.hidden_size, mode.batch_size
    )
    mode = dataclasses.replace(
        mode,
        runs=args.runs or mode.runs,
        rounds=args.rounds or mode.rounds,
        max_window=args.max_window or mode.max_window,
        target_batch_size=target,
    )
    exp = experiment(mode)
    print(
        f"workload: {len(TRAINERS)} trainers ({', '.join(TRAINERS)}), digits MLP hidden_size={mode.hidden_size} "
        f"({_mib(mode.hidden_size):.2f} MiB of fp32 "
        f"gradients), batch {mode.batch_size}/step, target_batch_size {mode.target_batch_size}, matchmaking_time "
        f"{exp['matchmaking_time']} s, averaging_timeout {exp['averaging_timeout']} s, one thread each; links "
        + ", ".join(f"{x.role} {x.mbit:g} Mbit/s{' (unreachable)' if x.unreachable else ''}" for x in LINKS)
    )
    started = time.monotonic()
    lab = net.Lab(LINKS)
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    try:
        with c.Harness("hetnet") as h:
            lab.create()
            if lab.stale_removed:
                print(f"removed namespaces a crashed run left behind: {lab.stale_removed}")
            if args.allreduce:
                allreduce_comparison(h, lab, rounds=6 if args.quick else 8, period=10.0, only=args.only)
            url = "" if args.allreduce else start_probe_server(h, lab)
            for run in range(0 if args.allreduce else mode.runs):
                order = VARIANTS if run % 2 == 0 else VARIANTS[::-1]
                for variant in order:
                    with c.phase(f"run {run + 1}/{mode.runs}: {variant}"):
                        if args.compare_overlap:
                            result = run_variant(h, lab, "adaptive", run, mode, url, overlap=variant)
                        else:
                            result = run_variant(h, lab, variant, run, mode, url)
                        results[variant].append(result)
                        print(
                            f"     averaging round time {result['round_time']:.2f} s over {result['rounds']} trainer "
                            f"rounds ({result['failed']} failed), trainers {result['samples_per_second']:,.0f} "
                            f"samples/s, phases (s) {_phases(result['phases'])}"
                        )
            cleanup = h.check_no_leftovers()
    finally:
        left = lab.destroy()
        if lab.killed:
            print(f"warning: killed processes still inside the namespaces: {lab.killed}", file=sys.stderr)
        if left:
            print(f"error: could not delete namespaces {left}", file=sys.stderr)
    ours = [ns for ns in net.list_namespaces() if ns.startswith(lab.tag)]
    if ours:
        raise c.BenchError(f"namespaces left behind: {ours}")
    if args.compare_overlap:
        report_overlap(results)
    elif not args.allreduce:
        report(results, mode, time.monotonic() - started)
    print(f"{cleanup}; namespaces: all {len(LINKS) + 1} deleted")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (c.BenchError, net.LabError, KeyboardInterrupt) as exc:
        print(f"error: {exc or 'interrupted'}", file=sys.stderr)
        sys.exit(1)
