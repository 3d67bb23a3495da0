"""One benchmark process (not a benchmark itself): ``python bench/_worker.py MODE CONFIG_JSON``.

Every mode trains on one thread (``torch.set_num_threads(1)``; the harness also sets ``OMP_NUM_THREADS=1``),
prints JSON lines on stdout (``{"event": "progress", "t": unix time, "samples": ..., "epoch": ...,
"epoch_change": ...}`` and a final ``summary``) and stops cleanly when its stdin closes.

Modes:

- ``swarmhub``: ``swarmhub.worker.training.peer.train`` with a JoinResponse (``config["join"]``), as a volunteer's
  worker trains; progress comes from train's ``on_progress``. With ``evaluate``, the model's loss on the whole
  digits data is measured at each epoch change (the model is caught through ``training.load_task``). With
  ``"epoch_guard": false`` (here and in ``server`` mode) the training loop runs without its minimum epoch length
  (``bench/epoch_guard.py``).
- ``plain``: the baseline a user would write without swarmhub: a ``hivemind.DHT`` and ``hivemind.Optimizer``
  configured like hivemind's ALBERT example (examples/albert/run_trainer.py), the same MLP and data written
  out here, and a plain loop. No swarmhub code.
- ``plain-bootstrap``: a bare hivemind DHT peer the ``plain`` peers bootstrap from (ALBERT's first peer).
- ``bare``: a plain PyTorch loop (Adam step per batch) on digits' model and data; no swarm at all. ``device``
  and ``precision`` (default cpu, fp32) as the worker's options.
- ``single``: one process, gradients accumulated to ``target_batch_size`` samples per Adam step; the model's
  loss on the whole data after each step (the convergence baseline). With ``hivemind_start``, the optimizer first
  gets hivemind's initialisation (one step on zero gradients), as inside ``hivemind.Optimizer``.
- ``server``: what ``swarmhub join`` runs after login: the real join route of a running server, a real
  ``Reporter`` on its websocket, ``run_session`` (log routing, signals, console progress line) and ``train``, on
  ``config["device"]`` and ``config["precision"]`` (default cpu and auto, as ``swarmhub join``'s options).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

torch.set_num_threads(1)

REPORT_EVERY = 2.0  # seconds between progress lines of the modes that have no swarmhub loop

_stop = threading.Event()
_stdout_lock = threading.Lock()


def emit(event: dict[str, Any]) -> None:
    line = json.dumps({"t": time.time(), **event})
    with _stdout_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def watch_stdin(on_eof: Any = _stop.set) -> None:
    """Stop when the harness closes our stdin. The pipe is read from a private copy of fd 0 and fd 0 becomes
    /dev/null first: hivemind forks, and a forked child closing a stdin another thread reads would deadlock
    (as in swarmhub.server.swarm.bootstrap_peer)."""
    pipe = os.dup(0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)

    def run() -> None:
        try:
            while os.read(pipe, 1024):
                pass
        except OSError:
            pass
        on_eof()

    threading.Thread(target=run, daemon=True, name="stdin-watch").start()


_DATA: tuple[torch.Tensor, torch.Tensor] | None = None


def digits_data() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's digits scaled to [0, 1], as the digits task loads them."""
    global _DATA
    if _DATA is None:
        from sklearn.datasets import load_digits

        digits = load_digits()
        _DATA = (
            torch.as_tensor(digits.data / 16.0, dtype=torch.float32),
            torch.as_tensor(digits.target, dtype=torch.long),
        )
    return _DATA


@torch.no_grad()
def full_loss(model: torch.nn.Module) -> float:
    features, labels = digits_data()
    return float(torch.nn.functional.cross_entropy(model(features), labels))


# -- modes ---------------------------------------------------------------------------------------------------


def without_epoch_guard(cfg: dict[str, Any]) -> None:
    """With ``"epoch_guard": false`` (``bench/epoch_guard.py``): the training loop without its minimum epoch length."""
    if cfg.get("epoch_guard") is not False:
        return
    from swarmhub.worker.training import peer as training

    loop = training.trainer_loop

    def unguarded(*args: Any, **kwargs: Any) -> None:
        loop(*args, **{**kwargs, "min_epoch_seconds": 0.0})

    training.trainer_loop = unguarded  # type: ignore[assignment]


