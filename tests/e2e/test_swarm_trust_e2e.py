"""End to end: strangers with valid accounts attack a running experiment, against a real `swarmhub server` (its
bootstrap/monitor peer and its auxiliary peer, the swarm's witness) and an honest `swarmhub join`.

- mallory joins through the public API and runs a peer that trains nothing but publishes, every second, a signed
  progress record one epoch ahead of the swarm with twice the target batch (the forged-credit attack);
- nina runs the real worker (`swarmhub join`) patched to put NaN into every gradient round.

The leaderboard credits mallory nothing and credits the honest volunteer; with the organizer's automatic removal
after one flag, nina is removed (the server's witness dropped her parts and flagged her) and the honest volunteer
trains to the end.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ..conftest import PASSWORD
from ..processes import SWARMHUB, http, last_epoch, outlived, running_server, signup, wait_volunteers

pytestmark = [pytest.mark.e2e, pytest.mark.solo, pytest.mark.timeout(420)]  # see tests/lanes.py
SLUG = "open-digits"

# A peer with a valid token that publishes forged progress records: epoch one past the swarm's, samples at twice
# the target batch, once a second, signed by its own (admitted) key.
FORGER = """
import json, sys, time
from pathlib import Path
from typing import Any
import hivemind
from hivemind.dht.schema import RSASignatureValidator, SchemaValidator
from hivemind.optim.progress_tracker import LocalTrainingProgress, TrainingProgressSchema
from hivemind.utils.timed_storage import get_dht_time
from swarmhub.worker.swarm import access as swarm_access
from swarmhub.common.protocol import JoinResponse

join = JoinResponse.model_validate_json(Path(sys.argv[1]).read_text())
identity, seconds = Path(sys.argv[2]), float(sys.argv[3])
key = swarm_access.load_or_create_identity(identity)
swarm_access.use_as_process_key(key)
token = swarm_access.token_from_wire(join.swarm_token.model_dump())
experiment_key = swarm_access.public_key_from_text(join.experiment_public_key)
authorizer = swarm_access.SwarmAuthorizer(key, experiment_key, join.run_id, lambda: token, first_token=token)
dht = hivemind.DHT(initial_peers=join.initial_peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"], authorizer=authorizer,
                   identity_path=str(identity), start=True)
swarm_access.add_roster_validators(dht, join.run_id, key)
dht.add_validators([SchemaValidator(TrainingProgressSchema, prefix=join.run_id)])
assert swarm_access.publish_roster_entry(dht, join.run_id, token)
validator = RSASignatureValidator(key)
published, deadline = 0, time.monotonic() + seconds
while time.monotonic() < deadline:
    found = dht.get(f"{join.run_id}_progress", latest=True)
    values = [v.value for v in (found.value.values() if found else []) if v.value is not None]
    epochs = [LocalTrainingProgress.parse_obj(value).epoch for value in values]
    record = LocalTrainingProgress(peer_id=dht.peer_id.to_bytes(), epoch=max(epochs, default=0) + 1,
                                   samples_accumulated=2 * join.experiment.target_batch_size,
                                   samples_per_second=100_000.0, time=get_dht_time(), client_mode=False)
    stored = dht.store(f"{join.run_id}_progress", subkey=validator.local_public_key, value=record.dict(),
                       expiration_time=get_dht_time() + 60)
    if stored and not published:
        print(json.dumps({"first": record.epoch}), flush=True)
    published += bool(stored)
    time.sleep(1.0)
print(json.dumps({"published": published, "peer_id": dht.peer_id.to_base58()}), flush=True)
dht.shutdown()
"""

# `swarmhub join` with every gradient round it sends made NaN.
NAN_WORKER = """
import sys
import torch
from hivemind.optim.grad_averager import GradientAverager
load = GradientAverager.load_accumulators_into_averager_
def poisoned(self):
    load(self)
    with torch.no_grad(), self.get_tensors() as tensors:
        for tensor in tensors:
            tensor.fill_(float("nan"))
