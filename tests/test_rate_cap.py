"""The swarm's rate cap: a peer waits at least ``matchmaking_time`` between two optimizer steps, so an experiment's
settings let the whole swarm train at most ``target_batch_size / matchmaking_time`` samples a second. The API
states it, the form shows it as it is typed, the experiment page warns the organizer when one peer alone has
trained faster, and ``swarmhub doctor`` warns a volunteer whose machine alone would be held back."""

from __future__ import annotations

from datetime import timedelta

import torch

from swarmhub.server.models import utcnow
from swarmhub.worker import doctor
from swarmhub.worker.protocol import ExperimentDetail

from .conftest import api_token, login, make_experiment, make_user
from .support import observe


def test_the_api_states_the_cap_and_follows_a_change_of_settings(client, db):
    olga = make_user(db, "olga")
    make_experiment(db, olga, slug="capped", status="paused", target_batch_size=128, matchmaking_time=2.0)
    assert client.get("/api/experiments/capped").json()["max_swarm_samples_per_second"] == 64.0
    # how it trains changes only while paused
    changed = client.patch(
        "/api/experiments/capped", headers=api_token(client, "olga"), json={"target_batch_size": 4096}
    )
    assert changed.status_code == 200, changed.text
    assert changed.json()["max_swarm_samples_per_second"] == 2048.0
    assert client.get("/api/experiments/capped").json()["max_swarm_samples_per_second"] == 2048.0


def test_the_organizer_is_warned_when_one_peer_outruns_the_cap(client, db):
    olga = make_user(db, "olga")
    make_user(db, "alice")
    # a cap of 16 samples/s; alice's peer has trained at 40 samples/s in its signed records
    experiment = make_experiment(db, olga, slug="slow", status="running", target_batch_size=32, matchmaking_time=2.0)
    observe(db, experiment.id, utcnow() - timedelta(seconds=1), ("alice", "QmAlice", 0, 64))
    login(client, "olga")
    page = client.get("/experiments/slow").text
    assert "at most 16 samples/s for the whole swarm" in page
    assert "One peer alone has trained at 40 samples/s" in page
    assert "Raise the target batch size to at least\n          80." in page  # 40 samples/s x 2 s
    client.cookies.clear()
    login(client, "alice")  # a volunteer sees the cap, not the organizer's warning
    page = client.get("/experiments/slow").text
    assert "at most 16 samples/s for the whole swarm" in page and "One peer alone" not in page


def test_no_warning_when_the_cap_is_above_every_peer(client, db):
    olga = make_user(db, "olga")
    experiment = make_experiment(db, olga, slug="fast", status="running", target_batch_size=4096, matchmaking_time=2.0)
    observe(db, experiment.id, utcnow() - timedelta(seconds=1), ("olga", "QmOlga", 0, 64))
    login(client, "olga")
    page = client.get("/experiments/fast").text
    assert "at most 2,048 samples/s for the whole swarm" in page and "One peer alone" not in page


def _detail(target: int, matchmaking: float) -> ExperimentDetail:
    return ExperimentDetail.model_validate(
        {"slug": "d", "title": "d", "description": "", "status": "running", "owner": "olga", "task": "digits",
         "created_at": utcnow(), "task_params": {"hidden_size": 32}, "target_batch_size": target,
         "matchmaking_time": matchmaking}
    )  # fmt: skip


def test_doctor_warns_when_this_machine_alone_outruns_the_cap():
    throttled = doctor.check_throughput(_detail(8, 4.0), torch.device("cpu"), seconds=0.5)  # a cap of 2 samples/s
    assert throttled.status == doctor.WARN, throttled
    assert "at most 2 samples/s" in throttled.detail and "most of its time waiting" in throttled.detail
    assert throttled.fix.startswith("ask the organizer to raise the target batch size to at least")
    ample = doctor.check_throughput(_detail(1_048_576, 0.5), torch.device("cpu"), seconds=0.5)
    assert ample.status == doctor.OK and "samples/s on 'digits'" in ample.detail, ample
