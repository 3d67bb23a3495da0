"""Pre-flight checks: what this machine can give a swarm, and what to fix before it joins.

``swarmhub doctor [SLUG]`` prints every finding with the fix for what fails; ``swarmhub join`` runs the ones
that change how it joins (clock, open files, reachability) on its own. Each check is a function that returns
a :class:`Finding`; none raises for a machine problem, only for an unreachable server or a bad login.
"""

from __future__ import annotations

import contextlib
import logging
import resource
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from swarmhub.common.platforms import describe, platform_problem
from swarmhub.common.proposal import swarm_rate_cap, unthrottled_batch
from swarmhub.common.protocol import ExperimentDetail
from swarmhub.worker.client import MAX_CLOCK_SKEW_SECONDS, ApiClient, WorkerError

logger = logging.getLogger(__name__)

OK, WARN, FAIL = "ok", "warn", "FAIL"
WANTED_OPEN_FILES = 4096  # hivemind keeps a connection (and its p2pd streams) per peer
PROBE_BYTES = 4 * 2**20
SLOW_LINK_MBPS = 10.0


@dataclass
class Finding:
    name: str
    status: str  # OK, WARN or FAIL
    detail: str
    fix: str = ""

    def line(self) -> str:
        fix = f" -> {self.fix}" if self.fix and self.status != OK else ""
        return f"[{self.status:>4}] {self.name}: {self.detail}{fix}"


def precision(device: torch.device) -> str:
    """The compute precision a device supports best for training."""
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "fp32"


def check_platform(system: str | None = None, machine: str | None = None, release: str | None = None) -> Finding:
    """Whether the worker runs here at all (``platforms``); arguments default to this machine's."""
    where = describe(system, machine, release)
    problem = platform_problem(system, machine)
    if problem is None:
        return Finding("platform", OK, where)
    return Finding("platform", FAIL, f"{where}: {problem[0]}", problem[1])


def check_device(device: torch.device) -> Finding:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return Finding("device", OK, f"{device} ({name}), supports {precision(device)}")
    fix = "" if not torch.cuda.is_available() else "use --device cuda"
    gpu = "no CUDA GPU found" if not torch.cuda.is_available() else "a CUDA GPU is available"
    return Finding("device", OK, f"cpu, {torch.get_num_threads()} threads, fp32 ({gpu})", fix)


def check_throughput(
    experiment: ExperimentDetail, device: torch.device, seconds: float = 5.0, corpus: Callable[[], Any] | None = None
) -> Finding:
    """A few timed training steps of the experiment's task on this device (forward and backward). ``corpus``
    gives the experiment's training text, for a task that trains on one (it is downloaded, as `join` would)."""
    from swarmhub.worker.training.peer import load_task

    try:
        task = load_task(experiment.task, experiment.task_params)
    except WorkerError as exc:
        return Finding("throughput", FAIL, exc.message)
    if task.needs_corpus:
        try:
            if corpus is None:
                raise WorkerError("it trains on the experiment's text")
            task.attach(corpus())
        except WorkerError as exc:  # a draft or paused experiment serves no text yet
            return Finding("throughput", WARN, f"not measured: {exc.message}", "run it again once the experiment runs")
    model = task.build_model().to(device)
    batches = task.batches(seed=0)
    steps, started = 0, None
    for index in range(1000):
        if index == 2:  # the first steps warm up allocators and kernels
            started = time.perf_counter()
        loss = task.loss(model, next(batches), device)
        loss.backward()
        model.zero_grad(set_to_none=True)
        if started is not None:
            steps += 1
            if time.perf_counter() - started >= seconds or steps >= 50:
                break
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - (started or time.perf_counter())
    rate = steps * task.batch_size / max(elapsed, 1e-9)
    measured = f"{rate:,.0f} samples/s on {experiment.task!r} ({steps} timed steps)"
    target, matchmaking = experiment.target_batch_size, experiment.matchmaking_time  # None from an older server
    if target and matchmaking and rate > (cap := swarm_rate_cap(target, matchmaking)):
        return Finding(
            "throughput",
            WARN,
            f"{measured}, but the experiment's settings let the whole swarm train at most {cap:,.0f} samples/s "
            f"(a target batch of {target:,} per matchmaking time of {matchmaking:g} s): this machine alone would "
            "spend most of its time waiting",
            f"ask the organizer to raise the target batch size to at least {unthrottled_batch(rate, matchmaking):,}",
        )
    return Finding("throughput", OK, measured)