GradientAverager.load_accumulators_into_averager_ = poisoned
from swarmhub.worker.cli.main import main
sys.argv = ["swarmhub", *sys.argv[1:]]
main()
"""


def volunteer_env(tmp: Path, name: str, url: str, token: str) -> dict[str, str]:
    env = {**os.environ, "SWARMHUB_CONFIG_DIR": str(tmp / name), "SWARMHUB_STATE_DIR": str(tmp / name)}
    env.pop("SWARMHUB_TOKEN", None)
    login = subprocess.run(
        [*SWARMHUB, "login", "--server", url, "--with-token"],
        input=token + "\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert login.returncode == 0, login.stderr
    return env


def start_open_digits(url: str, organizer: dict[str, str], **settings: Any) -> None:
    """The organizer creates and starts the open digits experiment (the server's witness on unless ``settings``
    turn it off)."""
    created = http.post(
        f"{url}/api/experiments",
        headers=organizer,
        json={
            "slug": SLUG,
            "title": "Open digits",
            "task": "digits",
            "task_params": {"hidden_size": 64, "batch_size": 32},
            "target_batch_size": 128,
            "matchmaking_time": 2.0,
            "averaging_timeout": 20.0,
            "learning_rate": 0.003,
            **settings,
        },
    )
    assert created.status_code == 201, created.text
    assert created.json()["aux_peer"] is settings.get("aux_peer", True)  # the witness runs by default
    started = http.post(f"{url}/api/experiments/{SLUG}/status", headers=organizer, json={"action": "start"})
    assert started.json()["status"] == "running"


def start_volunteers(
    url: str, tmp: Path, *volunteers: tuple[str, str | None], minutes: float = 1.5
) -> list[tuple[str, Any, Any]]:
    """Each (name, script) signs up and runs `swarmhub join` for ``minutes``: the real CLI, or ``script`` (a patched
    worker that calls it). Of a run's first 30 s or so on a busy machine, most go to starting the worker and joining
    the swarm."""
    workers = []
    for name, script in volunteers:
        env = volunteer_env(tmp, name, url, signup(url, name))
        out = open(tmp / f"{name}.out", "wb")  # noqa: SIM115 - closed by wait_volunteers
        command = ["join", SLUG, "--max-minutes", str(minutes), "--listen", "/ip4/127.0.0.1/tcp/0"]
        argv = [sys.executable, "-c", script, *command] if script else [*SWARMHUB, *command]
        workers.append((name, out, subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)))
    return workers


def start_forger(url: str, tmp: Path, seconds: float) -> subprocess.Popen[str]:
    """mallory signs up, joins through the public API with her own key and runs FORGER for ``seconds``; returns once
    her first record and a few more are in the swarm (before any volunteer's: the hardest order, as for a while
    hers are the only records there are)."""
    from swarmhub.worker.swarm import access as swarm_access

    mallory = {"Authorization": f"Bearer {signup(url, 'mallory')}"}
    identity = tmp / "mallory.key"
    public_key = swarm_access.load_or_create_identity(identity).get_public_key().to_bytes().decode()
    deadline = time.monotonic() + 120
    while True:  # as the CLI does: a 503 while the swarm starts says when to try again
        joined = http.post(
            f"{url}/api/experiments/{SLUG}/join", headers=mallory, json={"peer_public_key": public_key}, timeout=60
        )
        if joined.status_code != 503 or time.monotonic() > deadline:
            break
        time.sleep(float(joined.headers.get("Retry-After", "3")))
    assert joined.status_code == 200, joined.text
    (tmp / "mallory.json").write_text(joined.text)
    forger = subprocess.Popen(
        [sys.executable, "-c", FORGER, str(tmp / "mallory.json"), str(identity), str(seconds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert forger.stdout is not None
    first = forger.stdout.readline()
    assert first.startswith('{"first"'), (first, forger.stderr.read()[-3000:] if forger.poll() else "")
    time.sleep(5.0)  # a few more, ratcheting
    return forger


def forged(forger: subprocess.Popen[str]) -> int:
    """Wait for the forger; how many records it stored."""
    rest, errors = forger.communicate(timeout=180)
    assert forger.returncode == 0, errors[-3000:]
    return int(json.loads(rest.splitlines()[-1])["published"])


def test_forged_records_earn_nothing_and_flagged_volunteers_are_removed(tmp_path):
    with running_server(tmp_path) as (url, _):
        organizer = {"Authorization": f"Bearer {signup(url, 'organizer')}"}
        start_open_digits(url, organizer, auto_remove_flags=1)

        forger = start_forger(url, tmp_path, seconds=60)
        workers = start_volunteers(url, tmp_path, ("ada", None), ("nina", NAN_WORKER))
        assert forged(forger) >= 30  # once a second for 60 s: at least half of them stored, on a busy machine

        # Her whole 1.5 min: the credit asserted below is a share of all she contributed, which a run stopped as
        # soon as she is 10 epochs in does not bound (one such run had her contribute 1,312 samples, 288 credited).
        seen_children, outputs = wait_volunteers(workers, tmp_path)
        token = http.post(f"{url}/api/auth/token", json={"username": "organizer", "password": PASSWORD})
        board = http.get(
            f"{url}/api/experiments/{SLUG}/leaderboard",
            headers={"Authorization": f"Bearer {token.json()['access_token']}"},
        ).json()
        denied = http.get(f"{url}/api/experiments/{SLUG}/denylist", headers=organizer).json()
    rows = {entry["username"]: entry for entry in board}
    # The honest volunteer trained on while mallory forged and after nina was removed (each had stalled her: a
    # witness restating the forger's epoch, a removed peer's state refused at every step): most of her work went
    # through rounds the server's witness saw.
    done = re.search(r"Done: [\d,]+ steps, ([\d,]+) samples contributed, swarm epoch (\d+)", outputs["ada"])
    assert done, outputs["ada"][-3000:]
    contributed, epoch = int(done.group(1).replace(",", "")), int(done.group(2))
    assert epoch >= 10, outputs["ada"][-3000:]
    assert rows["ada"]["samples"] >= 0.3 * contributed, (contributed, board)
    assert rows.get("mallory", {"samples": 0})["samples"] == 0, board  # 60 forged records: nothing verified
    assert "refused data" in " ".join(rows["nina"]["flags"]), board
    assert not any("refused data" in flag for flag in rows["ada"]["flags"]), board
    assert rows["nina"]["samples"] == 0, board  # none of her rounds' parts were finite
    processes = {name: process for name, _, process in workers}
    assert processes["ada"].returncode == 0, outputs["ada"][-3000:]
    assert denied == {"usernames": ["nina"]}, denied  # removed by the organizer's rule, and no one else
    assert outlived(seen_children) == set()


# `swarmhub join` that does a fraction of an honest peer's work (a pause before each step) and claims a weight of a
# million samples in every gradient round it joins.
OVERCLAIMER = """
import sys, time
from hivemind.optim.grad_averager import GradientAverager
from hivemind.optim.optimizer import Optimizer
average = GradientAverager.step
def overclaimed(self, weight=None, **kwargs):
    return average(self, weight=1e6, **kwargs)
