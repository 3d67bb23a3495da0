"""Admitted peers that mean harm, as real processes with valid tokens, against honest peers on 127.0.0.1.

Each attacker runs the real worker (``train``) with one part of hivemind patched the way a hostile volunteer
would patch their own copy: gradients multiplied by -1000 or -1, or made NaN, before every round, or a state served with
its parameters x100, its epoch +1000, advertised at the top priority and backed by progress records 1000 epochs
ahead. The honest peers run the worker unchanged.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from swarmhub.common.protocol import JoinResponse
from swarmhub.worker.swarm import robust

from .swarm_processes import TEST_EXPERIMENT, LineReader, Swarm, kill_all, make_join, tagged_env, wait_gone

pytestmark = [pytest.mark.swarm, pytest.mark.solo]  # training pace is asserted: see tests/lanes.py

PEER = """
import dataclasses, json, os, signal, sys, threading
from pathlib import Path
import torch
from swarmhub.common.protocol import JoinResponse
from swarmhub.worker.training.peer import train

join = JoinResponse.model_validate_json(sys.argv[1])
identity, attack, minutes = Path(sys.argv[2]), sys.argv[3], float(sys.argv[4])

if attack in ("scale", "flip", "nan", "noise"):  # what this peer puts into every gradient round
    from hivemind.optim.grad_averager import GradientAverager
    load = GradientAverager.load_accumulators_into_averager_
    def poisoned(self):
        load(self)
        with torch.no_grad(), self.get_tensors() as tensors:
            for tensor in tensors:
                if attack == "nan":
                    tensor.fill_(float("nan"))
                elif attack == "noise":  # a freeloader's parts: random, at the norm of a real gradient
                    noise = torch.randn_like(tensor)
                    tensor.copy_(noise * tensor.norm() / noise.norm().clamp_min(1e-12))
                else:
                    tensor.mul_(-1000.0 if attack == "scale" else -1.0)
    GradientAverager.load_accumulators_into_averager_ = poisoned
elif attack == "hijack":  # the state it serves, the priority it advertises, the epoch its records state
    from hivemind.averaging.averager import DecentralizedAverager
    from hivemind.optim.progress_tracker import ProgressTracker
    from hivemind.optim.state_averager import TrainingStateAverager
    state = TrainingStateAverager.get_current_state
    def poisoned_state(self):
        metadata, tensors, infos = state(self)
        n = len(self.main_parameters)
        scaled = [t * 100 if i < n else t for i, t in enumerate(tensors)]
        return dict(metadata, epoch=metadata["epoch"] + 1000), scaled, infos
    TrainingStateAverager.get_current_state = poisoned_state
    priority = DecentralizedAverager.state_sharing_priority
    DecentralizedAverager.state_sharing_priority = property(
        lambda self: float(self._state_sharing_priority.value) + 1000, priority.fset)
    report = ProgressTracker.report_local_progress
    ProgressTracker.report_local_progress = lambda self, epoch, samples, **kw: report(self, epoch + 1000, samples, **kw)

def progress(p):
    line = json.dumps({"event": "progress", "epoch": p.epoch, "loss": p.loss, "averaged": p.averaged_peers})
    print(line, flush=True)
    print(line, file=sys.stderr, flush=True)  # the loss trail in the peer's log, for a failure's diagnosis

stop, main_pid = threading.Event(), os.getpid()
def on_term(signum, frame):  # SIGTERM ends the run early, with a summary; hivemind's forked children just die
    if os.getpid() == main_pid:
        stop.set()
    else:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
signal.signal(signal.SIGTERM, on_term)
s = train(join, device="cpu", listen_maddrs=["/ip4/127.0.0.1/tcp/0"], max_minutes=minutes, identity_path=identity,
          on_progress=progress, on_joined=lambda peer_id, maddrs: print(json.dumps({"peer_id": peer_id}), flush=True),
          stop_event=stop)
print(json.dumps({"event": "summary", "epoch": s.epoch, "first_loss": s.first_loss, "last_loss": s.last_loss,
                  "flags": s.flags, "rounds": {str(k): v for k, v in s.averaging_rounds.items()}}), flush=True)
