"""The loops a peer runs once it is in the swarm, and the records they keep.

:func:`trainer_loop` trains: forward, backward and ``opt.step()`` on each batch, with a :class:`MetricReport` to the
reporter and a :class:`Progress` to the console on every swarm epoch change and at least every ~2 s.
:func:`assist_loop` is an auxiliary peer's loop: no gradients of its own, only the swarm's averaging rounds (and the
server's witness records). Both run until ``should_stop`` gives a :class:`StopReason`, and fill the
:class:`TrainingSummary` that :func:`swarmhub.worker.training.peer.train` returns.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

import torch

from swarmhub.common.protocol import Control, MetricReport
from swarmhub.worker.client import WorkerError
from swarmhub.worker.swarm import matchmaking, witness

# Logged under the training module's name: one logger for everything `train` runs.
logger = logging.getLogger("swarmhub.worker.training.peer")

REPORT_EVERY_SECONDS = 2.0
SPEED_WINDOW_SECONDS = 10.0
# The server's witness declares its rounds at this fraction of the averaging timeout from the start of its search
WITNESS_DECLARES_AT = 0.9
OPTIMIZER_LOGGER = "hivemind.optim.optimizer"
_AVERAGED_RE = re.compile(r"Averaged gradients with (\d+) peers")


class ReporterLike(Protocol):
    """What the loop needs from :class:`swarmhub.worker.join.reporter.Reporter`."""

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
    overlap: str = "none"  # what this peer trained with (the experiment's, or its own choice under "auto")
    # peer ID -> reason -> count: what this peer refused from others (robust.take_flags)
    flags: dict[str, dict[str, int]] = field(default_factory=dict)


class AveragingWatcher(logging.Handler):
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

    def __enter__(self) -> AveragingWatcher:
        self._saved_level = self._logger.level
        if not self._logger.isEnabledFor(logging.DEBUG):
            self._logger.setLevel(logging.DEBUG)
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._saved_level)


def assist_loop(
    opt: Any,
    summary: TrainingSummary,
    should_stop: Callable[[], StopReason | None],
    *,
    pause: Callable[[float], Any],
    keep_access: Callable[[], None],
    interval: float = 0.2,
    server_witness: witness.Witness | None = None,
) -> None:
    """An auxiliary peer: no gradients of its own; it joins every gradient averaging round (``_join_one_round``),
    lending this machine's bandwidth to the all-reduce. The server's auxiliary peer also publishes the rounds it
    saw complete (``server_witness``).

    It does not wait for its own estimate of the epoch's end, as ``opt.step()`` would: that estimate lags the
    trainers' (an auxiliary peer reads the swarm's progress, it does not make it), and the trainers of a round wait
    for every reducer's part, the auxiliary peer's (the largest, on a fast link) included
    (docs/benchmarks/heterogeneous-network.md)."""
    last_report = time.monotonic()
    while (reason := should_stop()) is None:
        epoch = opt.local_epoch
        if server_witness is not None:
            try:
                server_witness.keep_present(opt.tracker)
            except Exception as exc:
                logger.warning("could not publish the witness's progress record: %r", exc)
        # The witness looks for a group at once, every time: it credits only the rounds it is in, and the swarm's
        # estimated end of the epoch comes from records a forger can publish (an epoch ahead, at a crawl, would
        # keep it waiting while the honest volunteers' rounds go unwitnessed).
        _join_one_round(opt, should_stop, pause, when_due=server_witness is None)
        if server_witness is not None:
            try:
                server_witness.publish(opt.tracker.global_epoch)
            except Exception as exc:  # the peer keeps averaging whatever the DHT does
                logger.warning("could not publish the witnessed rounds: %r", exc)
        summary.epoch = max(opt.local_epoch, epoch)
        if time.monotonic() - last_report >= REPORT_EVERY_SECONDS:
            keep_access()
            last_report = time.monotonic()
        pause(interval)
    summary.stop_reason = reason


def _join_one_round(
    opt: Any, should_stop: Callable[[], StopReason | None], pause: Callable[[float], Any], *, when_due: bool = True
) -> None:
    """An auxiliary peer: take part in the swarm's next gradient averaging round as a reducer (weight 0).

    It computes nothing, so it does not step like a trainer (``opt.step()`` would wait for its own estimate of the
    epoch's end, which lags the trainers': an auxiliary peer reads the swarm's progress, it does not make it). It
    starts looking for a group ``matchmaking_time`` before the swarm's estimated end of the epoch (the trainers'
    records: each one's count plus its rate since), as hivemind's trainers pre-schedule theirs, declares that
    moment as the round's time, and is ready the moment its group is. ``when_due=False`` (the server's witness)
    looks for a group at once, whatever the estimate says."""
    from hivemind.utils import get_dht_time

    progress = opt.tracker.global_progress
    if progress.num_peers <= 1:
        pause(0.5)  # no one to average with
        return
    now = get_dht_time()
    lead = opt.grad_averager.matchmaking_kwargs["min_matchmaking_time"]
    eta = now if progress.samples_accumulated >= progress.target_batch_size else progress.eta_next_epoch
    if not when_due or not math.isfinite(eta):
        eta = now  # look for a group now (with no estimate yet, as the trainers' first rounds do)
    if eta - now > lead:
        pause(min(eta - now - lead, 0.5))  # too early: read the swarm's progress again first
        return
    # The server's witness declares its round as late as its search allows: it is then the last leader any trainer
    # would join, so it joins the trainers' groups (where their leaders wait for the whole expected group,
    # ``matchmaking.expect_group``) instead of leading one of whoever is looking early, which would begin at its time.
    latest = now + opt.averaging_timeout * WITNESS_DECLARES_AT
    if when_due and matchmaking.group_size() > 0:
        opt._expect_group()  # a volunteer's auxiliary peer is dealt a group as a trainer is (a witness has its own)
    try:
        control = opt.grad_averager.step(
            wait=False,
            timeout=opt.averaging_timeout,
            scheduled_time=latest if not when_due else min(max(eta, now + lead), now + opt.averaging_timeout / 2),
        )
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


def trainer_loop(
    opt: Any,
    task: Any,
    model: torch.nn.Module,
    batches: Any,
    device: torch.device,
    summary: TrainingSummary,
    watcher: AveragingWatcher,
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
    # The window's losses summed on the model's device: read back (on a GPU, a wait for every queued kernel) once
    # per report, not once per step.
    window_loss: torch.Tensor | None = None
    window_steps = 0
    window_start = started
    # (time, samples) at each report: the speed is measured over the last SPEED_WINDOW_SECONDS, never over
    # one short window (a step right after an averaging round would read as a burst of thousands per second).
    history: deque[tuple[float, int]] = deque([(started, 0)])
    last_epoch = opt.local_epoch
    summary.epoch = last_epoch

    def publish(now: float) -> None:
        nonlocal seq, window_loss, window_steps, window_start
        keep_access()
        if window_loss is None or not window_steps:
            return
        loss = float(window_loss) / window_steps
        history.append((now, summary.samples))
        while len(history) > 2 and now - history[1][0] >= SPEED_WINDOW_SECONDS:
            history.popleft()
        since, samples_then = history[0]
        speed = (summary.samples - samples_then) / max(now - since, 1e-3)
        window_loss, window_steps, window_start = None, 0, now
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
        step_loss = loss.detach().float()
        window_loss = step_loss if window_loss is None else window_loss + step_loss
        window_steps += 1
        summary.epoch = opt.local_epoch
        now = time.monotonic()
        if summary.epoch != last_epoch or now - window_start >= REPORT_EVERY_SECONDS:
            if summary.epoch != last_epoch:
                # hivemind schedules each averaging round `matchmaking_time` before an epoch ends. Epochs
                # shorter than that (a tiny model, or a peer that believes it is alone) cancel rounds as fast
                # as they are scheduled, which wedges hivemind 1.1.12's matchmaking for good ("aclose():
                # asynchronous generator is already running", then every round fails). Real workloads
                # never wait here.
                # Not training time: the rate this peer publishes (hivemind's performance EMA, which the other
                # peers extrapolate its count with) must not count the wait, or they underestimate its samples
                # and the swarm overshoots its target batch.
                wait = max(last_epoch_change + min_epoch_seconds - now, 0.0)
                if wait > 0:
                    with opt.tracker.performance_ema.pause():
                        pause(wait)
                    # and its record and the ETA must not count the wait as training either (a lone peer's
                    # next epoch ended after a step or two: it trained at a fraction of its rate)
                    resume = getattr(opt.tracker, "resume_after_wait", None)
                    if resume is not None:
                        resume()
                last_epoch_change = now = time.monotonic()
            last_epoch = summary.epoch
            publish(now)
    summary.stop_reason = reason
    publish(time.monotonic())  # the last partial window