def held_out_loss(task: Any, model: torch.nn.Module) -> float:
    """digits: the loss on the whole data (it has no held-out split); a task with its own held-out set (albert-mlm):
    that, as the server's checkpoint peer measures it."""
    if task.name == "digits":
        return full_loss(model)
    return float(task.evaluate(model, torch.device("cpu")))


def slowed(batches: Any, factor: float) -> Any:
    """``task.batches`` of a peer ``factor`` times slower: before each batch it sleeps (factor - 1) times what the
    step took (forward, backward and whatever the loop did with the batch), as a peer with a slower CPU would."""

    def generate(seed: int) -> Any:
        for batch in batches(seed):
            handed = time.perf_counter()
            yield batch
            time.sleep((time.perf_counter() - handed) * (factor - 1.0))

    return generate


def run_swarmhub(cfg: dict[str, Any]) -> None:
    from swarmhub.common.protocol import JoinResponse
    from swarmhub.worker.tasks.data import LocalCorpus
    from swarmhub.worker.training import peer as training

    join = JoinResponse.model_validate_json(cfg["join"])
    seed = cfg.get("seed")
    if seed is not None:
        torch.manual_seed(seed)
    caught: dict[str, Any] = {}
    slowdown = float(cfg.get("slowdown", 1.0))
    if cfg.get("evaluate") or seed is not None or slowdown > 1.0:
        original = training.load_task

        def load_task(name: str, params: dict[str, Any]) -> Any:
            task = original(name, params)
            build = task.build_model
            caught["task"] = task

            def build_model() -> torch.nn.Module:
                if seed is not None:  # the same initial weights in every process (and every swarm) of this seed
                    torch.manual_seed(seed)
                caught["model"] = build()
                if cfg.get("evaluate"):
                    emit({"event": "init", "eval_loss": held_out_loss(task, caught["model"])})
                return caught["model"]

            task.build_model = build_model  # type: ignore[method-assign]
            if slowdown > 1.0:
                task.batches = slowed(task.batches, slowdown)  # type: ignore[method-assign]
            return task

        training.load_task = load_task  # type: ignore[assignment]
    without_epoch_guard(cfg)

    # Every benchmark swarm starts at epoch 0: an epoch change before the first progress line (epochs shorter than
    # the worker's report interval) is still one, with its evaluation.
    last_epoch = [0]

    def on_progress(p: Any) -> None:
        change = p.epoch != last_epoch[0]
        last_epoch[0] = p.epoch
        event = {
            "event": "progress",
            "samples": p.samples,
            "step": p.step,
            "epoch": p.epoch,
            "epoch_change": change,
            "loss": p.loss,
            "peers": p.peers,
            "averaged_peers": p.averaged_peers,
        }
        if "model" in caught and cfg.get("evaluate") and change:
            event["eval_loss"] = held_out_loss(caught["task"], caught["model"])
        emit(event)

    watch_stdin()
    summary = training.train(
        join,
        device="cpu",
        listen_maddrs=["/ip4/127.0.0.1/tcp/0"],
        max_steps=cfg.get("max_steps"),
        on_progress=on_progress,
        stop_event=_stop,
        identity_path=Path(cfg["identity"]),
        corpus=LocalCorpus(Path(cfg["corpus"])) if cfg.get("corpus") else None,
    )
    emit(
        {
            "event": "summary",
            "steps": summary.steps,
            "samples": summary.samples,
            "epoch": summary.epoch,
            "stop_reason": summary.stop_reason.value,
            "averaging_rounds": {str(k): v for k, v in summary.averaging_rounds.items()},
        }
    )


def _mlp(hidden: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))


def _batches(seed: int, size: int) -> Any:
    import numpy as np

    features, labels = digits_data()
    rng = np.random.default_rng(seed)
    while True:
        order = torch.as_tensor(rng.permutation(len(labels)))
        for start in range(0, len(order) - size + 1, size):
            index = order[start : start + size]
            yield features[index], labels[index]