"""


def join_as(
    swarm: Swarm, username: str, identity: Path, aggregation: str, learning_rate: float = 1e-2, batch_size: int = 0
) -> JoinResponse:
    """The server's join answer for ``username``'s key at ``identity`` (each volunteer its own account); with
    ``batch_size``, each step that many samples and the target batch four steps' worth."""
    update: dict = {"learning_rate": learning_rate, "averaging_timeout": 10.0, "aggregation": aggregation}
    if batch_size:
        update.update(
            task_params={**TEST_EXPERIMENT.task_params, "batch_size": batch_size}, target_batch_size=4 * batch_size
        )
    experiment = TEST_EXPERIMENT.model_copy(update=update)
    return make_join(swarm, f"{username}-{uuid.uuid4().hex[:6]}", identity, experiment, username=username)


class Peers:
    """The test's peer processes, each with its own account, and what they printed."""

    def __init__(self, swarm: Swarm, folder: Path, aggregation: str, batch_size: int = 0):
        self.swarm, self.folder, self.aggregation, self.batch_size = swarm, folder, aggregation, batch_size
        self.tag = f"byzantine-{uuid.uuid4().hex}"
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.lines: dict[str, LineReader] = {}
        self.peer_ids: dict[str, str] = {}

    def start(self, name: str, attack: str = "none", minutes: float = 1.5) -> None:
        identity = self.folder / f"{name}.key"
        join = join_as(self.swarm, name, identity, self.aggregation, batch_size=self.batch_size)
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-c", PEER, join.model_dump_json(), str(identity), attack, str(minutes)],
            stdout=subprocess.PIPE,
            stderr=(self.folder / f"{name}.log").open("w"),
            text=True,
            env=tagged_env(self.tag),
        )
        self.lines[name] = LineReader(self.procs[name])

    def joined(self, name: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while (line := self.lines[name].next(max(deadline - time.monotonic(), 0.01))) is not None:
            if line.startswith("{") and "peer_id" in (event := json.loads(line)):
                self.peer_ids[name] = event["peer_id"]
                return event["peer_id"]
        raise AssertionError(f"{name} never joined the swarm")

    def wait_for(self, name: str, check, timeout: float) -> dict:  # noqa: ANN001
        deadline = time.monotonic() + timeout
        while (line := self.lines[name].next(max(deadline - time.monotonic(), 0.01))) is not None:
            if line.startswith("{") and check(event := json.loads(line)):
                return event
        raise AssertionError(f"{name} printed nothing that passes the check within {timeout} s")

    def train_until(self, names: tuple[str, ...], epoch: int, timeout: float) -> None:
        """Wait until every one of ``names`` reports ``epoch``, then end every peer's run (they print summaries).

        A run of so many epochs, not so many minutes: on a slower or busier machine it takes longer, it does not
        train less."""
        deadline = time.monotonic() + timeout
        for name in names:
            self.wait_for(name, lambda e: e.get("epoch", 0) >= epoch, max(deadline - time.monotonic(), 0.01))
        for name in self.procs:
            self.end(name)

    def end(self, name: str) -> None:
        """Ask ``name`` to end its run now (it still prints its summary)."""
        self.procs[name].terminate()

    def summary(self, name: str, timeout: float = 240) -> dict:
        events = self.lines[name].remaining_events(timeout)
        found = [e for e in events if e.get("event") == "summary"]
        log = (self.folder / f"{name}.log").read_text()[-3000:]
        assert found, f"{name} ended without a summary (exit code {self.procs[name].poll()}): {log}"
        return found[-1]

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        left = wait_gone(self.tag, 60)  # hivemind's helpers take a while to go on a loaded machine
        kill_all(left)
        assert not left, "the peers left processes behind"


# Epochs the centered-clip swarm trains: in one run the honest loss went 2.31 -> 0.44 by epoch 30 (with the attacker
# clipped rather than left out, it went 2.37 -> 2.35). Since state rounds left centered-clip, three runs ended below
# half their first loss and two at 1.23 and 1.29 (from about 2.3; one of them beside another swarm): the defence
# keeps the swarm training, at a pace that varies from run to run (how close it stays to a clean swarm is
# bench/byzantine.py's question). The bound is that the loss fell by at least 30 %; a stalled swarm stays near 2.3.
# Since every peer of a run starts from the same seeded model, 9 of 10 runs ended at 0.20-0.37 of their first loss and
# one stalled (2.28 -> 2.02, every round with all four peers; its cause is not found): a failure prints the peer's
# loss trail for that diagnosis. With the senders' standing (which also screens the x-1000 part, pointing against the
# others, besides the outlier bound), twelve runs at 7f14e2a's worker code all passed (eleven alone, the last with a
# one-process simulation beside it), at 0.14-0.38 of their first loss by epoch 30-32 (110-139 s each).
EPOCHS = 30
TRAINED = 0.7
MALLORY_ALONE = 2  # epochs she trains alone, when she starts first
FROM_HER_STATE = 0.85  # the bound for honest peers that start from her (uphill) parameters


def honest_three_and(
    attack: str, swarm_peer, tmp_path: Path, mallory_first: bool = False, nora: str | None = None, batch_size: int = 0
) -> tuple[Peers, dict[str, dict]]:
    """Three honest volunteers and mallory, sending her gradients the ``attack`` way (and with ``nora``, nora
    sending hers that way too), under centered-clip: once four of them averaged together, the honest three train
    until epoch ``EPOCHS``; their summaries. With ``mallory_first`` she trains alone until epoch ``MALLORY_ALONE``
    before the others start (they download her state: no one else has one)."""
    peers = Peers(swarm_peer, tmp_path, "centered-clip", batch_size)
    try:
        if mallory_first:
            peers.start("mallory", attack=attack, minutes=5)
            peers.joined("mallory")
            peers.wait_for("mallory", lambda e: e.get("epoch", 0) >= MALLORY_ALONE, 120)
        for name in ("ada", "bob", "cyd"):
            peers.start(name, minutes=5)
        if not mallory_first:
            peers.start("mallory", attack=attack, minutes=5)
        if nora is not None:
            peers.start("nora", attack=nora, minutes=5)
        for name in peers.procs:
            if name not in peers.peer_ids:
                peers.joined(name)
        first = peers.wait_for("ada", lambda e: e.get("averaged", 0) >= 4, 120)  # an attacker included
        # from her state, at her epoch: as many epochs after the first round as the others' run trains in all
        peers.train_until(("ada", "bob", "cyd"), first["epoch"] + EPOCHS if mallory_first else EPOCHS, 300)
        return peers, {name: peers.summary(name) for name in ("ada", "bob", "cyd")}
    finally:
        peers.stop()


def assert_trained_with_the_attacker(summaries: dict[str, dict], tmp_path: Path, from_her_state: bool = False) -> None:
    """Each honest peer's last loss under ``TRAINED`` times its first, or with ``from_her_state`` under
    ``FROM_HER_STATE`` times its loss at its first round with all four (its first step may still be its own model's:
    it downloads her state while it takes it)."""
    for name, summary in summaries.items():
        steps = trail(tmp_path / f"{name}.log")
        first = (
            next((loss for _, peers, loss in steps if peers == 4), None) if from_her_state else summary["first_loss"]
        )
        print(f"{name}: loss {first} -> {summary['last_loss']:.3f} at epoch {summary['epoch']}")
        with_attackers = sum(count for size, count in summary["rounds"].items() if int(size) >= 4)
        assert with_attackers >= 3, (name, summary)  # an attacker took part in the rounds
        assert first is not None, (name, steps)
        bound = FROM_HER_STATE if from_her_state else TRAINED
        assert summary["last_loss"] < bound * first, (name, summary, steps)


def test_centered_clip_keeps_training_while_one_peer_in_four_sends_gradients_times_minus_1000(swarm_peer, tmp_path):
    """Three honest volunteers and one whose every gradient part is its real one x -1000: with centered-clip the
    honest peers' loss goes down (under the plain mean it climbs: bench/byzantine.py). Each honest part is mostly
    noise at this batch: the attacker's part, clipped to that spread, would still cancel the gradient; it is far
    outside the spread, so it is left out.

    She starts the experiment alone, so the others download her state. Alone, her optimizer stepped on her own
    gradients x-1000: her parameters are an honest size (a few epochs of Adam, uphill), her optimizer statistics
    far from any honest peer's (second moments a million times larger, first moments uphill). The joiners take her
    parameters and epoch but keep their own statistics (``state_guard``). Taking hers, their loss rose from 5.3 to
    12.8 over 17 epochs in one run; in CI, one run of this test with the four started together stalled at
    2.30 -> 2.07 (a peer behind her at the first contact downloads her state too).

    Her parameters stay hers in the state rounds too (every epoch): an honest norm, which the norm bound cannot
    tell apart, and under the plain mean a quarter of every peer's parameters; under centered-clip the state
    rounds take each coordinate's median (``aggregation.ROBUST_STATE``). Keeping their own statistics but with
    mean state rounds, two runs ended at 0.59 and 0.83 of their first loss.

    The honest peers start from her parameters, moved uphill for several epochs (loss about 2.6 to 3.6 against 2.3
    untrained), and train from there more slowly than from the seeded model. With both protections, fifteen honest
    peers in five runs ended at 0.56 to 0.77 of their loss at their first round with her (three runs to epoch 30,
    about 23 epochs after that round; two runs 30 epochs after it, as the test runs now): hence the bound of 0.85.
    Taking her statistics, the loss rises; the median itself is asserted in tests/test_robust.py."""
    peers, summaries = honest_three_and("scale", swarm_peer, tmp_path, mallory_first=True)
    for name in summaries:
        steps = trail(tmp_path / f"{name}.log")
        assert steps[0][0] >= MALLORY_ALONE, (name, steps)  # it started from her state
    assert_trained_with_the_attacker(summaries, tmp_path, from_her_state=True)


def test_centered_clip_leaves_out_and_flags_peers_whose_gradients_point_against_the_swarm_or_nowhere(
    swarm_peer, tmp_path
):
    """Three honest volunteers, mallory, whose every gradient part is her real one sign-flipped, and nora, whose
    every part is random noise at her real part's norm (a freeloader: her parts train nothing). Both are at an
    honest norm, inside the honest parts' spread, where clipping cannot tell them apart in one round. Over rounds
    their standing in the honest reducers falls under the bound it is held to (``aggregation.Standing``): the
    reducers leave their parts out and flag each with the evidence of her standing (mallory's under zero: against
    the swarm's; nora's near it: unrelated to the swarm's), flag no honest peer, and the honest peers train.

    Steps of 128 samples (a target batch of 512): at the swarm's usual 32 (each part mostly noise, the honest parts'
    median standing about 0.3) nora's parts were left out but her standing (about 0.085) stood under the half of the
    median she is held to by 1.6 to 2.8 standard errors in 30 epochs, short of the flag's 3, and in two runs of
    three no reducer flagged her (docs/security.md: where parts are mostly noise, a noise part is screened, and
    flagged only on that evidence)."""
    peers, summaries = honest_three_and("flip", swarm_peer, tmp_path, nora="noise", batch_size=128)
    for attacker, reason in (("mallory", robust.DISSENT_REASON), ("nora", robust.UNRELATED_REASON)):
        who = peers.peer_ids[attacker]
        flagged = [n for n, s in summaries.items() if s["flags"].get(who, {}).get(reason, 0) >= 1]
        assert flagged, (attacker, summaries)
    assert_trained_with_the_attacker(summaries, tmp_path)
    for name, summary in summaries.items():
        left_out = [line for line in (tmp_path / f"{name}.log").read_text().splitlines() if "left out" in line]
        for honest in ("ada", "bob", "cyd"):
            flags = set(summary["flags"].get(peers.peer_ids[honest], {}))
            assert not flags & {robust.DISSENT_REASON, robust.UNRELATED_REASON}, (name, left_out)


def trail(log: Path) -> list[tuple[int, int, float]]:
    """(epoch, peers averaged with, loss) of every progress line in a peer's log: a failure's loss trail."""
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith('{"event": "progress"')]
    return [(e["epoch"], e["averaged"], round(e["loss"], 3)) for e in lines]


