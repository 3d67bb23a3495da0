"""The swarm's rate cap: a peer waits at least ``matchmaking_time`` between two optimizer steps, so an experiment's
settings let the whole swarm train at most ``target_batch_size / matchmaking_time`` samples a second. The API
states it, the form shows it as it is typed, the experiment page warns the organizer when one peer alone has
trained faster, and ``swarmhub doctor`` warns a volunteer whose machine alone would be held back."""

from __future__ import annotations

from datetime import timedelta

import torch

from swarmhub.common.protocol import ExperimentDetail
from swarmhub.server.models import utcnow
from swarmhub.worker.join import doctor

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


# -- the task's proposal ---------------------------------------------------------------------------------------------


def test_an_experiment_created_without_settings_gets_its_tasks_proposal(client, db):
    make_user(db, "olga")
    headers = api_token(client, "olga")
    digits = client.post("/api/experiments", headers=headers, json={"slug": "plain", "title": "Plain"})
    assert digits.status_code == 201, digits.text
    body = digits.json()
    proposal = client.get("/api/tasks/digits/proposal").json()
    assert (body["target_batch_size"], body["matchmaking_time"], body["averaging_timeout"]) == (
        proposal["target_batch_size"], proposal["matchmaking_time"], proposal["averaging_timeout"]
    )  # fmt: skip
    # the plain defaults (256 per 3 s) would cap the swarm at 85 samples/s; one reference peer trains ~100,000
    assert body["max_swarm_samples_per_second"] >= body["proposal"]["reference_samples_per_second"]
    assert body["warnings"] == []
    albert = client.post(
        "/api/experiments",
        headers=headers,
        json={"slug": "words", "title": "Words", "task": "albert-mlm", "task_params": {"size": "tiny"}},
    ).json()
    assert (albert["target_batch_size"], albert["matchmaking_time"], albert["averaging_timeout"]) == (8192, 5.0, 60.0)
    # and the optimizer the task trains well with, at the rate it proposes for that batch (digits proposes none)
    proposed = client.get("/api/tasks/albert-mlm/proposal", params={"size": "tiny"}).json()
    assert (albert["optimizer"], albert["learning_rate"]) == ("lamb", proposed["learning_rate"])
    assert (proposal["optimizer"], proposal["learning_rate"], body["optimizer"]) == (None, None, "adam")
    # a learning rate the organizer sets is kept with the default optimizer; a rate for their own batch is proposed
    rate = client.post(
        "/api/experiments",
        headers=headers,
        json={
            "slug": "rate",
            "title": "Rate",
            "task": "albert-mlm",
            "task_params": {"size": "tiny"},
            "learning_rate": 0.003,
        },
    ).json()
    assert (rate["optimizer"], rate["learning_rate"]) == ("adam", 0.003)
    small = client.post(
        "/api/experiments",
        headers=headers,
        json={
            "slug": "small",
            "title": "Small",
            "task": "albert-mlm",
            "task_params": {"size": "tiny"},
            "target_batch_size": 256,
        },
    ).json()
    assert small["optimizer"] == "lamb" and small["learning_rate"] < albert["learning_rate"]
    # what the organizer sets is kept; only the settings left out are proposed
    mine = client.post(
        "/api/experiments", headers=headers, json={"slug": "mine", "title": "Mine", "target_batch_size": 64}
    ).json()
    assert (mine["target_batch_size"], mine["matchmaking_time"]) == (64, proposal["matchmaking_time"])


def test_the_proposal_keeps_the_planned_swarm_unthrottled(client):
    for task, params in (
        ("digits", {}),
        ("digits", {"hidden_size": 4096, "batch_size": 32}),
        ("albert-mlm", {"size": "tiny"}),
        ("albert-mlm", {"size": "large"}),
    ):
        for peers in (1, 8, 300):
            answer = client.get(f"/api/tasks/{task}/proposal", params={**params, "planned_peers": peers})
            assert answer.status_code == 200, answer.text
            p = answer.json()
            assert p["planned_peers"] == peers
            assert p["rate_cap"] == p["target_batch_size"] / p["matchmaking_time"]
            # unthrottled: the cap holds the planned peers' rate, unless the largest target allowed is not enough
            assert p["rate_cap"] >= peers * p["reference_samples_per_second"] or p["target_batch_size"] == 1_048_576
            assert p["unthrottled_peers"] == round(p["rate_cap"] / p["reference_samples_per_second"], 1)
    one, many = (client.get("/api/tasks/albert-mlm/proposal", params={"size": "tiny", "planned_peers": n}).json()
                 for n in (8, 300))  # fmt: skip
    assert many["target_batch_size"] > one["target_batch_size"]
    # a wider digits model trains fewer samples a second, so the same swarm needs a smaller batch
    narrow, wide = (client.get("/api/tasks/digits/proposal", params={"hidden_size": h, "planned_peers": 1}).json()
                    for h in (64, 4096))  # fmt: skip
    assert wide["reference_samples_per_second"] < narrow["reference_samples_per_second"]


def test_a_bad_proposal_question_names_what_is_wrong(client):
    wrong = client.get("/api/tasks/digits/proposal", params={"hidden_size": "wide"})
    assert wrong.status_code == 422 and wrong.json()["detail"][0]["loc"] == ["query", "hidden_size"]
    unknown = client.get("/api/tasks/digits/proposal", params={"layers": 3})
    assert unknown.status_code == 422 and unknown.json()["detail"][0]["loc"] == ["query", "layers"]
    peers = client.get("/api/tasks/digits/proposal", params={"planned_peers": 0})
    assert peers.status_code == 422 and peers.json()["detail"][0]["loc"] == ["query", "planned_peers"]
    missing = client.get("/api/tasks/no-such-task/proposal")
    assert missing.status_code == 404 and missing.json()["field"] == "task"


def test_the_api_warns_when_the_settings_cap_the_swarm_below_one_peer(client, db):
    olga = make_user(db, "olga")
    make_user(db, "alice")
    headers = api_token(client, "olga")
    experiment = make_experiment(db, olga, slug="held", status="paused", target_batch_size=1_048_576)
    assert client.get("/api/experiments/held", headers=headers).json()["warnings"] == []
    # below one reference peer: told at once, before anyone joined
    changed = client.patch("/api/experiments/held", headers=headers, json={"target_batch_size": 256})
    assert changed.status_code == 200, changed.text
    (warning,) = changed.json()["warnings"]
    assert warning["field"] == "target_batch_size"
    assert "caps the whole swarm at 128 samples/s" in warning["message"]
    assert "one reference peer (one CPU thread) trains on this task" in warning["message"]
    # a wide model's reference peer is slower than this cap, but a peer of the swarm has signed 500,000 samples/s
    client.patch(
        "/api/experiments/held",
        headers=headers,
        json={"task_params": {"hidden_size": 4096, "batch_size": 32}, "target_batch_size": 65_536},
    )
    observe(db, experiment.id, utcnow() - timedelta(seconds=1), ("alice", "QmAlice", 0, 64), samples_per_second=5e5)
    (warning,) = client.get("/api/experiments/held", headers=headers).json()["warnings"]
    assert "one peer of this experiment alone has trained: raise it to at least 1,000,000" in warning["message"]
    # that rate is the organizer's to see, as on the experiment page
    assert client.get("/api/experiments/held").json()["warnings"] == []
    assert client.get("/api/experiments/held", headers=api_token(client, "alice")).json()["warnings"] == []