def check_clock(client: ApiClient) -> Finding:
    sent = time.time()
    info = client.probe()
    skew = (sent + time.time()) / 2 - info.server_time
    if abs(skew) > MAX_CLOCK_SKEW_SECONDS:
        return Finding(
            "clock",
            FAIL,
            f"{abs(skew):.0f} s {'ahead of' if skew > 0 else 'behind'} the server's"
            " (tokens and records expire by each peer's clock)",
            "turn on automatic time sync, for example `sudo timedatectl set-ntp true`",
        )
    return Finding("clock", OK, f"{abs(skew):.1f} s off the server's")


def measure_links(client: ApiClient, size: int = PROBE_BYTES) -> tuple[float, float]:
    """(download, upload) Mbit/s to the server."""
    started = time.perf_counter()
    received = client.download_probe(size)
    down = received * 8 / 1e6 / max(time.perf_counter() - started, 1e-9)
    started = time.perf_counter()
    client.upload_probe(size)
    up = size * 8 / 1e6 / max(time.perf_counter() - started, 1e-9)
    return down, up


def measure_bandwidth(client: ApiClient, size: int = 2**21) -> float | None:
    """This peer's bandwidth for hivemind's load balancing (Mbit/s, the slower direction), or None when the
    server cannot be probed: hivemind then assumes the group's average."""
    try:
        return round(min(measure_links(client, size)), 3)
    except WorkerError as exc:
        logger.warning("could not measure bandwidth: %s", exc.message)
        return None


def check_bandwidth(client: ApiClient, size: int = PROBE_BYTES) -> Finding:
    down, up = measure_links(client, size)
    detail = f"download {down:,.0f} Mbit/s, upload {up:,.0f} Mbit/s to the server"
    if min(up, down) < SLOW_LINK_MBPS:
        return Finding(
            "bandwidth",
            WARN,
            detail,
            "averaging waits on slow links: prefer a wired connection, or train where the link is faster",
        )
    return Finding("bandwidth", OK, detail)


