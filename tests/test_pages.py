"""Pages through the real forms: sign-up, login, logout, CSRF, the experiment form and its inline errors."""

from __future__ import annotations

import re

from sqlalchemy import func, select

from swarmhub.server.models import Experiment, User, WebSession

from .conftest import PASSWORD, csrf_from, login, make_experiment, make_user
from .support import FORM, inline_errors


def test_signup_logs_in_and_first_user_is_admin(client):
    token = csrf_from(client.get("/signup").text)
    response = client.post(
        "/signup", data={"username": "alice", "password": PASSWORD, "csrf_token": token}, follow_redirects=False
    )
    assert response.status_code == 303
    account = client.get("/account").text
    assert "alice" in account and "administrator" in account


def test_signup_errors_are_inline(client, db):
    make_user(db, "alice")
    token = csrf_from(client.get("/signup").text)
    short = client.post("/signup", data={"username": "bob", "password": "short", "csrf_token": token})
    assert short.status_code == 422
    assert "password" in inline_errors(short.text)
    taken = client.post("/signup", data={"username": "ALICE", "password": PASSWORD, "csrf_token": token})
    assert taken.status_code == 409
    assert inline_errors(taken.text) == {"username": "that username is taken"}


RESERVED = "that username is reserved for the swarm peers of the server"


def test_signup_refuses_the_server_peers_name_and_its_look_alikes(client, db):
    """The server's own swarm peers hold tokens as "swarmhub": an account by that name would be credited with
    their work, and banning it would cut them off."""
    token = csrf_from(client.get("/signup").text)
    for name in ("swarmhub", "SwarmHub", "swarm-hub", "Swarm_Hub"):
        refused = client.post("/signup", data={"username": name, "password": PASSWORD, "csrf_token": token})
        assert refused.status_code == 409, name
        assert inline_errors(refused.text) == {"username": RESERVED}
    with db() as session:
        assert session.scalar(select(func.count(User.id))) == 0
    fan = client.post(
        "/signup", data={"username": "swarmhub-fan", "password": PASSWORD, "csrf_token": token}, follow_redirects=False
    )
    assert fan.status_code == 303


def test_wrong_password_says_so(client, db):
    make_user(db)
    token = csrf_from(client.get("/login").text)
    response = client.post("/login", data={"username": "alice", "password": "nope-nope", "csrf_token": token})
    assert response.status_code == 401
    assert inline_errors(response.text) == {"password": "wrong username or password"}


def test_forms_without_csrf_token_are_refused(client, db):
    make_user(db)
    client.get("/login")
    response = client.post("/login", data={"username": "alice", "password": PASSWORD})
    assert response.status_code == 403
    assert client.get("/account", follow_redirects=False).status_code == 303  # still logged out
    csrf = login(client)
    forged = client.post("/experiments/new", data={**FORM, "csrf_token": "forged"})
    assert forged.status_code == 403
    assert client.post("/experiments/new", data={**FORM, "csrf_token": csrf}, follow_redirects=False).status_code == 303


def test_logout_really_ends_the_session(client, db):
    make_user(db)
    csrf = login(client)
    cookie = client.cookies.get("swarmhub_session")
    assert client.post("/logout", data={"csrf_token": csrf}, follow_redirects=False).status_code == 303
    with db() as session:
        assert session.scalar(select(func.count(WebSession.id))) == 0
    client.cookies.set("swarmhub_session", cookie)  # replaying the old cookie gets nothing
    assert client.get("/account", follow_redirects=False).headers["location"] == "/login?next=/account"


def test_login_redirect_stays_on_site(client, db):
    make_user(db)
    token = csrf_from(client.get("/login").text)
    response = client.post(
        "/login",
        data={"username": "alice", "password": PASSWORD, "csrf_token": token, "next": "//evil.example/x"},
        follow_redirects=False,
    )
    assert response.headers["location"] == "/"


def test_create_experiment_through_the_form(client, db):
    make_user(db)
    csrf = login(client)
    # the server's auxiliary peer (the swarm's witness) is ticked on a new experiment's form; this one unticks it
    assert 'name="aux_peer" value="true" checked' in client.get("/experiments/new").text
    form = {**FORM, "csrf_token": csrf, "aux_peer": "false"}
    response = client.post("/experiments/new", data=form, follow_redirects=False)
    assert response.headers["location"] == "/experiments/digits-together"
    with db() as session:
        experiment = session.scalar(select(Experiment))
        assert experiment.task_params == {"hidden_size": 48, "batch_size": 16}
        assert (experiment.learning_rate, experiment.target_batch_size) == (0.002, 128)
    page = client.get("/experiments/digits-together").text
    assert "Digits together" in page and 'value="start"' in page

    def stored() -> tuple[bool, str]:
        with db() as session:
            experiment = session.scalar(select(Experiment))
            return experiment.aux_peer, experiment.overlap

    assert stored() == (False, "none")  # the unticked box (only its hidden "false" was sent), the default overlap
    form = {**FORM, "csrf_token": csrf, "overlap": "delayed-step", "aux_peer": ["false", "true"]}
    assert client.post("/experiments/digits-together/edit", data=form, follow_redirects=False).status_code == 303
    assert stored() == (True, "delayed-step")
    form["aux_peer"] = "false"  # unticked again
    client.post("/experiments/digits-together/edit", data=form, follow_redirects=False)
    assert stored() == (False, "delayed-step")


