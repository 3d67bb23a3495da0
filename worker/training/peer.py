"""The training loop: one hivemind peer that trains an experiment's task with the swarm.

:func:`train` builds the task's model, joins the swarm's DHT through the server's bootstrap peers, wraps a
torch optimizer in ``hivemind.Optimizer`` (the DeDLOC recipe: accumulate until the swarm has
``target_batch_size`` samples, then average gradients with the peers that are there), and reports progress.
It always leaves the swarm cleanly: ``Optimizer.shutdown()`` then ``DHT.shutdown()``, whatever stops it;
otherwise hivemind leaves four orphan processes (the DHT, ``p2pd`` and two averagers).

The loops it runs once in the swarm, and the records they keep (:class:`TrainingSummary`, :class:`Progress`,
:class:`StopReason`, also importable from here), are in :mod:`swarmhub.worker.training.loop`; the peer's
admission (its swarm token and roster entry, kept current) is in :mod:`swarmhub.worker.training.access`.

It imports torch and hivemind: keep it out of the CLI's import path until a command needs it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from swarmhub.common.protocol import JoinResponse, OptimizerName, SwarmToken, TrainingSettings
from swarmhub.worker.client import ExitCode, WorkerError
from swarmhub.worker.swarm import access as swarm_access
from swarmhub.worker.swarm import epoch as swarm_epoch
from swarmhub.worker.swarm import load_balancing, matchmaking, robust, witness
from swarmhub.worker.tasks import Task, TaskData, UnknownTask, get_task
from swarmhub.worker.training.access import PeerAccess
from swarmhub.worker.training.lamb import Lamb
from swarmhub.worker.training.lars import Lars
from swarmhub.worker.training.loop import OPTIMIZER_LOGGER as OPTIMIZER_LOGGER
from swarmhub.worker.training.loop import AveragingWatcher, ReporterLike, StopReason, assist_loop, trainer_loop
from swarmhub.worker.training.loop import Progress as Progress
from swarmhub.worker.training.loop import TrainingSummary as TrainingSummary
from swarmhub.worker.training.overlap import choose_overlap, overlap_options

logger = logging.getLogger(__name__)

WITNESS_TRACKER = {"min_refresh_period": 0.2, "max_refresh_period": 1.0, "default_refresh_period": 0.5}
_OPTIMIZERS = {
    OptimizerName.adam: torch.optim.Adam,
    OptimizerName.adamw: torch.optim.AdamW,
    OptimizerName.sgd: torch.optim.SGD,
    OptimizerName.lamb: Lamb,
    OptimizerName.lars: Lars,
}


def resolve_precision(name: str, device: torch.device) -> str:
    """The compute precision of the forward and backward passes: ``auto`` is bf16 on a CUDA device that
    supports it, fp16 on other CUDA devices (with PyTorch's GradScaler, in the training loop), fp32 on the CPU.
    Parameters, gradients and everything the swarm averages stay fp32 whatever this is, so peers of mixed precision
    agree."""
    if name == "auto":
        if device.type == "cuda":
            return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        return "fp32"
    if name == "fp16" and device.type != "cuda":
        raise WorkerError("fp16 needs a CUDA device: use --precision bf16 or fp32 on the CPU", ExitCode.USAGE)
    if name not in ("fp32", "bf16", "fp16"):
        raise WorkerError(f"Unknown precision {name!r}: use auto, fp32, bf16 or fp16", ExitCode.USAGE)
    return name


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
    resets the counter here, before it trains or loads the swarm's state (which brings the server peer's counter
    along; from a volunteer's peer this one is kept: ``SwarmStateAverager.load_state_from_peers``), so a swarm
    follows the same trajectory as plain Adam over the global batch (AdamW too, except that the start's one weight
    decay, a factor 1 - lr * weight_decay on every parameter, stays).
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
            f"This experiment trains the task {name!r}, which is not installed here ({exc}): pip install the package "
            "that provides it, or upgrade to the worker the hub serves: swarmhub upgrade",
            ExitCode.NOT_FOUND,
        ) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "params"
        raise WorkerError(
            f"The experiment's parameters for task {name!r} do not fit the installed version "
            f"({where}: {first['msg']}): upgrade: swarmhub upgrade",
            ExitCode.ERROR,
        ) from None


def data_seed(worker_id: str) -> int:
    """Each worker run sees the data in its own order."""
    return int.from_bytes(hashlib.sha256(worker_id.encode()).digest()[:4], "big")


def initial_model(task: Task, run_id: str) -> torch.nn.Module:
    """The task's model with the run's initial weights: every peer of one run (seeded from the run ID) builds the
    same model, so peers that start together, before any of them has a state to share, train one model from the
    first step instead of averaging different random ones. The caller's random state is left as it was."""
    seed = int.from_bytes(hashlib.sha256(f"model:{run_id}".encode()).digest()[:8], "big")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return task.build_model()


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
    witness_index: int = 0,
) -> TrainingSummary:
    """Train ``join.experiment`` with the swarm until a limit, ``stop_event``, or the server says stop.

    ``corpus`` is the experiment's training text for a task that needs one (``RemoteCorpus`` for a volunteer).
    ``keeper`` replaces training (the server's checkpoint peer): it is called with the hivemind optimizer, the
    task, the model and the stop check once the peer is in the swarm, and before it loads the swarm's state.
    ``witness_index``: the server's witness's number (with averaging groups, the dealt group it joins).

    ``identity_path`` is the peer's key (``swarm_access.load_or_create_identity``): the one that
    ``join.swarm_token`` admits. ``fetch_token`` renews that token before it expires; without it the peer
    leaves the swarm's good graces when the first token runs out.

    Reports a :class:`MetricReport` (``seq`` from 0) to ``reporter`` on every swarm epoch change and at
    least every ~2 s, and passes the same numbers to ``on_progress``. Raises :class:`WorkerError` when the
    swarm cannot be reached. Shuts the hivemind peer down before returning or raising.
    """
    import hivemind  # heavy: only when training starts

    from swarmhub.worker.training.optimizer import SwarmOptimizer

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
                "upgrade the server or this worker (swarmhub upgrade)",
                ExitCode.ERROR,
            )
        task.attach(corpus)
    # parameters stay fp32 everywhere: the swarm averages one dtype
    model = initial_model(task, join.run_id).to(torch_device)
    batches = task.batches(seed=data_seed(join.worker_id))
    summary = TrainingSummary()
    amp = resolve_precision(precision, torch_device)
    summary.precision = amp
    parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    overlap = choose_overlap(cfg.overlap, torch_device, parameters=parameters, bandwidth=bandwidth, auxiliary=auxiliary)
    summary.overlap = overlap.value
    chosen = f" (the experiment's {cfg.overlap.value})" if overlap != cfg.overlap else ""
    logger.info("training on %s, precision %s, overlap %s%s", torch_device, amp, overlap.value, chosen)

    deny_list = swarm_access.DenyList(denied)
    access = PeerAccess(join, identity_path, fetch_token, deny_list)

    def should_stop() -> StopReason | None:
        if stop_event.is_set():
            return StopReason.stop_event
        if reporter is not None and reporter.control is not None:
            summary.control = reporter.control
            return StopReason.control
        if reporter is not None and reporter.fatal is not None:
            summary.fatal = reporter.fatal
            return StopReason.fatal
        refused = access.refused or deny_list.refused  # the server refuses this worker for good (FINAL_REFUSALS)
        if refused is not None:
            summary.fatal = refused
            return StopReason.fatal
        if max_steps is not None and summary.steps >= max_steps:
            return StopReason.max_steps
        if time.monotonic() >= deadline:
            return StopReason.max_minutes
        return None

    dht = opt = None
    roster_stop, roster_keeper = threading.Event(), None
    with AveragingWatcher() as watcher:
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
            # a peer looking for a group asks the DHT who else is, at a rate bounded by the matchmaking time
            matchmaking.install(matchmaking.poll_seconds(cfg.matchmaking_time))
            # a round this peer leads waits a little for the hub's witness: only witnessed rounds earn credit
            witnesses = frozenset(join.witness_peers) - {str(dht.peer_id)}
            matchmaking.expect_witnesses(witnesses, matchmaking.witness_grace(cfg.matchmaking_time))
            # the experiment's averaging groups: at most group_size volunteers' peers and one witness each, dealt
            server_witness_peer = auxiliary and join.username == swarm_access.SERVER_PEER_USERNAME
            matchmaking.limit_groups(cfg.group_size, witness=witness_index if server_witness_peer else None)
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
                    swarm_epoch.Roster(dht, join.run_id, access.experiment_key, join.username, deny_list),
                )
            with _sigint_handler_kept():
                opt = SwarmOptimizer(
                    dht=dht,
                    # The witness follows the swarm's epoch as hivemind reads it (a vote it holds back would keep it
                    # out of rounds; its own state is never shared): every other peer reads it through the roster.
                    roster=None
                    if server_witness is not None
                    else swarm_epoch.Roster(dht, join.run_id, access.experiment_key, join.username, deny_list),
                    run_id=join.run_id,
                    params=list(task.parameter_groups(model)),
                    extra_tensors=task.extra_tensors(model),
                    optimizer=optimizer_factory(cfg),
                    scheduler=scheduler_factory(task),
                    batch_size_per_step=None if auxiliary else task.batch_size,
                    target_batch_size=cfg.target_batch_size,
                    matchmaking_time=cfg.matchmaking_time,
                    averaging_timeout=cfg.averaging_timeout,
                    client_mode=client_mode,
                    auxiliary=auxiliary,
                    # The measured link speed: hivemind gives faster peers a larger part of the vector to reduce
                    # (SwarmOptimizer gives it to the gradient averager too).
                    averager_opts={"bandwidth": bandwidth} if bandwidth is not None else None,
                    target_group_size=matchmaking.target_group_size(cfg.group_size),
                    **overlap_options(overlap),
                    # An auxiliary peer reads the swarm's progress every fraction of a second, so that it looks
                    # for each round's group when the trainers do, even with epochs of a few seconds (for the
                    # server's witness, a round it misses credits no one).
                    tracker_opts=WITNESS_TRACKER if auxiliary else None,
                    # No auxiliary peer averages state (it holds none worth averaging): a state round would keep
                    # it busy while the next gradient round forms without it.
                    **({"average_state_every": 2**30} if auxiliary else {}),
                    verbose=False,
                )
                restart_step_count(opt)
            if keeper is not None:
                keeper(opt, task, model, should_stop)
                return summary
            if auxiliary:
                assist_loop(
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
            trainer_loop(
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
