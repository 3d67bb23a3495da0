"""Quotas per account, through the real API and forms, on SQLite and PostgreSQL: what one organizer's experiments
may cost the hub (running experiments, experiments created a day, server-run peers, training text), refused with a
message that names the quota, its limit and what to do, and nothing written; administrators are exempt."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import func, select

from swarmhub.server.models import Corpus, Experiment

from .conftest import api_token, login, make_experiment, make_user
from .support import FORM, SMALL, corpora_on_disk, inline_errors

pytestmark = pytest.mark.both_databases  # quota checks lock differently per dialect

DIGITS = {"title": "Digits", "task": "digits", "task_params": {"hidden_size": 32}}


@pytest.fixture
def vera(client, db):
    """A volunteer's account, not an administrator, with an API token."""
    make_user(db, "vera", is_admin=False)
    return api_token(client, "vera")


def create(client, headers, slug: str, **fields):
    return client.post("/api/experiments", json={**DIGITS, "slug": slug, **fields}, headers=headers)


def act(client, headers, slug: str, action: str):
    return client.post(f"/api/experiments/{slug}/status", json={"action": action}, headers=headers)


def statuses(db) -> dict[str, str]:
    with db() as session:
        return dict(session.execute(select(Experiment.slug, Experiment.status)).tuples().all())


def test_a_script_that_starts_experiments_is_stopped_at_the_running_quota(client, db, vera):
    answers = []
    for n in range(4):
        assert create(client, vera, f"run-{n}").status_code == 201
        answers.append(act(client, vera, f"run-{n}", "start"))
    assert [answer.status_code for answer in answers] == [200, 200, 403, 403]
    assert answers[2].json() == {
        "detail": "you already run 2 experiments, and the hub runs at most 2 per account (quota: running "
        "experiments): pause or finish one first"
    }
    assert statuses(db) == {"run-0": "running", "run-1": "running", "run-2": "draft", "run-3": "draft"}

    # Doing what the message says frees the slot.
    assert act(client, vera, "run-0", "finish").status_code == 200
    assert act(client, vera, "run-2", "start").json()["status"] == "running"
    assert act(client, vera, "run-3", "start").status_code == 403


def test_an_administrator_is_not_limited(client, db, settings):
    settings.quota_running_experiments = 1
    settings.quota_experiments_per_day = 1
    settings.quota_server_peers = 0
    make_user(db, "root", is_admin=True)
    root = api_token(client, "root")
    for n in range(3):
        assert create(client, root, f"admin-{n}").status_code == 201
        assert act(client, root, f"admin-{n}", "start").json()["status"] == "running"
    assert set(statuses(db).values()) == {"running"}


def test_an_administrator_may_start_a_volunteers_experiment_past_their_quota(client, db, settings, vera):
    settings.quota_running_experiments = 1
    make_user(db, "root", is_admin=True)
    create(client, vera, "mine-1")
    create(client, vera, "mine-2")
    assert act(client, vera, "mine-1", "start").status_code == 200
    assert act(client, vera, "mine-2", "start").status_code == 403
    assert act(client, api_token(client, "root"), "mine-2", "start").json()["status"] == "running"


def test_experiments_created_per_day(client, db, settings, vera):
    settings.quota_experiments_per_day = 3
    assert [create(client, vera, f"day-{n}").status_code for n in range(3)] == [201] * 3
    refused = create(client, vera, "day-3")
    assert refused.status_code == 429
    detail = refused.json()["detail"]
    assert detail.startswith(
        "you created 3 experiments in the last 24 hours, and the hub allows 3 per account a day (quota: experiments "
        "per day): create the next one after "
    )
    assert detail.endswith(" UTC, or edit one of your drafts")
    assert 86_000 < int(refused.headers["retry-after"]) <= 86_400
    assert sorted(statuses(db)) == ["day-0", "day-1", "day-2"]  # the refused one wrote nothing

    # A day after the first one, there is room for one more.
    with db.begin() as session:
        first = session.scalars(select(Experiment).where(Experiment.slug == "day-0")).one()
        first.created_at -= timedelta(hours=25)
    assert create(client, vera, "day-3").status_code == 201
    assert create(client, vera, "day-4").status_code == 429