def run_plain(cfg: dict[str, Any]) -> None:
    """hivemind's ALBERT example, reduced to its hivemind part (examples/albert/run_trainer.py with its
    arguments.py defaults): same Optimizer options, Adam instead of LAMB, no LR schedule (as swarmhub)."""
    import hivemind
    from hivemind.compression import Float16Compression

    watch_stdin()
    dht = hivemind.DHT(initial_peers=cfg["initial_peers"], host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    opt = None
    try:
        torch.manual_seed(cfg.get("seed", 0))
        model = _mlp(cfg["hidden_size"])
        batch_size = cfg["batch_size"]
        lr = cfg["learning_rate"]
        opt = hivemind.Optimizer(
            dht=dht,
            run_id=cfg["run_id"],
            target_batch_size=cfg["target_batch_size"],
            batch_size_per_step=batch_size,
            optimizer=lambda params: torch.optim.Adam(params, lr=lr),
            params=model.parameters(),
            matchmaking_time=cfg["matchmaking_time"],
            averaging_timeout=cfg["averaging_timeout"],
            offload_optimizer=True,
            delay_optimizer_step=True,
            delay_grad_averaging=True,
            client_mode=False,
            grad_compression=Float16Compression(),
            state_averaging_compression=Float16Compression(),
            averager_opts={"bandwidth": 100.0, "target_group_size": 256},
            tracker_opts={
                "min_refresh_period": 0.5,
                "max_refresh_period": 30,
                "default_refresh_period": 3,
                "expected_drift_peers": 3,
                "expected_drift_rate": 0.2,
                "metadata_expiration": 120,
            },
            verbose=False,
        )
        opt.load_state_from_peers()  # as the example's callback does on_train_begin
        batches = _batches(cfg["data_seed"], batch_size)
        samples = steps = 0
        last_epoch = opt.local_epoch
        last_report = time.monotonic()
        while not _stop.is_set():
            features, labels = next(batches)
            loss = torch.nn.functional.cross_entropy(model(features), labels)
            loss.backward()
            opt.step()
            opt.zero_grad()
            samples += batch_size
            steps += 1
            epoch = opt.local_epoch
            now = time.monotonic()
            if epoch != last_epoch or now - last_report >= REPORT_EVERY:
                emit(
                    {
                        "event": "progress",
                        "samples": samples,
                        "step": steps,
                        "epoch": epoch,
                        "epoch_change": epoch != last_epoch,
                        "loss": float(loss),
                        "peers": opt.tracker.global_progress.num_peers,
                    }
                )
                last_epoch, last_report = epoch, now
        emit({"event": "summary", "steps": steps, "samples": samples, "epoch": opt.local_epoch})
    finally:
        if opt is not None:
            opt.shutdown()
        dht.shutdown()


def run_plain_bootstrap(cfg: dict[str, Any]) -> None:
    import hivemind

    watch_stdin()
    dht = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    try:
        emit({"event": "ready", "maddrs": [str(m) for m in dht.get_visible_maddrs()]})
        _stop.wait()
    finally:
        dht.shutdown()


def run_bare(cfg: dict[str, Any]) -> None:
    """``_common.BareLoop`` until stdin closes, on ``cfg["device"]`` (default cpu) in ``cfg["precision"]`` (default
    fp32); the loss is read (a device synchronisation) only for the progress line, every REPORT_EVERY seconds."""
    from _common import BareLoop

    watch_stdin()
    loop = BareLoop(
        cfg["hidden_size"],
        cfg["batch_size"],
        cfg.get("device", "cpu"),
        cfg.get("precision", "fp32"),
        seed=cfg.get("data_seed", 0),
        learning_rate=cfg["learning_rate"],
    )
    samples = steps = 0
    last_report = time.monotonic()
    emit({"event": "progress", "samples": 0, "step": 0, "epoch": 0, "epoch_change": False})
    while not _stop.is_set():
        loss = loop.step()
        samples += loop.task.batch_size
        steps += 1
        now = time.monotonic()
        if now - last_report >= REPORT_EVERY:
            emit({"event": "progress", "samples": samples, "step": steps, "epoch": 0, "loss": float(loss.detach())})
            last_report = now
    emit({"event": "summary", "steps": steps, "samples": samples})


def run_single(cfg: dict[str, Any]) -> None:
    """Gradient accumulation to the swarm's global batch: the mean of the micro-batches' mean gradients
    (what hivemind's gradient averager computes for equal micro-batches), one Adam step per global batch."""
    if "experiment" in cfg:
        run_single_task(cfg)
        return
    from swarmhub.worker.tasks.digits import DigitsTask

    watch_stdin()
    torch.set_num_threads(cfg.get("threads", 1))
    task = DigitsTask({"hidden_size": cfg["hidden_size"], "batch_size": cfg["batch_size"]})
    torch.manual_seed(cfg["seed"])
    model = task.build_model()
    opt = torch.optim.Adam(model.parameters(), lr=cfg["learning_rate"])
    if cfg.get("hivemind_start"):
        # what hivemind.Optimizer does to the optimizer it builds: one step on zero gradients, to create its state
        from hivemind.optim.state_averager import initialize_optimizer_state_

        initialize_optimizer_state_(opt)
    batches = task.batches(seed=cfg["data_seed"])
    device = torch.device("cpu")
    micro = cfg["target_batch_size"] // task.batch_size
    samples = epoch = 0
    emit({"event": "progress", "samples": 0, "epoch": 0, "epoch_change": True, "eval_loss": full_loss(model)})
    while samples < cfg["max_samples"] and not _stop.is_set():
        for _ in range(micro):
            (task.loss(model, next(batches), device) / micro).backward()
            samples += task.batch_size
        opt.step()
        opt.zero_grad()
        epoch += 1
        emit(
            {
                "event": "progress",
                "samples": samples,
                "epoch": epoch,
                "epoch_change": True,
                "eval_loss": full_loss(model),
            }
        )
    emit({"event": "summary", "samples": samples, "epoch": epoch, "threads": torch.get_num_threads()})


def run_single_task(cfg: dict[str, Any]) -> None:
    """``single`` for any task of an experiment (``cfg["experiment"]``, its corpus folder in ``cfg["corpus"]``):
    the experiment's optimizer, the task's parameter groups and learning-rate schedule, built and started as the
    worker's ``hivemind.Optimizer`` builds and starts them (one step on zero gradients at the base rate, then the
    step count set back to 0: ``training.restart_step_count``), gradients accumulated to ``target_batch_size``
    samples per step; the task's held-out loss after each step."""
    from hivemind.optim.state_averager import initialize_optimizer_state_

    from swarmhub.common.protocol import TrainingSettings
    from swarmhub.worker.tasks.data import LocalCorpus
    from swarmhub.worker.training import peer as training

    watch_stdin()
    torch.set_num_threads(cfg.get("threads", 1))
    settings = TrainingSettings.model_validate(cfg["experiment"])
    task = training.load_task(settings.task, settings.task_params)
    if task.needs_corpus:
        task.attach(LocalCorpus(Path(cfg["corpus"])))
    torch.manual_seed(cfg["seed"])
    model = task.build_model()
    model.train()
    opt = training.optimizer_factory(settings)(list(task.parameter_groups(model)))
    initialize_optimizer_state_(opt)
    for state in opt.state.values():
        if torch.is_tensor(state.get("step")):
            state["step"].zero_()
    make_scheduler = training.scheduler_factory(task)
    scheduler = make_scheduler(opt) if make_scheduler is not None else None
    batches = task.batches(seed=cfg["data_seed"])
    device = torch.device("cpu")
    micro = settings.target_batch_size // task.batch_size
    samples = epoch = 0
    emit({"event": "progress", "samples": 0, "epoch": 0, "epoch_change": True, "eval_loss": held_out_loss(task, model)})
    while samples < cfg["max_samples"] and not _stop.is_set():
        for _ in range(micro):
            (task.loss(model, next(batches), device) / micro).backward()
            samples += task.batch_size
        opt.step()
        opt.zero_grad()
        if scheduler is not None:
            scheduler.step()
        epoch += 1
        event = {"event": "progress", "samples": samples, "epoch": epoch, "epoch_change": True}
        emit({**event, "eval_loss": held_out_loss(task, model)})
    emit({"event": "summary", "samples": samples, "epoch": epoch, "threads": torch.get_num_threads()})


def run_server(cfg: dict[str, Any]) -> None:
    """What ``swarmhub join SLUG`` runs, with the reporter's messages also printed (with their time) here."""
    from swarmhub import __version__
    from swarmhub.common.protocol import JoinRequest, MetricReport, SwarmToken
    from swarmhub.worker.client import USER_AGENT, ApiClient
    from swarmhub.worker.join.reporter import Reporter
    from swarmhub.worker.join.session import run_session
    from swarmhub.worker.swarm import access as swarm_access

    without_epoch_guard(cfg)
    url, token, slug = cfg["url"], cfg["token"], cfg["slug"]
    device = cfg.get("device", "cpu")
    state = Path(cfg["state_dir"])
    identity = state / "identity.key"
    public_key = swarm_access.public_key_text(swarm_access.load_or_create_identity(identity))
    with ApiClient(url, token, user_agent=USER_AGENT) as client:
        request = JoinRequest(device=device, client_version=__version__, peer_public_key=public_key)
        joined = client.join(slug, request)

    def fetch_token() -> SwarmToken:
        with ApiClient(url, token, user_agent=USER_AGENT) as refresher:
            return refresher.swarm_token(joined, public_key)

    def denied() -> set[str]:
        with ApiClient(url, token, user_agent=USER_AGENT) as poller:
            return poller.denylist(slug)

    class RecordingReporter(Reporter):
        """The real reporter; each message is also printed here with its time, for the measurement."""

        last_epoch = 0  # a new experiment: the swarm starts at epoch 0

        def report(self, msg: MetricReport) -> None:
            change = msg.epoch != self.last_epoch
            self.last_epoch = msg.epoch
            emit(
                {
                    "event": "progress",
                    "samples": msg.samples,
                    "step": msg.step,
                    "epoch": msg.epoch,
                    "epoch_change": change,
                    "loss": msg.loss,
                    "peers": msg.peers,
                    "averaged_peers": msg.averaged_peers,
                }
            )
            super().report(msg)

    # run_session stops on SIGTERM, as `swarmhub join` does: closing our stdin sends us one
    watch_stdin(lambda: os.kill(os.getpid(), signal.SIGTERM))
    try:  # join keeps every report on disk until the server acknowledges it (newer workers)
        from swarmhub.worker.join.spool import Spool

        extra: dict[str, Any] = {"spool": Spool(state / "spool", joined.worker_id)}
    except ImportError:
        extra = {}
    reporter = RecordingReporter.for_join(url, token, joined, **extra).start()
    with open(state / "console.txt", "w") as console:
        code = run_session(
            joined,
            device=device,
            precision=cfg.get("precision", "auto"),
            listen_maddrs=["/ip4/127.0.0.1/tcp/0"],
            reporter=reporter,
            log_path=state / "join.log",
            out=console,
            restore_stderr=False,
            identity_path=identity,
            fetch_token=fetch_token,
            denied=denied,
        )
    emit(
        {
            "event": "summary",
            "exit_code": code,
            "unacked": reporter.pending,
            "dropped": reporter.dropped,
            "reports": (reporter.last_epoch is not None),
        }
    )
    sys.exit(0 if code in (0, 143) else code)


MODES = {
    "swarmhub": run_swarmhub,
    "plain": run_plain,
    "plain-bootstrap": run_plain_bootstrap,
    "bare": run_bare,
    "single": run_single,
    "server": run_server,
}

if __name__ == "__main__":
    MODES[sys.argv[1]](json.loads(sys.argv[2]))