GradientAverager.step = overclaimed
step = Optimizer.step
def slow(self, *args, **kwargs):
    time.sleep(0.3)
    return step(self, *args, **kwargs)
Optimizer.step = slow
from swarmhub.worker.cli.main import main
sys.argv = ["swarmhub", *sys.argv[1:]]
main()
"""


def test_a_huge_claimed_weight_earns_no_more_than_the_honest_peer_and_is_flagged(tmp_path):
    """vera runs the real worker claiming a million samples in every round while doing a fraction of ada's work.
    The reducers count her claim at the target batch at most, the ledger credits her peer at most what ada's gained
    over the same minutes, and the server's witness flags her for the organizer whenever it credits her."""
    with running_server(tmp_path) as (url, _):
        organizer = {"Authorization": f"Bearer {signup(url, 'organizer')}"}
        start_open_digits(url, organizer)
        # a minute: what is asserted is who is credited how much, not how far they trained
        workers = start_volunteers(url, tmp_path, ("ada", None), ("vera", OVERCLAIMER), minutes=1.0)
        seen_children, outputs = wait_volunteers(workers, tmp_path)
        time.sleep(5)  # the monitor's last read of the witness's rounds
        board = http.get(f"{url}/api/experiments/{SLUG}/leaderboard", headers=organizer).json()
    rows = {entry["username"]: entry for entry in board}
    assert rows["ada"]["samples"] > 0, (board, outputs["ada"][-3000:])
    assert rows["vera"]["samples"] <= rows["ada"]["samples"], board
    # The witness flags a claim in any round in which it reduces one of her parts, and credits her only for a round
    # in which it reduced all of them: she is never credited unflagged. (Whether she reaches a round with the witness
    # at all depends on her peer: lagging behind the swarm, it spends its time catching up and may never average.)
    flagged = "refused data" in " ".join(rows["vera"]["flags"])
    assert flagged or rows["vera"]["samples"] == 0, board
    assert not any("refused data" in flag for flag in rows["ada"]["flags"]), board
    assert outlived(seen_children) == set()


def test_a_forger_first_in_a_swarm_without_the_witness_stalls_no_one_for_long(tmp_path):
    """The organizer turned the server's witness off (``aux_peer: false``): no record of the hub bounds the epochs
    volunteers follow, and a newcomer follows the other accounts' records. mallory forges from before anyone joins;
    ada and bob (the real CLI) find no state at her epoch, leave her records out, and train together."""
    with running_server(tmp_path) as (url, _):
        organizer = {"Authorization": f"Bearer {signup(url, 'organizer')}"}
        start_open_digits(url, organizer, aux_peer=False)
        forger = start_forger(url, tmp_path, seconds=60)
        workers = start_volunteers(url, tmp_path, ("ada", None), ("bob", None))
        assert forged(forger) >= 30

        def read_logs() -> dict[str, str]:
            paths = {name: tmp_path / name / "logs" / f"{SLUG}.log" for name in ("ada", "bob")}
            return {name: path.read_text(errors="replace") if path.exists() else "" for name, path in paths.items()}

        def trained_past_her() -> bool:
            if any(last_epoch(tmp_path / f"{name}.out") < 10 for name in ("ada", "bob")):
                return False
            return any("found no state at the epoch" in log for log in read_logs().values())

        # through mallory's whole minute, until both are 10 epochs in and left her records out (1.5 min bound)
        seen_children, outputs = wait_volunteers(workers, tmp_path, until=trained_past_her)
    logs = read_logs()
    # they followed her records (hers were the only other account's), found no state at her epoch and left them out
    assert any("found no state at the epoch" in log for log in logs.values()), outputs
    for name in ("ada", "bob"):
        done = re.search(r"Done: [\d,]+ steps, [\d,]+ samples contributed, swarm epoch (\d+)", outputs[name])
        assert done, outputs[name][-3000:]
        assert int(done.group(1)) >= 10, outputs[name][-3000:]
    assert outlived(seen_children) == set()