def test_server_peers(client, db, settings, vera):
    """An auxiliary peer (on by default) is one server peer: with room for one, a second experiment that wants one
    does not start, one without does, and turning one on while it runs is refused too."""
    settings.quota_running_experiments = 5
    settings.quota_server_peers = 1
    create(client, vera, "with-aux")
    create(client, vera, "also-aux")
    create(client, vera, "no-aux", aux_peer=False)
    assert act(client, vera, "with-aux", "start").status_code == 200
    refused = act(client, vera, "also-aux", "start")
    assert refused.status_code == 403
    assert refused.json() == {
        "detail": "starting 'also-aux' would make the hub run 2 auxiliary and checkpoint peers for your experiments, "
        "and it runs at most 1 per account (quota: server peers): pause one of your running experiments, or turn off "
        "an auxiliary peer (aux_peer)"
    }
    assert act(client, vera, "no-aux", "start").status_code == 200

    turned_on = client.patch("/api/experiments/no-aux", json={"aux_peer": True}, headers=vera)
    assert turned_on.status_code == 403 and turned_on.json()["field"] == "aux_peer"
    assert "(quota: server peers)" in turned_on.json()["detail"]
    assert client.get("/api/experiments/no-aux", headers=vera).json()["aux_peer"] is False
    assert statuses(db) == {"with-aux": "running", "also-aux": "draft", "no-aux": "running"}


def test_starts_at_once_get_exactly_the_limit(live_server, client, db, vera):
    """Drafts started at the same moment through a real server's threads, each from a machine of its own, with one
    slot left: one of them runs."""
    assert create(client, vera, "first").status_code == 201
    assert act(client, vera, "first", "start").status_code == 200
    slugs = [f"draft-{n}" for n in range(8)]
    for slug in slugs:
        create(client, vera, slug)
    machines = [httpx.Client(base_url=live_server.url, headers=api_token(client, "vera"), timeout=60) for _ in slugs]
    for machine in machines:
        assert machine.get("/api/me").status_code == 200  # connected, so that the starts below leave together
    ready = threading.Barrier(len(slugs))

    def start(slug: str, machine: httpx.Client) -> int:
        ready.wait()
        return machine.post(f"/api/experiments/{slug}/status", json={"action": "start"}).status_code

    with ThreadPoolExecutor(len(slugs)) as pool:
        answers = list(pool.map(start, slugs, machines))
    for machine in machines:
        machine.close()
    assert sorted(answers) == [200] + [403] * 7
    assert sorted(statuses(db).values()) == ["draft"] * 7 + ["running"] * 2


def test_training_text_per_account(client, db, settings, vera, docstrings):
    settings.quota_corpus_mb = 1.5 * len(docstrings) / 2**20  # room for one text, not two
    albert = {"task": "albert-mlm", "task_params": {"size": "tiny"}}
    create(client, vera, "text-1", **albert)
    create(client, vera, "text-2", **albert)

    def upload(slug: str):
        files = {"file": ("docs.txt", docstrings, "text/plain")}
        return client.put(f"/api/experiments/{slug}/corpus", headers=vera, files=files, data=SMALL)

    assert upload("text-1").status_code == 200
    refused = upload("text-2")
    assert refused.status_code == 403
    size, limit = f"{len(docstrings) / 1024:.0f} KB", f"{int(1.5 * len(docstrings)) / 1024:.0f} KB"
    assert refused.json() == {
        "detail": f"this text is {size} and your other experiments' training text takes {size}, and the hub keeps "
        f"at most {limit} per account (quota: training text): give a smaller text, or ask "
        "the hub's administrators for room"
    }
    with db() as session:
        assert session.scalar(select(func.count()).select_from(Corpus)) == 1
    assert len(corpora_on_disk(settings)) == 1
    # An experiment's own text is replaced, not added to.
    assert upload("text-1").status_code == 200


def test_the_forms_show_the_quota_message(client, db, settings):
    settings.quota_experiments_per_day = 2
    settings.quota_running_experiments = 1
    vera = make_user(db, "vera", is_admin=False)
    make_experiment(db, vera, slug="already", status="running")
    csrf = login(client, "vera")
    form = {**FORM, "csrf_token": csrf}
    assert client.post("/experiments/new", data=form, follow_redirects=False).status_code == 303

    again = client.post("/experiments/new", data={**form, "slug": "digits-again"})
    assert again.status_code == 429
    assert inline_errors(again.text)["form"].startswith(
        "you created 2 experiments in the last 24 hours, and the hub allows 2 per account a day (quota: experiments "
        "per day): create the next one after "
    )
    assert 'value="digits-again"' in again.text  # what was typed is kept

    start = client.post("/experiments/digits-together/status", data={"action": "start", "csrf_token": csrf})
    assert start.status_code == 403
    assert (
        "you already run 1 experiment, and the hub runs at most 1 per account (quota: running experiments): pause "
        "or finish one first" in start.text
    )
    assert statuses(db) == {"already": "running", "digits-together": "draft"}
