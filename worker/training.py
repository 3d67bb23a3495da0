"""The training loop: one hivemind peer that trains an experiment's task with the swarm.

:func:`train` builds the task's model, joins the swarm's DHT through the server's bootstrap peers, wraps a
torch optimizer in ``hivemind.Optimizer`` (the DeDLOC recipe: accumulate until the swarm has
``target_batch_size`` samples, then average gradients with the peers that are there), and reports progress.
It always leaves the swarm cleanly: ``Optimizer.shutdown()`` then ``DHT.shutdown()``, whatever stops it;
otherwise hivemind leaves four orphan processes (the DHT, ``p2pd`` and two averagers).

It imports torch and hivemind: keep it out of the CLI's import path until a command needs it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import re
import signal
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import torch
from pydantic import ValidationError

from . import load_balancing, robust, swarm_access, witness
from .client import ExitCode, WorkerError
from .optim import Lamb
from .protocol import Control, JoinResponse, MetricReport, OptimizerName, Overlap, SwarmToken, TrainingSettings
from .tasks import Task, TaskData, UnknownTask, get_task

logger = logging.getLogger(__name__)

REPORT_EVERY_SECONDS = 2.0
WITNESS_TRACKER = {"min_refresh_period": 0.2, "max_refresh_period": 1.0, "default_refresh_period": 0.5}
SPEED_WINDOW_SECONDS = 10.0
OPTIMIZER_LOGGER = "hivemind.optim.optimizer"
_AVERAGED_RE = re.compile(r"Averaged gradients with (\d+) peers")
_OPTIMIZERS = {
    OptimizerName.adam: torch.optim.Adam,
    OptimizerName.adamw: torch.optim.AdamW,
    OptimizerName.sgd: torch.optim.SGD,
    OptimizerName.lamb: Lamb,
}


class ReporterLike(Protocol):
    """What the loop needs from :class:`swarmhub.worker.reporter.Reporter`."""

    def report(self, msg: MetricReport) -> None: ...

    @property
    def control(self) -> Control | None: ...

    @property
    def fatal(self) -> WorkerError | None: ...


class StopReason(str, Enum):
    max_steps = "max_steps"
    max_minutes = "max_minutes"
    stop_event = "stop_event"  # Ctrl-C / SIGTERM, or the caller
    control = "control"  # the organizer paused or finished the experiment
    fatal = "fatal"  # the reporter cannot go on (token rejected, worker unknown)


@dataclass(frozen=True)
class Progress:
    """A snapshot for the console line; ``loss`` is the mean over the steps since the previous snapshot."""

    step: int
    samples: int
    epoch: int
    loss: float
    samples_per_second: float
    peers: int
    averaged_peers: int
    elapsed: float


@dataclass
class TrainingSummary:
    steps: int = 0
    samples: int = 0
    epoch: int = 0
    first_loss: float | None = None  # mean loss of the first report window
    last_loss: float | None = None  # mean loss of the last report window
    averaging_rounds: dict[int, int] = field(default_factory=dict)  # group size -> successful rounds
    stop_reason: StopReason = StopReason.max_steps
    control: Control | None = None
    fatal: WorkerError | None = None
    precision: str = "fp32"
    # peer ID -> reason -> count: what this peer refused from others (robust.take_flags)
    flags: dict[str, dict[str, int]] = field(default_factory=dict)


def resolve_precision(name: str, device: torch.device) -> str:
    """The compute precision of the forward and backward passes: ``auto`` is bf16 on a CUDA device that
    supports it, fp16 on other CUDA devices (with hivemind's GradScaler), fp32 on the CPU. Parameters,
    gradients and everything the swarm averages stay fp32 whatever this is, so peers of mixed precision agree."""
    if name == "auto":
        if device.type == "cuda":
            return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        return "fp32"
    if name == "fp16" and device.type != "cuda":
        raise WorkerError("fp16 needs a CUDA device: use --precision bf16 or fp32 on the CPU", ExitCode.USAGE)
    if name not in ("fp32", "bf16", "fp16"):
        raise WorkerError(f"Unknown precision {name!r}: use auto, fp32, bf16 or fp16", ExitCode.USAGE)
    return name


def overlap_options(overlap: Overlap) -> dict[str, Any]:
    """hivemind.Optimizer's delayed-update options for an experiment's ``overlap`` setting."""
    if overlap == Overlap.delayed_averaging:
        return {"offload_optimizer": True, "delay_optimizer_step": True, "delay_grad_averaging": True}
    if overlap == Overlap.delayed_step:
        return {"offload_optimizer": True, "delay_optimizer_step": True}
    return {}


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` is CUDA when available, else the CPU. Asking for CUDA without one is a usage error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise WorkerError("CUDA is not available on this machine: use --device cpu", ExitCode.USAGE)
    try:
        return torch.device(name)
    except RuntimeError:
        raise WorkerError(f"Unknown device {name!r}: use auto, cpu or cuda", ExitCode.USAGE) from None


def optimizer_factory(settings: TrainingSettings) -> Callable[[Any], torch.optim.Optimizer]:
    """hivemind builds the torch optimizer itself (on its offloaded copy of the parameters)."""
    return partial(_OPTIMIZERS[settings.optimizer], lr=settings.learning_rate)


def scheduler_factory(task: Task) -> Callable[[Any], Any] | None:
    """The task's learning-rate schedule as hivemind wants it: a factory, stepped once per collaborative step."""
    schedule = task.lr_schedule()
    return partial(torch.optim.lr_scheduler.LambdaLR, lr_lambda=schedule) if schedule is not None else None


def restart_step_count(opt: Any) -> None:
    """Undo the step that hivemind counts when it creates the optimizer's state.

    ``hivemind.Optimizer`` initialises the statistics with one optimizer step on zero gradients
    (``hivemind.optim.state_averager.initialize_optimizer_state_``). Adam's moments stay zero, but its step counter
    is then one ahead, and its bias correction shrinks the first real updates (x0.74, x0.86, x0.91, ... of plain
    Adam's): ``bench/convergence.py`` measured the swarm behind a single process for that reason. Every new peer
    resets the counter here, before it trains or loads the swarm's state (which brings the swarm's counter along),
    so a swarm follows the same trajectory as plain Adam over the global batch (AdamW too, except that the
    start's one weight decay, a factor 1 - lr * weight_decay on every parameter, stays).
    """
    inner = opt.state_averager.optimizer
    for state in inner.state.values():
        step = state.get("step")
        if torch.is_tensor(step):
            step.zero_()  # in place: hivemind may share this tensor with its averager process
        elif isinstance(step, int | float):
            state["step"] = 0


def load_task(name: str, params: dict[str, Any]) -> Task:
    """The experiment's task, built from its parameters; a task this install lacks is the volunteer's to fix."""
    try:
        return get_task(name)(params)
    except UnknownTask as exc:
        raise WorkerError(
            f"This experiment trains the task {name!r}, which is not installed here ({exc}): install the package "
            "that provides it, or upgrade: pip install -U swarmhub",
            ExitCode.NOT_FOUND,
        ) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "params"
        raise WorkerError(
            f"The experiment's parameters for task {name!r} do not fit the installed version "
            f"({where}: {first['msg']}): upgrade: pip install -U swarmhub",
            ExitCode.ERROR,
        ) from None


def data_seed(worker_id: str) -> int:
    """Each worker run sees the data in its own order."""
    return int.from_bytes(hashlib.sha256(worker_id.encode()).digest()[:4], "big")


class _AveragingWatcher(logging.Handler):
    """Reads the group size of each gradient averaging round from hivemind.Optimizer's status log.

    hivemind has no public counter for it; its status line is the documented trace. With ``verbose=False``
    that line is logged at DEBUG, so the logger is opened to DEBUG while the watcher is attached (the module
    logs nothing else at DEBUG) and restored afterwards. Attached directly: hivemind's loggers may not
    propagate.
    """

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.last_group = 0
        self.rounds: Counter[int] = Counter()
        self._logger = logging.getLogger(OPTIMIZER_LOGGER)
        self._saved_level = logging.NOTSET

    def emit(self, record: logging.LogRecord) -> None:
        match = _AVERAGED_RE.search(record.getMessage())
        if match:
            self.last_group = int(match.group(1))
            self.rounds[self.last_group] += 1

    def __enter__(self) -> _AveragingWatcher:
        self._saved_level = self._logger.level
        if not self._logger.isEnabledFor(logging.DEBUG):
            self._logger.setLevel(logging.DEBUG)
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._saved_level)