def test_non_finite_gradients_are_dropped_and_their_sender_flagged(swarm_peer, tmp_path):
    """A volunteer whose every gradient part is NaN: under the plain mean the honest peers drop its parts, train
    on, and flag it (the same swarm without the check would turn every honest parameter into NaN)."""
    peers = Peers(swarm_peer, tmp_path, "mean")
    try:
        for name in ("ada", "bob"):
            peers.start(name, minutes=1.0)
        peers.start("mallory", attack="nan", minutes=1.0)
        for name in ("ada", "bob", "mallory"):
            peers.joined(name)
        summaries = {name: peers.summary(name) for name in ("ada", "bob")}
        nan_sender = peers.summary("mallory")
    finally:
        peers.stop()
    # The reducers sent her back the average less her NaN part, NaN by her own doing: she flags no honest peer for
    # it (she used to, and then followed no one, cut off from the rounds where the server's witness would meet her).
    for honest in ("ada", "bob"):
        assert set(nan_sender["flags"].get(peers.peer_ids[honest], {})) <= robust.LOCAL_REASONS, nan_sender
    # Her NaN parts reached an honest reducer, which dropped them and flagged her. (Once flagged, her records no
    # longer set the honest peers' pace, so which honest peer met her in a round varies from run to run.)
    mallory = peers.peer_ids["mallory"]
    flagged = [n for n, s in summaries.items() if s["flags"].get(mallory, {}).get("non-finite gradients", 0) >= 1]
    assert flagged, summaries
    for name, summary in summaries.items():
        assert summary["last_loss"] == summary["last_loss"], (name, summary)  # not NaN
        assert summary["last_loss"] < 0.7 * summary["first_loss"], (name, summary)
        for honest in ("ada", "bob"):  # no evidence against an honest peer (a lagging epoch is only noted locally)
            assert set(summary["flags"].get(peers.peer_ids[honest], {})) <= robust.LOCAL_REASONS, (name, summary)


