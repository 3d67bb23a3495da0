"""The server's checkpoint peer for one experiment whose task keeps checkpoints (for example ``albert-mlm``).

Run as its own process by ``SwarmHost`` (hivemind objects must never cross a ``spawn``):

    python -m swarmhub.server.swarm.checkpoint_peer --config FILE --signing-key-file FILE --identity FILE --host HOST

It joins the experiment's swarm as the server's own peer (a token it signs itself, as ``swarmhub``), computes
nothing, and every ``interval_seconds``:

1. pulls the collaborative state (weights, optimizer statistics, step) from the swarm when the swarm is ahead;
2. when the step moved since its last checkpoint, measures the held-out loss and accuracy (``Task.measure``), and writes
   ``<checkpoints>/<epoch>/``: ``state.pt`` (to resume from), ``model/`` and ``model.zip`` (``Task.export``:
   for albert-mlm the transformers format) and ``info.json``; the folder appears whole (renamed into place);
3. prints ``{"event": "checkpoint", "epoch": E, "eval_loss": L, "eval_top1": A1, "eval_top5": A5, "folder":
   "<run_id>/<epoch>"}`` for the server.

At start it loads the newest checkpoint on disk, so a swarm that emptied (or a server that restarted) goes on
from there: this peer shares that state, and the next volunteer to join loads it from this peer instead of
starting from scratch. When the organizer rolls the swarm back (``server/experiments/rollback.py``), the server
writes the
request into ``restore_file``; this peer loads that checkpoint and shares it ten epochs past the swarm's, so that
every peer loads it, and saves it at once (``{"event": "checkpoint", ..., "restored_from": E}``). It leaves the
swarm cleanly on SIGTERM, SIGINT, or when its stdin closes.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from swarmhub.server.swarm.events import Checkpoint, KeeperConfig, Keeping, Ready, RestoreFailed, Stopped
from swarmhub.server.swarm.process import ServerPeerAccess, companion_arguments, emit, run, stop_event

logger = logging.getLogger("swarmhub.checkpoint_peer")
# A rolled-back state is shared this many epochs past the newest the swarm shows: a volunteer training on its own
# moves an epoch every few seconds, and must still find itself behind when it next reads the swarm's progress.
ROLLBACK_EPOCH_MARGIN = 10
# hivemind publishes no progress record for a peer that accumulates no samples (this one): after a rollback this
# peer stores its own, at its epoch, every ANNOUNCE_EVERY seconds for ANNOUNCE_SECONDS, so that every peer reads it
ANNOUNCE_SECONDS = 120.0
ANNOUNCE_EVERY = 5.0


def newest_checkpoint(folder: Path) -> Path | None:
    """The newest complete checkpoint folder (named by its epoch) under ``folder``."""
    if not folder.is_dir():
        return None
    done = [p for p in folder.iterdir() if p.name.isdigit() and (p / "state.pt").is_file()]
    return max(done, key=lambda p: int(p.name)) if done else None


class Keeper:
    """``training.train``'s ``keeper``: resume from disk, then pull, evaluate and save at each interval."""

    def __init__(
        self,
        run_id: str,
        folder: Path,
        interval: float,
        pause: Callable[[float], Any],
        restore_file: Path | None = None,
    ):
        self.run_id = run_id
        self.folder = folder
        self.interval = interval
        self.pause = pause
        self.saved_epoch = -1
        self.restore_file = restore_file
        self.restored_seq = self._handled_restores()
        self._announce_until = 0.0
        self._announce_started = 0.0
        self._announced_at = -math.inf

    def __call__(self, opt: Any, task: Any, model: Any, should_stop: Callable[[], Any]) -> None:
        self.resume(opt, model)
        emit(Keeping(epoch=opt.local_epoch))
        next_check = time.monotonic() + self.interval
        while should_stop() is None:
            try:
                self.maybe_restore(opt, task, model)
                self.announce(opt)
            except Exception:  # a failed restore leaves the swarm's state as it was; the organizer may ask again
                logger.exception("the rollback failed")
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + self.interval
                try:
                    self.check(opt, task, model)
                except Exception:  # a failed pull or save must not take the swarm's checkpoints down for good
                    logger.exception("checkpoint failed; trying again at the next interval")
            self.pause(min(1.0, max(next_check - time.monotonic(), 0.05)))

    def resume(self, opt: Any, model: Any) -> None:
        newest = newest_checkpoint(self.folder)
        if newest is None:
            return
        self._load(opt, model, newest)
        logger.info("resumed from %s (step %d)", newest, opt.local_epoch)

    def _handled_restores(self) -> int:
        try:
            return int(json.loads((self.folder / "restored.json").read_text())["seq"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0

    def maybe_restore(self, opt: Any, task: Any, model: Any) -> None:
        """Act on a rollback the organizer asked for since the last one this peer handled (once each)."""
        if self.restore_file is None or not self.restore_file.exists():
            return
        text = self.restore_file.read_text().strip()
        order = json.loads(text) if text else None
        if not isinstance(order, dict) or int(order.get("seq", 0)) <= self.restored_seq:
            return
        seq, epoch = int(order["seq"]), int(order["epoch"])
        folder = self.folder / f"{epoch:010d}"
        try:
            if (folder / "state.pt").is_file():
                self.restore(opt, task, model, folder, epoch)
            else:
                logger.warning("no checkpoint of step %d to roll back to in %s", epoch, self.folder)
                emit(RestoreFailed(epoch=epoch, reason="its files are gone"))
        finally:
            self.restored_seq = seq
            tmp = self.folder / ".restored.json.tmp"
            tmp.write_text(json.dumps({"seq": seq, "epoch": epoch}))
            os.replace(tmp, self.folder / "restored.json")

    def restore(self, opt: Any, task: Any, model: Any, folder: Path, epoch: int) -> None:
        """Share the checkpoint in ``folder`` as the swarm's state, ROLLBACK_EPOCH_MARGIN epochs past the newest the
        swarm shows now: every peer then finds itself well behind a server peer and loads the state from it."""
        if hasattr(opt, "refresh_swarm_progress"):
            opt.refresh_swarm_progress(timeout=5.0, force=True)
        target = max(int(opt.local_epoch), int(opt.tracker.global_epoch)) + ROLLBACK_EPOCH_MARGIN
        self._load(opt, model, folder)
        averager = opt.state_averager
        step = averager.schedule_step  # the checkpoint's place in the learning-rate schedule
        averager.local_epoch = target
        averager.take_schedule_offset(target - step)  # the schedule continues from the checkpoint's step
        averager.state_sharing_priority = target
        opt.tracker.report_local_progress(target, 0)
        self._announce_until = time.monotonic() + ANNOUNCE_SECONDS
        self._announce_started = time.monotonic()
        self._announced_at = -math.inf
        self.announce(opt)
        logger.warning("rolled the swarm back to the checkpoint of step %d, shared as step %d", epoch, target)
        self.save(opt, task, model, restored_from=epoch)

    def announce(self, opt: Any) -> None:
        """After a rollback: store this peer's progress record (its epoch, no samples) in the swarm's progress key,
        until a volunteer trains at its epoch or later (it loaded the state). Volunteers see this record as a peer
        to average with, which it is not: stopping early keeps them from waiting for a group that never forms."""
        now = time.monotonic()
        if now >= self._announce_until or now - self._announced_at < ANNOUNCE_EVERY:
            return
        swarm = opt.tracker.global_progress
        if swarm.epoch >= opt.local_epoch and swarm.samples_accumulated > 0 and now - self._announce_started > 5.0:
            self._announce_until = 0.0  # caught up
            return
        from swarmhub.worker.swarm.epoch import store_presence

        if store_presence(opt.dht, opt.tracker, opt.local_epoch):
            self._announced_at = now

    def _load(self, opt: Any, model: Any, folder: Path) -> None:
        """Make the checkpoint in ``folder`` this peer's state (weights, optimizer statistics, step)."""
        import torch

        state = torch.load(folder / "state.pt", map_location="cpu", weights_only=True)
        averager = opt.state_averager
        with torch.no_grad(), averager.lock_averaged_tensors:
            model.load_state_dict(state["model"])
            # hivemind.Optimizer offloads the optimizer by default: it steps (and shares with newcomers) its own
            # copies of the parameters, which must hold the checkpoint's weights too, not just the model.
            offloaded = [p for group in averager.optimizer.param_groups for p in group["params"]]
            for copy, param in zip(offloaded, averager.main_parameters, strict=True):
                if copy is not param:
                    copy.copy_(param)
        opt.load_state_dict(state["optimizer"])  # sets the local epoch too
        if not averager.reuse_tensors:  # hivemind averages its own copies of the tensors too
            averager._load_local_tensors_into_averager_()
        averager.take_schedule_offset(state.get("schedule_offset", 0))
        averager.state_sharing_priority = opt.local_epoch  # newcomers load the newest state first
        opt.tracker.report_local_progress(opt.local_epoch, 0)  # the swarm's step is this one now
        self.saved_epoch = opt.local_epoch

    def check(self, opt: Any, task: Any, model: Any) -> None:
        if hasattr(opt, "refresh_swarm_progress"):  # this peer trains nothing: hivemind reads the swarm seldom
            opt.refresh_swarm_progress(timeout=5.0, force=True)
        if opt.tracker.global_epoch > opt.local_epoch:
            opt.load_state_from_peers()
        if opt.local_epoch > self.saved_epoch:
            self.save(opt, task, model)

    def save(self, opt: Any, task: Any, model: Any, restored_from: int | None = None) -> None:
        import torch

        epoch = int(opt.local_epoch)
        measured = task.measure(model, torch.device("cpu"))
        eval_loss = measured.loss if measured is not None else None
        top1 = measured.top1 if measured is not None else None
        top5 = measured.top5 if measured is not None else None
        name = f"{epoch:010d}"
        final = self.folder / name
        tmp = self.folder / f".{name}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            task.export(model, tmp / "model")
            with zipfile.ZipFile(tmp / "model.zip", "w", zipfile.ZIP_DEFLATED) as archive:
                for path in sorted((tmp / "model").rglob("*")):
                    if path.is_file():
                        archive.write(path, path.relative_to(tmp / "model").as_posix())
            step = opt.state_averager.schedule_step
            state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch}
            torch.save({**state, "schedule_offset": epoch - step}, tmp / "state.pt")
            info = {
                "epoch": epoch,
                "schedule_step": step,
                "eval_loss": eval_loss,
                "eval_top1": top1,
                "eval_top5": top5,
                "time": time.time(),
                "restored_from": restored_from,
            }
            (tmp / "info.json").write_text(json.dumps(info))
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self.saved_epoch = epoch
        loss = eval_loss if eval_loss is None or eval_loss == eval_loss else None  # NaN is not JSON
        emit(
            Checkpoint(
                epoch=epoch,
                eval_loss=loss,
                eval_top1=top1,
                eval_top5=top5,
                folder=f"{self.run_id}/{name}",
                restored_from=restored_from,
            )
        )


def main(argv: list[str] | None = None) -> int:
    parser = companion_arguments(
        "swarmhub-checkpoint-peer", "JSON (events.KeeperConfig): experiment, run_id, initial_peers, corpus, folder"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    logger.setLevel(logging.INFO)
    stop = stop_event()

    from swarmhub.server.core.settings import tcp_maddr
    from swarmhub.worker.tasks.data import LocalCorpus
    from swarmhub.worker.training.peer import train

    config = KeeperConfig.model_validate_json(Path(args.config).read_text())
    access = ServerPeerAccess.load(config.run_id, args.signing_key_file, Path(args.identity), args.token_minutes)
    corpus = LocalCorpus(Path(config.corpus)) if config.corpus else None
    restore_file = Path(config.restore_file) if config.restore_file else None
    keeper = Keeper(config.run_id, Path(config.folder), config.interval_seconds, stop.wait, restore_file)
    summary = train(
        access.join(config, worker_id=f"checkpoints-{config.run_id}"),
        device="cpu",
        listen_maddrs=[tcp_maddr(args.host, args.port)],
        announce_maddrs=[tcp_maddr(args.announce_host, args.port)] if args.announce_host else None,
        identity_path=access.identity,
        fetch_token=access.mint_wire,
        denied=access.denied,
        stop_event=stop,
        corpus=corpus,
        keeper=keeper,
        on_joined=lambda peer_id, maddrs: emit(Ready(peer_id=peer_id, maddrs=maddrs)),
    )
    emit(Stopped(epoch=summary.epoch))
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