@contextlib.contextmanager
def _sigint_handler_kept() -> Iterator[None]:
    """hivemind's averagers set SIGINT to SIG_IGN in the *calling* process when they start (so that their
    children ignore Ctrl-C) and never restore it: without this, Ctrl-C would no longer stop the worker."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def train(
    join: JoinResponse,
    *,
    device: str | torch.device = "auto",
    listen_maddrs: Sequence[str] = ("/ip4/0.0.0.0/tcp/0",),
    announce_maddrs: Sequence[str] | None = None,
    client_mode: bool = False,
    auxiliary: bool = False,
    bandwidth: float | None = None,
    precision: str = "auto",
    max_steps: int | None = None,
    max_minutes: float | None = None,
    reporter: ReporterLike | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    on_joined: Callable[[str, list[str]], None] | None = None,
    stop_event: threading.Event | None = None,
    identity_path: Path,
    fetch_token: Callable[[], SwarmToken] | None = None,
    denied: Callable[[], set[str]] | None = None,
    corpus: TaskData | None = None,
    keeper: Callable[[Any, Task, torch.nn.Module, Callable[[], StopReason | None]], None] | None = None,
) -> TrainingSummary:
    """Train ``join.experiment`` with the swarm until a limit, ``stop_event``, or the server says stop.

    ``corpus`` is the experiment's training text for a task that needs one (``RemoteCorpus`` for a volunteer).
    ``keeper`` replaces training (the server's checkpoint peer): it is called with the hivemind optimizer, the
    task, the model and the stop check once the peer is in the swarm, and before it loads the swarm's state.

    ``identity_path`` is the peer's key (``swarm_access.load_or_create_identity``): the one that
    ``join.swarm_token`` admits. ``fetch_token`` renews that token before it expires; without it the peer
    leaves the swarm's good graces when the first token runs out.

    Reports a :class:`MetricReport` (``seq`` from 0) to ``reporter`` on every swarm epoch change and at
    least every ~2 s, and passes the same numbers to ``on_progress``. Raises :class:`WorkerError` when the
    swarm cannot be reached. Shuts the hivemind peer down before returning or raising.
    """
    import hivemind  # heavy: only when training starts

    from .swarm_optimizer import SwarmOptimizer

    started = time.monotonic()
    deadline = started + max_minutes * 60 if max_minutes is not None else math.inf
    stop_event = stop_event or threading.Event()
    cfg = join.experiment
    torch_device = device if isinstance(device, torch.device) else resolve_device(device)

    task = load_task(cfg.task, cfg.task_params)
    if task.needs_corpus:
        if corpus is None:
            raise WorkerError(
                f"The task {cfg.task!r} trains on the experiment's corpus and the server offered none: "
                "upgrade the server or this worker (pip install -U swarmhub)",
                ExitCode.ERROR,
            )
        task.attach(corpus)
    model = task.build_model().to(torch_device)  # parameters stay fp32 everywhere: the swarm averages one dtype
    batches = task.batches(seed=data_seed(join.worker_id))
    summary = TrainingSummary()
    amp = resolve_precision(precision, torch_device)
    summary.precision = amp

    def should_stop() -> StopReason | None:
        if stop_event.is_set():
            return StopReason.stop_event
        if reporter is not None and reporter.control is not None:
            summary.control = reporter.control
            return StopReason.control
        if reporter is not None and reporter.fatal is not None:
            summary.fatal = reporter.fatal
            return StopReason.fatal
        if max_steps is not None and summary.steps >= max_steps:
            return StopReason.max_steps
        if time.monotonic() >= deadline:
            return StopReason.max_minutes
        return None

    deny_list = swarm_access.DenyList(denied)
    access = _Access(join, identity_path, fetch_token, deny_list)
    dht = opt = None
    roster_stop, roster_keeper = threading.Event(), None
    with _AveragingWatcher() as watcher:
        try:
            try:
                dht = hivemind.DHT(
                    initial_peers=list(join.initial_peers),
                    host_maddrs=list(listen_maddrs),
                    # what other peers dial, when it differs from where this peer listens (NAT, port forwarding)
                    announce_maddrs=list(announce_maddrs) if announce_maddrs else None,
                    client_mode=client_mode,  # a peer others cannot dial: it only makes outgoing connections
                    identity_path=str(identity_path),
                    authorizer=access.authorizer,
                    start=True,
                )
            except Exception as exc:
                logger.exception("could not start the DHT")
                why = " ".join(str(exc).split())[:200] or type(exc).__name__
                raise WorkerError(
                    f"Could not join the swarm ({why}): is the server's swarm port reachable from here? "
                    "check --listen too",
                    ExitCode.UNREACHABLE,
                ) from None
            # before anything is published: the roster entry must be signed by this peer's key
            swarm_access.add_roster_validators(dht, join.run_id, access.key)
            access.keep_published(dht)
            roster_keeper = access.keep_publishing(dht, roster_stop)
            maddrs = [str(m) for m in dht.get_visible_maddrs()]
            logger.info("in the swarm as %s on %s", dht.peer_id, ", ".join(maddrs))
            if on_joined is not None:
                on_joined(str(dht.peer_id), maddrs)
            swarm_access.guard_averaging(access.experiment_key, join.run_id, deny_list)
            load_balancing.install()  # every reachable peer gets a part of the vector to reduce
            # what this peer accepts from the others: averaged parts, the swarm's epoch, downloaded state
            robust.install(
                cfg.aggregation.value,
                cfg.target_batch_size,
                join.run_id,
                access.experiment_key,
                join.username,
                trusted=join.username == swarm_access.SERVER_PEER_USERNAME,
                batch_size=task.batch_size,
            )
            server_witness = None
            if auxiliary and join.username == swarm_access.SERVER_PEER_USERNAME:
                witness.install()  # the server's auxiliary peer records who took part in each round
                server_witness = witness.Witness(
                    dht,
                    join.run_id,
                    access.key.get_public_key().to_bytes(),
                    robust.Roster(dht, join.run_id, access.experiment_key, join.username, deny_list),
                )
            with _sigint_handler_kept():
                opt = SwarmOptimizer(
                    dht=dht,
                    # The witness follows the swarm's epoch as hivemind reads it (a vote it holds back would keep it
                    # out of rounds; its own state is never shared): every other peer reads it through the roster.
                    roster=None
                    if server_witness is not None
                    else robust.Roster(dht, join.run_id, access.experiment_key, join.username, deny_list),
                    run_id=join.run_id,
                    params=list(task.parameter_groups(model)),
                    optimizer=optimizer_factory(cfg),
                    scheduler=scheduler_factory(task),
                    batch_size_per_step=None if auxiliary else task.batch_size,
                    target_batch_size=cfg.target_batch_size,
                    matchmaking_time=cfg.matchmaking_time,
                    averaging_timeout=cfg.averaging_timeout,
                    client_mode=client_mode,
                    auxiliary=auxiliary,
                    # The measured link speed: hivemind gives faster peers a larger part of the vector to reduce.
                    averager_opts={"bandwidth": bandwidth} if bandwidth is not None else None,
                    **overlap_options(cfg.overlap),
                    # The witness reads the swarm's progress every fraction of a second, so that it is in every
                    # round's matchmaking, even with epochs of a few seconds (a round it misses credits no one).
                    tracker_opts=WITNESS_TRACKER if server_witness is not None else None,
                    # Nor does it average state (it holds none worth averaging): a state round would keep it busy
                    # while the next gradient round forms without it.
                    **({"average_state_every": 2**30} if server_witness is not None else {}),
                    verbose=False,
                )
                restart_step_count(opt)
            if keeper is not None:
                keeper(opt, task, model, should_stop)
                return summary
            if auxiliary:
                _assist(
                    opt,
                    summary,
                    should_stop,
                    pause=stop_event.wait,
                    keep_access=lambda: access.keep_published(dht),
                    server_witness=server_witness,
                )
                return summary
            if should_stop() is None:
                opt.load_state_from_peers()  # a late joiner catches up with the swarm's weights and epoch
                opt.refresh_swarm_progress()
            _loop(
                opt,
                task,
                model,
                batches,
                torch_device,
                summary,
                watcher,
                reporter,
                on_progress,
                should_stop,
                pause=stop_event.wait,
                min_epoch_seconds=cfg.matchmaking_time,
                amp=amp,
                keep_access=lambda: access.keep_published(dht),
            )
        finally:
            summary.averaging_rounds = dict(watcher.rounds)
            roster_stop.set()
            try:
                if opt is not None:
                    opt.shutdown()
            finally:
                summary.flags = robust.take_flags()
                if roster_keeper is not None:
                    roster_keeper.join(timeout=10)
                if dht is not None:
                    dht.shutdown()
    return summary


def _assist(
    opt: Any,
    summary: TrainingSummary,
    should_stop: Callable[[], StopReason | None],
    *,
    pause: Callable[[float], Any],
    keep_access: Callable[[], None],
    interval: float = 0.2,
    server_witness: witness.Witness | None = None,
) -> None:
    """An auxiliary peer: no gradients of its own; each ``opt.step()`` joins the swarm's averaging rounds when
    an epoch ends, lending this machine's bandwidth to the all-reduce. The server's auxiliary peer also
    publishes the rounds it saw complete (``server_witness``)."""
    last_report = time.monotonic()
    while (reason := should_stop()) is None:
        epoch = opt.local_epoch
        if server_witness is not None:
            try:
                server_witness.keep_present(opt.tracker)
            except Exception as exc:
                logger.warning("could not publish the witness's progress record: %r", exc)
            _witness_one_round(opt, should_stop, pause)
            try:
                server_witness.publish(opt.tracker.global_epoch)
            except Exception as exc:  # the peer keeps averaging whatever the DHT does
                logger.warning("could not publish the witnessed rounds: %r", exc)
        else:
            opt.step()
        summary.epoch = max(opt.local_epoch, epoch)
        if time.monotonic() - last_report >= REPORT_EVERY_SECONDS:
            keep_access()
            last_report = time.monotonic()
        pause(interval)
    summary.stop_reason = reason


def _witness_one_round(opt: Any, should_stop: Callable[[], StopReason | None], pause: Callable[[float], Any]) -> None:
    """The server's witness: look for the next gradient averaging group at once and take part in its round as a
    reducer (weight 0). It computes nothing, so unlike ``opt.step()`` it never waits for its own (lagging) estimate
    of the epoch's end: it is in matchmaking whenever a round forms, and a round it misses credits no one."""
    if opt.tracker.global_progress.num_peers <= 1:
        pause(0.5)  # no one to average with
        return
    try:
        control = opt.grad_averager.step(wait=False, timeout=opt.averaging_timeout)
    except Exception as exc:
        logger.warning("could not join an averaging round: %r", exc)
        pause(1.0)
        return
    while not control.done():
        if should_stop() is not None:
            control.cancel()
            return
        pause(0.05)
    if control.exception() is not None:  # no group this time (hivemind logs why)
        pause(0.1)


class _Access:
    """This peer's admission to the swarm: the DHT authorizer (which runs in hivemind's DHT process and
    renews its own token) and the roster entry that lets other peers' averagers talk to us (renewed here)."""

    def __init__(
        self,
        join: JoinResponse,
        identity_path: Path,
        fetch_token: Callable[[], SwarmToken] | None,
        deny_list: swarm_access.DenyList,
    ):
        self.run_id = join.run_id
        self.key = swarm_access.load_or_create_identity(identity_path)
        swarm_access.use_as_process_key(self.key)  # progress records are signed with the key the token admits
        self.experiment_key = swarm_access.public_key_from_text(join.experiment_public_key)
        self.token = swarm_access.token_from_wire(join.swarm_token.model_dump())
        expires = swarm_access.parse_expiry(self.token.expiration_time)
        lifetime = (expires - datetime.now(timezone.utc)) if expires else swarm_access.REFRESH_MARGIN
        self.margin = min(swarm_access.REFRESH_MARGIN, lifetime / 4)
        self._fetch_token = fetch_token
        self._published: str | None = None
        self._lock = threading.Lock()
        self.authorizer = swarm_access.SwarmAuthorizer(
            self.key,
            self.experiment_key,
            self.run_id,
            self.fetch,
            first_token=self.token,
            refresh_margin=self.margin,
            denied=deny_list,
        )

    def fetch(self) -> Any:
        if self._fetch_token is not None:
            try:
                self.token = swarm_access.token_from_wire(self._fetch_token().model_dump())
            except Exception as exc:  # the server is unreachable for now: the current token may still serve
                logger.warning("could not renew the swarm token: %s", getattr(exc, "message", exc))
        return self.token

    def keep_published(self, dht: Any) -> None:
        """Renew the token when it nears expiry and (re)publish it on the roster; cheap when nothing is due."""
        with self._lock:
            if self.authorizer.does_token_need_refreshing(self.token):
                self.fetch()
            if self._published != self.token.signature:
                if swarm_access.publish_roster_entry(dht, self.run_id, self.token):
                    self._published = self.token.signature

    def keep_publishing(self, dht: Any, stop: threading.Event) -> threading.Thread:
        """Keep the token and roster entry current in the background until ``stop``: a training step can block
        as long as an averaging round lasts, and a roster entry that expires meanwhile makes the other peers
        refuse this one, so that the next round fails too."""
        interval = max(min(5.0, self.margin.total_seconds() / 2), 0.5)

        def run() -> None:
            while not stop.wait(interval):
                try:
                    self.keep_published(dht)
                except Exception as exc:
                    logger.warning("could not renew this peer's roster entry: %r", exc)

        thread = threading.Thread(target=run, daemon=True, name="swarmhub-roster")
        thread.start()
        return thread


def _loop(
    opt: Any,
    task: Any,
    model: torch.nn.Module,
    batches: Any,
    device: torch.device,
    summary: TrainingSummary,
    watcher: _AveragingWatcher,
    reporter: ReporterLike | None,
    on_progress: Callable[[Progress], None] | None,
    should_stop: Callable[[], StopReason | None],
    *,
    pause: Callable[[float], Any],
    min_epoch_seconds: float,
    keep_access: Callable[[], None] = lambda: None,
    amp: str = "fp32",
) -> None:
    started = time.monotonic()
    autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)
    # fp16: PyTorch's own scaler. It unscales the model's gradients before hivemind accumulates them (hivemind's
    # GradScaler is only for reuse_grad_buffers=True, which this loop does not use) and skips overflowed batches.
    scaler = torch.amp.GradScaler(device.type) if amp == "fp16" else None
    last_epoch_change = started
    seq = 0
    window_losses: list[float] = []
    window_start = started
    # (time, samples) at each report: the speed is measured over the last SPEED_WINDOW_SECONDS, never over
    # one short window (a step right after an averaging round would read as a burst of thousands per second).
    history: deque[tuple[float, int]] = deque([(started, 0)])
    last_epoch = opt.local_epoch
    summary.epoch = last_epoch

    def publish(now: float) -> None:
        nonlocal seq, window_losses, window_start
        keep_access()
        if not window_losses:
            return
        loss = sum(window_losses) / len(window_losses)
        history.append((now, summary.samples))
        while len(history) > 2 and now - history[1][0] >= SPEED_WINDOW_SECONDS:
            history.popleft()
        since, samples_then = history[0]
        speed = (summary.samples - samples_then) / max(now - since, 1e-3)
        window_losses, window_start = [], now
        if not math.isfinite(loss):
            logger.warning("non-finite loss %r at step %d: not reported", loss, summary.steps)
            return
        if summary.first_loss is None:
            summary.first_loss = loss
        summary.last_loss = loss
        peers = max(opt.tracker.global_progress.num_peers, 1)  # this peer, before the tracker has seen it
        progress = Progress(
            step=summary.steps,
            samples=summary.samples,
            epoch=summary.epoch,
            loss=loss,
            samples_per_second=speed,
            peers=peers,
            averaged_peers=watcher.last_group,
            elapsed=now - started,
        )
        if reporter is not None:
            reporter.report(
                MetricReport(
                    seq=seq,
                    step=progress.step,
                    epoch=progress.epoch,
                    samples=progress.samples,
                    loss=loss,
                    samples_per_second=min(speed, 1e9),
                    peers=peers,
                    averaged_peers=progress.averaged_peers,
                )
            )
            seq += 1
        if on_progress is not None:
            on_progress(progress)

    model.train()
    while (reason := should_stop()) is None:
        batch = next(batches)
        with torch.autocast(device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            loss = task.loss(model, batch, device)
        if scaler is not None:  # fp16: scale the loss so that small gradients survive the backward pass
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        opt.zero_grad()
        summary.steps += 1
        summary.samples += task.batch_size
        window_losses.append(float(loss.detach()))
        summary.epoch = opt.local_epoch
        now = time.monotonic()
        if summary.epoch != last_epoch or now - window_start >= REPORT_EVERY_SECONDS:
            if summary.epoch != last_epoch:
                # hivemind schedules each averaging round `matchmaking_time` before an epoch ends. Epochs
                # shorter than that (a tiny model, or a peer that believes it is alone) cancel rounds as fast
                # as they are scheduled, which wedges hivemind 1.1.12's matchmaking for good ("aclose():
                # asynchronous generator is already running", then every round fails). Real workloads
                # never wait here.
                pause(max(last_epoch_change + min_epoch_seconds - now, 0.0))
                last_epoch_change = now = time.monotonic()
            last_epoch = summary.epoch
            publish(now)
    summary.stop_reason = reason
    publish(time.monotonic())  # the last partial window