def test_a_peer_advertising_a_far_newer_state_cannot_hand_it_to_joiners(swarm_peer, tmp_path):
    """A volunteer serves its state with the parameters x100 and the epoch +1000, advertises it at the top
    priority and publishes progress records 1000 epochs ahead. The honest peers do not follow its epoch, and an
    honest volunteer who joins later loads the honest state (her loss starts where theirs is, not near 700)."""
    peers = Peers(swarm_peer, tmp_path, "mean")
    try:
        for name in ("ada", "bob"):
            peers.start(name, minutes=2.0)
        peers.start("mallory", attack="hijack", minutes=2.0)
        for name in ("ada", "bob", "mallory"):
            peers.joined(name)
        peers.wait_for("ada", lambda e: e.get("averaged", 0) >= 2 and e.get("epoch", 0) >= 3, 120)
        peers.start("joan", minutes=0.5)
        peers.joined("joan")
        first = peers.wait_for("joan", lambda e: e.get("event") == "progress", 90)
        joan = peers.summary("joan")
        for name in ("ada", "bob", "mallory"):  # joan's run is what this test waits for: the others end with it
            peers.end(name)
        honest = {name: peers.summary(name) for name in ("ada", "bob")}
    finally:
        peers.stop()
    mallory = peers.peer_ids["mallory"]
    assert first["epoch"] < 1000 and first["loss"] < 3.0, first
    assert joan["epoch"] < 1000 and joan["last_loss"] < 3.0, joan
    for name, summary in honest.items():
        assert summary["epoch"] < 1000 and summary["last_loss"] < summary["first_loss"], (name, summary)
    flagged = {reason for summary in (joan, *honest.values()) for reason in summary["flags"].get(mallory, {})}
    assert flagged & {"epoch ahead of the swarm", "state epoch ahead of the swarm"}, [joan, honest]
