"""One peer in four attacks the gradient rounds: the honest peers' loss, `mean` against `centered-clip`.

    .venv/bin/python bench/byzantine.py [--epochs 20] [--repeats 2]

For each aggregation (``mean``, ``centered-clip``) and each attack, a fresh swarm on 127.0.0.1: the server's
bootstrap peer and four workers running ``swarmhub.worker.training.peer.train`` on digits, each with its own account.
One of them sends, in every round, (a) its gradients x100, (b) its gradients x-1, (c) random noise of its
gradients' norm; in the clean swarm it is honest, and in the ``absent`` swarm it never joins (three honest
peers: what the swarm gets with the attacker's samples gone, the best any aggregation can do). The optimizer is
plain SGD (learning rate 0.5): under Adam a peer's gradients x100 are divided by their own running scale, so the
mean is over-weighted toward one peer's batch rather than thrown off. Every swarm starts from the same model,
and each worker reads the data in the same order in every swarm. Every worker stops once the swarm has taken
``--epochs`` optimizer steps (equal steps: the loss of a swarm is mostly a matter of how many steps it took), and
the table prints the honest workers' models' mean loss on the whole data set (no batch noise), the median over
``--repeats`` swarms, against the clean swarm's under ``mean`` (the goal) and under the same rule. The clean
swarms also give the cost of centered-clip: the swarm's epochs per second and samples per second, centered-clip
over mean, measured side by side in this run.

Run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common as c

from swarmhub.common.protocol import Aggregation, ExperimentConfig, OptimizerName
from swarmhub.worker.swarm import access as swarm_access

PEER = """
import json, sys
from pathlib import Path
import torch
from swarmhub.common.protocol import JoinResponse
from swarmhub.worker.training.peer import train

join = JoinResponse.model_validate_json(sys.argv[1])
identity, attack, epochs = Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
if attack != "none":
    from hivemind.optim.grad_averager import GradientAverager
    load = GradientAverager.load_accumulators_into_averager_
    def poisoned(self):
        load(self)
        with torch.no_grad(), self.get_tensors() as tensors:
            for t in tensors:
                if attack == "x100":
                    t.mul_(100.0)
                elif attack == "sign-flip":
                    t.mul_(-1.0)
                elif attack == "noise":
                    norm = t.norm()
                    noise = torch.randn_like(t)
                    t.copy_(noise * norm / noise.norm().clamp_min(1e-12))
    GradientAverager.load_accumulators_into_averager_ = poisoned
import threading, time
from swarmhub.worker.training import peer as training
models = []
load_task = training.load_task
def keep_model(*args, **kwargs):
    task = load_task(*args, **kwargs)
    build = task.build_model
    def build_seeded():  # every peer of every swarm starts from the same model (its data order: its worker ID)
        torch.manual_seed(0)
        models.append(build())
        return models[-1]
    task.build_model = build_seeded
    return task
training.load_task = keep_model
t0 = time.time()
stop = threading.Event()
def at_epoch(progress):  # every peer stops once the swarm has taken `epochs` optimizer steps
    if progress.epoch >= epochs:
        stop.set()
s = train(join, device="cpu", listen_maddrs=["/ip4/127.0.0.1/tcp/0"], identity_path=identity, max_minutes=10,
          on_progress=at_epoch, stop_event=stop)
seconds = time.time() - t0
task = load_task(join.experiment.task, join.experiment.task_params)
features, labels = task._data()
with torch.no_grad():  # the model this peer ends with, on every sample of the data set: no batch noise
    eval_loss = float(torch.nn.functional.cross_entropy(models[0](features), labels))
print(json.dumps({"steps": s.steps, "samples": s.samples, "epoch": s.epoch, "last_loss": s.last_loss,
                  "eval_loss": eval_loss, "seconds": seconds,
                  "rounds": {str(k): v for k, v in s.averaging_rounds.items()}}), flush=True)
"""

ATTACKS = ["none", "absent", "x100", "sign-flip", "noise"]


@dataclass(frozen=True)
class Run:
    run_id: str
    maddrs: list[str]
    signing_key: Any  # hivemind RSAPrivateKey


def bootstrap(folder: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], Run]:
    """The server's bootstrap/monitor peer for a new run, started as the server starts it."""
    run_id = f"byz-{uuid.uuid4().hex[:8]}"
    argv, key_text = c.bootstrap_peer_command(folder, run_id)
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    # the reader keeps reading its progress lines: a full pipe would block the peer, and then its shutdown
    reader = c.LineReader(proc, "the bootstrap peer")
    maddrs = reader.wait_for("ready", 60)["maddrs"]
    return proc, Run(run_id, maddrs, swarm_access.signing_key_from_text(key_text))