def test_invalid_form_shows_inline_errors_and_creates_nothing(client, db):
    make_user(db)
    csrf = login(client)
    bad = {**FORM, "csrf_token": csrf, "slug": "-bad-", "learning_rate": "-1", "param.digits.hidden_size": "1"}
    response = client.post("/experiments/new", data=bad)
    assert response.status_code == 422
    errors = inline_errors(response.text)
    assert set(errors) == {"slug", "learning_rate", "param-digits-hidden_size"}
    assert "greater than or equal to 4" in errors["param-digits-hidden_size"]
    assert 'value="Digits together"' in response.text  # what was typed is kept
    with db() as session:
        assert session.scalar(select(func.count(Experiment.id))) == 0


def test_edit_and_move_through_statuses(client, db):
    owner = make_user(db)
    make_experiment(db, owner, slug="lifecycle")
    csrf = login(client)
    edited = client.post(
        "/experiments/lifecycle/edit", data={**FORM, "csrf_token": csrf, "title": "Renamed"}, follow_redirects=False
    )
    assert edited.status_code == 303
    for action, status in [("start", "running"), ("pause", "paused"), ("start", "running"), ("finish", "finished")]:
        client.post("/experiments/lifecycle/status", data={"action": action, "csrf_token": csrf})
        assert client.get("/api/experiments/lifecycle").json()["status"] == status
    assert client.get("/api/experiments/lifecycle").json()["title"] == "Renamed"
    refused = client.post("/experiments/lifecycle/status", data={"action": "start", "csrf_token": csrf})
    assert refused.status_code == 409
    assert "cannot start an experiment that is finished" in refused.text


def test_others_cannot_manage(client, db):
    owner = make_user(db)
    make_user(db, "mallory")
    make_experiment(db, owner, slug="theirs", status="running")
    csrf = login(client, "mallory")
    page = client.get("/experiments/theirs").text
    assert 'value="pause"' not in page
    response = client.post("/experiments/theirs/status", data={"action": "finish", "csrf_token": csrf})
    assert response.status_code == 403
    assert client.get("/experiments/theirs/edit").status_code == 403
    assert client.get("/api/experiments/theirs").json()["status"] == "running"


def test_dashboard_is_public_but_drafts_are_not(client, db):
    owner = make_user(db)
    make_experiment(db, owner, slug="live-one", status="running")
    make_experiment(db, owner, slug="draft-one")
    assert client.get("/experiments/live-one").status_code == 200
    assert client.get("/experiments/draft-one").status_code == 404
    index = client.get("/").text
    assert "live-one" in index and "draft-one" not in index


def test_account_tokens_are_shown_once_and_revocable(client, db):
    make_user(db)
    csrf = login(client)
    page = client.post("/account/tokens", data={"name": "laptop", "csrf_token": csrf}).text
    token = re.search(r'<code id="new-token">([^<]+)</code>', page).group(1)
    headers = {"Authorization": f"Bearer {token}"}
    assert client.get("/api/me", headers=headers).status_code == 200
    assert token not in client.get("/account").text
    token_id = re.search(r"/account/tokens/(\d+)/revoke", client.get("/account").text).group(1)
    client.post(f"/account/tokens/{token_id}/revoke", data={"csrf_token": csrf})
    assert client.get("/api/me", headers=headers).status_code == 401


def test_form_sets_who_may_join(client, db):
    make_user(db)
    csrf = login(client)
    data = {**FORM, "csrf_token": csrf, "join_policy": "allowlist", "allowlist": "bob, carol\ndave"}
    assert client.post("/experiments/new", data=data, follow_redirects=False).status_code == 303
    with db() as session:
        experiment = session.scalar(select(Experiment))
        assert (experiment.join_policy, experiment.allowlist) == ("allowlist", ["bob", "carol", "dave"])
    bad = client.post("/experiments/new", data={**data, "slug": "other-one", "allowlist": "ok <script>"})
    assert bad.status_code == 422
    assert "allowlist" in inline_errors(bad.text)
    client.post("/experiments/digits-together/edit", data={**data, "join_policy": "invite"})
    page = client.get("/experiments/digits-together").text
    assert "/experiments/digits-together/invite/" in page


def test_favicon_answers_on_every_page(client):
    icon = client.get("/favicon.ico")
    assert icon.status_code == 200 and icon.headers["content-type"] == "image/x-icon"
    assert icon.content[:4] == b"\x00\x00\x01\x00"  # an ICO file's header
    for path in ("/", "/login", "/experiments/nope"):  # the error page links it too
        assert '<link rel="icon" href="/static/favicon.svg"' in client.get(path).text, path
    svg = client.get("/static/favicon.svg")
    assert svg.status_code == 200 and svg.headers["content-type"].startswith("image/svg+xml")


def test_task_parameters_are_labelled_with_their_schema_titles(client, db):
    """A parameter's label is its schema title (not its field name), with its description as help text."""
    from swarmhub.worker.tasks import available_tasks, get_task

    make_user(db)
    login(client)
    labels = re.findall(r"<label[^>]*>(.*?)</label>", client.get("/experiments/new").text, re.S)
    checked = 0
    for task in available_tasks():
        for name, prop in get_task(task).Params.model_json_schema()["properties"].items():
            [label] = [text for text in labels if f'name="param.{task}.{name}"' in text]
            help_text = re.findall(r"<small>(.*?)</small>", label, re.S)
            words = re.sub(r"<select.*?</select>|<small>.*?</small>|<[^>]+>", " ", label, flags=re.S)
            assert " ".join(words.split()) == prop["title"] != name, (task, name)
            assert help_text == ([prop["description"]] if prop.get("description") else []), (task, name)
            checked += 1
    assert checked >= 8  # digits' two parameters and albert-mlm's six