def open_files_limit() -> tuple[int, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft, hard


def raise_open_files_limit() -> int:
    """Raise this process's soft limit towards WANTED_OPEN_FILES (never above the hard limit)."""
    soft, hard = open_files_limit()
    wanted = WANTED_OPEN_FILES if hard == resource.RLIM_INFINITY else min(WANTED_OPEN_FILES, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return open_files_limit()[0]


def check_open_files() -> Finding:
    soft, hard = open_files_limit()
    if soft != resource.RLIM_INFINITY and soft < WANTED_OPEN_FILES:
        if hard == resource.RLIM_INFINITY or hard >= WANTED_OPEN_FILES:
            return Finding("open files", OK, f"limit {soft} (join raises it to {WANTED_OPEN_FILES} by itself)")
        return Finding(
            "open files",
            WARN,
            f"limit {soft}, at most {hard}: a large swarm needs about {WANTED_OPEN_FILES}",
            f"raise the hard limit (`ulimit -Hn {WANTED_OPEN_FILES}` as root, or nofile in limits.conf)",
        )
    return Finding("open files", OK, f"limit {'unlimited' if soft == resource.RLIM_INFINITY else soft}")


def _parse_tcp(maddr: str) -> tuple[str, str, int] | None:
    parts = maddr.strip("/").split("/")
    if len(parts) >= 4 and parts[0] in ("ip4", "ip6") and parts[2] == "tcp" and parts[3].isdigit():
        return parts[0], parts[1], int(parts[3])
    return None


@contextlib.contextmanager
def listening(maddrs: Sequence[str]) -> Iterator[list[str]]:
    """Listen on each TCP multiaddr (port 0 picks a free port) and accept connections while inside;
    yields the multiaddrs with their actual ports. The sockets close on exit (hivemind then binds them)."""
    sockets: list[socket.socket] = []
    bound: list[str] = []
    stop = threading.Event()
    try:
        for maddr in maddrs:
            parsed = _parse_tcp(maddr)
            if parsed is None:
                continue
            proto, host, port = parsed
            sock = socket.socket(socket.AF_INET6 if proto == "ip6" else socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError:
                sock.close()
                continue
            sock.listen(8)
            sock.settimeout(0.2)
            sockets.append(sock)
            bound.append(f"/{proto}/{host}/tcp/{sock.getsockname()[1]}")

        def accept(sock: socket.socket) -> None:
            while not stop.is_set():
                try:
                    conn, _ = sock.accept()
                    conn.close()
                except TimeoutError:
                    continue
                except OSError:
                    return

        for sock in sockets:
            threading.Thread(target=accept, args=(sock,), daemon=True).start()
        yield bound
    finally:
        stop.set()
        for sock in sockets:
            sock.close()


def check_reachability(client: ApiClient, listen: Sequence[str]) -> tuple[Finding, list[str]]:
    """Can the server (and so other peers) dial this machine? Returns the finding and the addresses that
    were probed, with their ports fixed, for hivemind to listen on."""
    with listening(listen) as bound:
        if not bound:
            return (
                Finding("reachability", WARN, f"cannot listen on {', '.join(listen)}", "check --listen"),
                list(listen),
            )
        try:
            result = client.reachability(bound)
        except WorkerError as exc:
            return Finding("reachability", WARN, f"not probed ({exc.message})", "client mode is used"), bound
    if result.reachable:
        dialed = ", ".join(r.dialed for r in result.results if r.ok and r.dialed)
        return Finding("reachability", OK, f"the server dialed {dialed}: other peers can connect to you"), bound
    why = "; ".join(f"{r.dialed or r.maddr}: {r.error}" for r in result.results)
    return (
        Finding(
            "reachability",
            WARN,
            f"the server could not dial back ({why}): you join in client mode, which trains and averages "
            "through peers that are reachable",
            "to help others average too, forward the TCP port to this machine and pass --listen /ip4/0.0.0.0/tcp/PORT",
        ),
        bound,
    )


def worst(findings: Sequence[Finding]) -> str:
    order = {OK: 0, WARN: 1, FAIL: 2}
    return max((f.status for f in findings), key=order.__getitem__, default=OK)


def run_all(
    client: ApiClient,
    token: str | None,
    settings: Any,
    slug: str | None,
    device: torch.device,
    listen: Sequence[str],
    echo: Callable[[str], None],
) -> bool:
    """Every check of ``swarmhub doctor``, each line echoed as it is found, then what to do next; True when
    something must be fixed before joining. With ``slug``, the experiment's training throughput here too, on its
    corpus downloaded as ``join`` downloads it."""
    from swarmhub.worker.tasks.data import corpus_of

    experiment = client.experiment(slug) if slug is not None else None
    echo(f"Checking this machine for {client.server_url}" + (f" and {slug!r}" if slug else "") + ":")

    def text() -> Any:
        assert slug is not None and token is not None
        return corpus_of(client.server_url, token, slug, settings.corpus_dir(client.server_url, slug))

    checks: list[Callable[[], Finding]] = [
        lambda: check_device(device),
        check_open_files,
        lambda: check_clock(client),
        lambda: check_bandwidth(client),
        lambda: check_reachability(client, listen)[0],
    ]
    if experiment is not None:
        checks.append(lambda: check_throughput(experiment, device, corpus=text))
    findings = [check_platform()]
    echo(findings[0].line())
    if findings[0].status == FAIL:  # nothing else here can train
        checks = []
    for check in checks:
        findings.append(check())
        echo(findings[-1].line())
    failed = worst(findings) == FAIL
    echo("Fix what failed above, then run `swarmhub doctor` again." if failed else "Ready to join.")
    return failed