def join_for(peer: Run, name: str, identity: Path, aggregation: str) -> str:
    experiment = ExperimentConfig(
        slug="byzantine", title="Byzantine bench", task="digits", task_params={"batch_size": 32, "hidden_size": 32},
        optimizer=OptimizerName.sgd, learning_rate=0.5, target_batch_size=512, matchmaking_time=2.0,
        averaging_timeout=10.0,
        aggregation=Aggregation(aggregation),
    )  # fmt: skip
    return c.make_join(peer, f"{name}-byzantine", identity, experiment, username=name).model_dump_json()


def run_swarm(aggregation: str, attack: str, epochs: int) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        boot, run = bootstrap(folder, env)
        peers = []
        try:
            for i, name in enumerate(["ada", "bob", "cyd", "mallory"][: 3 if attack == "absent" else 4]):
                identity = folder / f"{name}.key"
                mode = attack if i == 3 else "none"
                join = join_for(run, name, identity, aggregation)
                peers.append(
                    subprocess.Popen(
                        [sys.executable, "-c", PEER, join, str(identity), mode, str(epochs)],
                        stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL,
                        text=True,
                        env=env,
                    )  # fmt: skip
                )
            results = []
            for proc in peers[:3]:
                out, _ = proc.communicate(timeout=900)
                lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
                results.append(lines[-1] if lines else {})
            for proc in peers[3:]:
                proc.communicate(timeout=300)
        finally:
            for proc in peers:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(60)
            boot.terminate()
            boot.wait(60)
    losses = [r["eval_loss"] for r in results if r.get("eval_loss") is not None]
    seconds = max(r.get("seconds", 0.0) for r in results)
    return {
        "loss": sum(losses) / len(losses) if losses else float("nan"),
        "epoch": max(r.get("epoch", 0) for r in results),
        "epochs_per_second": max(r.get("epoch", 0) for r in results) / seconds if seconds else 0.0,
        "samples_per_second": sum(r.get("samples", 0) for r in results) / seconds if seconds else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    print(f"machine load before: {os.getloadavg()[0]:.2f}", flush=True)
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for repeat in range(args.repeats):
        for attack in ATTACKS:  # interleaved: each attack's two aggregations run back to back
            for aggregation in ("mean",) if attack == "absent" else ("mean", "centered-clip"):
                run = run_swarm(aggregation, attack, args.epochs)
                runs.setdefault((aggregation, attack), []).append(run)
                print(f"# {repeat} {aggregation:13s} {attack:9s} {json.dumps(run)}", flush=True)
    print(f"machine load after: {os.getloadavg()[0]:.2f}")

    def median(aggregation: str, attack: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[aggregation, attack])

    clean = median("mean", "none", "loss")
    print(
        f"\nhonest peers' loss on the whole data set at swarm epoch {args.epochs}, median of {args.repeats} "
        "swarms (ratio to the clean swarm under mean; under centered-clip's own clean swarm)"
    )
    print("| attack | mean | centered-clip | centered-clip within 10 % |\n| --- | --- | --- | --- |")
    for attack in ATTACKS:
        cells = []
        if attack == "absent":  # a reference, not an attack
            loss = median("mean", attack, "loss")
            print(f"| (three honest peers, no fourth) | {loss:.3f} ({loss / clean:.2f}x) | | |")
            continue
        for aggregation in ("mean", "centered-clip"):
            loss = median(aggregation, attack, "loss")
            spread = ", ".join(f"{r['loss']:.3f}" for r in runs[aggregation, attack])
            own = median(aggregation, "none", "loss")
            cells.append(f"{loss:.3f} ({loss / clean:.2f}x; {loss / own:.2f}x) [{spread}]")
        ok = median("centered-clip", attack, "loss") <= 1.1 * clean
        print(f"| {attack} | {cells[0]} | {cells[1]} | {'PASS' if ok else 'MISS'} |")
    ratios = {key: median("centered-clip", "none", key) / median("mean", "none", key)
              for key in ("epochs_per_second", "samples_per_second")}  # fmt: skip
    print(
        "\ncost of centered-clip in the clean swarm (centered-clip / mean, medians): "
        f"epochs per second {ratios['epochs_per_second']:.2f}, samples per second {ratios['samples_per_second']:.2f}"
    )


if __name__ == "__main__":
    main()
