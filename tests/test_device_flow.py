"""RFC 8628 device authorization, as `swarmhub login` uses it, with approval through the real page."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import update

from swarmhub.server.models import DeviceAuthorization, utcnow

from .conftest import PASSWORD, login, make_experiment, make_user


def start(client, **extra):
    response = client.post("/api/auth/device/code", json={"client_name": "swarmhub-cli on laptop", **extra})
    assert response.status_code == 200
    return response.json()


def poll(client, code):
    return client.post("/api/auth/device/token", json={"device_code": code["device_code"]})


def allow_next_poll(db):
    with db.begin() as session:
        session.execute(update(DeviceAuthorization).values(last_polled_at=utcnow() - timedelta(seconds=30)))


def test_slow_down_raises_the_polling_interval_by_five_seconds(client, db):
    code = start(client)
    assert poll(client, code).json() == {"error": "authorization_pending"}
    assert poll(client, code).json() == {"error": "slow_down"}  # at once: the interval is now 10 s

    def polled_ago(seconds: float) -> None:
        with db.begin() as session:
            session.execute(update(DeviceAuthorization).values(last_polled_at=utcnow() - timedelta(seconds=seconds)))

    polled_ago(6)  # the first interval has passed, the raised one has not
    assert poll(client, code).json() == {"error": "slow_down"}  # and now it is 15 s
    polled_ago(16)
    assert poll(client, code).json() == {"error": "authorization_pending"}


def test_device_code_response(client):
    code = start(client)
    assert code["verification_uri"] == "http://testserver/device"
    assert code["verification_uri_complete"].endswith(f"?user_code={code['user_code']}")
    assert len(code["user_code"]) == 9 and code["user_code"][4] == "-"
    assert code["interval"] == 5 and code["expires_in"] == 600


def test_approve_in_browser_then_poll_gets_a_working_token(client, db):
    make_user(db)
    code = start(client)
    pending = poll(client, code)
    assert pending.json() == {"error": "authorization_pending"} and pending.headers["cache-control"] == "no-store"
    assert poll(client, code).json() == {"error": "slow_down"}  # polled faster than the interval

    csrf = login(client)
    page = client.get(f"/device?user_code={code['user_code'].lower().replace('-', '')}").text
    assert "swarmhub-cli on laptop" in page and code["user_code"] in page
    done = client.post("/device", data={"user_code": code["user_code"], "decision": "approve", "csrf_token": csrf})
    assert "Approved" in done.text

    allow_next_poll(db)
    token = poll(client, code)
    assert token.status_code == 200
    assert token.json()["username"] == "alice"
    assert token.headers["cache-control"] == "no-store"  # RFC 6749 section 5.1: a token is never cached
    me = client.get("/api/me", headers={"Authorization": f"Bearer {token.json()['access_token']}"})
    assert me.json()["username"] == "alice"
    allow_next_poll(db)
    assert poll(client, code).json() == {"error": "expired_token"}  # a device code is good for one token


def test_denied(client, db):
    make_user(db)
    code = start(client)
    csrf = login(client)
    client.post("/device", data={"user_code": code["user_code"], "decision": "deny", "csrf_token": csrf})
    allow_next_poll(db)
    assert poll(client, code).json() == {"error": "access_denied"}


def test_expired_code(client, db):
    make_user(db)
    code = start(client)
    with db.begin() as session:
        session.execute(update(DeviceAuthorization).values(expires_at=utcnow() - timedelta(seconds=1)))
    assert poll(client, code).json() == {"error": "expired_token"}
    csrf = login(client)
    page = client.post("/device", data={"user_code": code["user_code"], "decision": "approve", "csrf_token": csrf})
    assert page.status_code == 404
    assert "unknown or has expired" in page.text


def test_device_page_needs_login(client):
    code = start(client)
    response = client.get(f"/device?user_code={code['user_code']}", follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"].startswith("/login?next=/device")


def test_unknown_device_code(client):
    response = client.post("/api/auth/device/token", json={"device_code": "made-up"})
    assert response.status_code == 400
    # RFC 6749 section 5.2's code, so that any OAuth client stops polling, and the field, as every 4xx here
    assert response.json()["error"] == "invalid_grant"
    assert response.json()["field"] == "device_code"


DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"


def test_rfc_clients_post_forms(client, db):
    """RFC 8628's clients send application/x-www-form-urlencoded (sections 3.1 and 3.4), with a client_id."""
    make_user(db)
    code = client.post("/api/auth/device/code", data={"client_id": "tv-app", "client_name": "living-room tv"})
    assert code.status_code == 200, code.text
    code = code.json()
    form = {"grant_type": DEVICE_GRANT, "device_code": code["device_code"], "client_id": "tv-app"}
    pending = client.post("/api/auth/device/token", data=form)
    assert (pending.status_code, pending.json()) == (400, {"error": "authorization_pending"})

    csrf = login(client)
    assert "living-room tv" in client.get(f"/device?user_code={code['user_code']}").text
    client.post("/device", data={"user_code": code["user_code"], "decision": "approve", "csrf_token": csrf})
    allow_next_poll(db)
    token = client.post("/api/auth/device/token", data=form)
    assert token.status_code == 200, token.text
    assert token.json()["username"] == "alice"
    assert client.get("/api/me", headers={"Authorization": f"Bearer {token.json()['access_token']}"}).status_code == 200


def test_a_form_without_a_device_code_is_refused_naming_it(client):
    response = client.post("/api/auth/device/token", data={"grant_type": DEVICE_GRANT})
    assert response.status_code == 422
    assert [error["loc"] for error in response.json()["detail"]] == [["body", "device_code"]]


def test_other_grant_types_are_unsupported(client, db):
    """RFC 6749 section 5.2: a grant type this endpoint does not issue tokens for is `unsupported_grant_type`,
    whether sent as a form or as JSON, and the device code it carried is left as it was."""
    make_user(db)
    code = start(client)
    for grant_type in ("password", "authorization_code", "urn:ietf:params:oauth:grant-type:device_code2"):
        body = {"grant_type": grant_type, "device_code": code["device_code"]}
        for sent in (
            client.post("/api/auth/device/token", data=body),
            client.post("/api/auth/device/token", json=body),
        ):
            assert (sent.status_code, sent.json()) == (400, {"error": "unsupported_grant_type"})

    # The refused requests did not count as polls (this one would be slow_down) nor used the code up.
    assert poll(client, code).json() == {"error": "authorization_pending"}
    csrf = login(client)
    client.post("/device", data={"user_code": code["user_code"], "decision": "approve", "csrf_token": csrf})
    allow_next_poll(db)
    token = poll(client, code)
    assert token.status_code == 200, token.text


def test_token_responses_are_not_cached(client, db):
    """A password token's answer says no-store too (the swarm token's: tests/test_api.py); others do not."""
    make_user(db)
    token = client.post("/api/auth/token", json={"username": "alice", "password": PASSWORD})
    assert token.status_code == 200
    assert (token.headers["cache-control"], token.headers["pragma"]) == ("no-store", "no-cache")
    assert "no-store" not in client.get("/api/experiments").headers.get("cache-control", "")


def approve(client, db, code) -> str:
    """Approve ``code`` on the real page as alice; the token the next poll gets."""
    csrf = login(client)
    client.post("/device", data={"user_code": code["user_code"], "decision": "approve", "csrf_token": csrf})
    allow_next_poll(db)
    answer = poll(client, code)
    assert answer.status_code == 200, answer.text
    return answer.json()["access_token"]


ORGANIZER_ROUTES = [
    ("POST", "/api/experiments", {"slug": "second", "title": "Second"}),
    ("PATCH", "/api/experiments/scoped", {"title": "Renamed"}),
    ("POST", "/api/experiments/scoped/status", {"action": "start"}),
    ("POST", "/api/experiments/scoped/bans", {"username": "bob"}),
    ("DELETE", "/api/experiments/scoped/bans/bob", None),
    ("POST", "/api/experiments/scoped/rollback", {"epoch": 1}),
]


def test_a_volunteer_token_reads_and_joins_but_cannot_run_experiments(client, db):
    """What `swarmhub login` gets by default: every route that changes an experiment answers 403 naming the
    scope, for the experiment's own organizer too; reads work."""
    alice = make_user(db)
    make_experiment(db, alice, slug="scoped")
    token = approve(client, db, start(client))
    headers = {"Authorization": f"Bearer {token}"}
    for method, path, body in ORGANIZER_ROUTES:
        response = client.request(method, path, headers=headers, json=body)
        assert response.status_code == 403, (method, path, response.text)
        assert response.json()["field"] == "scope" and "--scope organizer" in response.json()["detail"], path
    upload = client.put("/api/experiments/scoped/corpus", headers=headers, files={"file": ("a.txt", b"text")})
    assert upload.status_code == 403 and upload.json()["field"] == "scope"
    assert client.get("/api/experiments/scoped", headers=headers).status_code == 200
    assert client.get("/api/me", headers=headers).json()["username"] == "alice"
    # the same routes with the same account's organizer token go through the scope check (200/201/204/4xx other
    # than a scope refusal)
    organizer = {"Authorization": f"Bearer {approve(client, db, start(client, scope='organizer'))}"}
    created = client.post("/api/experiments", headers=organizer, json={"slug": "second", "title": "Second"})
    assert created.status_code == 201, created.text
    renamed = client.patch("/api/experiments/scoped", headers=organizer, json={"title": "Renamed"})
    assert renamed.status_code == 200 and renamed.json()["title"] == "Renamed"


def test_the_approval_page_says_what_the_token_can_do_who_asked_and_warns(client, db):
    make_user(db)
    code = start(client, scope="organizer")
    login(client)
    page = client.get(f"/device?user_code={code['user_code']}").text
    assert "<strong>organizer</strong> access" in page and "create, edit, start" in page
    assert "Asked from <strong>testclient</strong>" in page  # the address that asked for the code
    assert "If\n       someone sent you this code, deny it" in page


def test_an_unknown_scope_is_refused_with_its_field(client):
    for path, body in (
        ("/api/auth/device/code", {"scope": "admin"}),
        ("/api/auth/token", {"username": "x", "password": "y" * 12, "scope": "root"}),
    ):
        response = client.post(path, json=body)
        assert response.status_code == 422, response.text
        (error,) = response.json()["detail"]
        assert error["loc"][-1] == "scope" and "'volunteer' or 'organizer'" in error["msg"], error


def test_a_password_token_asks_for_its_scope(client, db):
    """Scripts that hold a password get an organizer token unless they ask for a volunteer one."""
    alice = make_user(db)
    make_experiment(db, alice, slug="scoped")
    volunteer = client.post("/api/auth/token", json={"username": "alice", "password": PASSWORD, "scope": "volunteer"})
    assert volunteer.json()["scope"] == "volunteer"
    headers = {"Authorization": f"Bearer {volunteer.json()['access_token']}"}
    assert client.post("/api/experiments/scoped/status", headers=headers, json={"action": "start"}).status_code == 403
    organizer = client.post("/api/auth/token", json={"username": "alice", "password": PASSWORD})
    assert organizer.json()["scope"] == "organizer"
    headers = {"Authorization": f"Bearer {organizer.json()['access_token']}"}
    assert client.post("/api/experiments/scoped/status", headers=headers, json={"action": "start"}).status_code != 403


def test_account_page_tokens_are_volunteer_tokens_unless_organizer_is_chosen(client, db):
    make_user(db)
    csrf = login(client)
    client.post("/account/tokens", data={"name": "laptop", "csrf_token": csrf})
    client.post("/account/tokens", data={"name": "scripts", "scope": "organizer", "csrf_token": csrf})
    page = client.get("/account").text
    assert '<td>laptop</td><td class="token-scope">volunteer</td>' in page
    assert '<td>scripts</td><td class="token-scope">organizer</td>' in page
    refused = client.post("/account/tokens", data={"name": "x", "scope": "admin", "csrf_token": csrf})
    assert refused.status_code == 422 and "choose volunteer or organizer" in refused.text


def test_a_token_may_expire_and_the_account_page_shows_its_last_use(client, db):
    from sqlalchemy import update as set_

    from swarmhub.server.models import ApiToken

    make_user(db)
    made = client.post("/api/auth/token", json={"username": "alice", "password": PASSWORD, "expires_in_days": 30})
    headers = {"Authorization": f"Bearer {made.json()['access_token']}"}
    assert client.get("/api/me", headers=headers).status_code == 200
    csrf = login(client)
    client.post("/account/tokens", data={"name": "laptop", "expires_in_days": "90", "csrf_token": csrf})
    page = client.get("/account").text
    assert page.count('<td class="token-expires">20') == 2  # both tokens show a date, not "never"
    assert '<td class="token-address">testclient</td>' in page  # where the API token was last used from
    with db.begin() as session:
        session.execute(set_(ApiToken).values(expires_at=utcnow() - timedelta(seconds=1)))
    expired = client.get("/api/me", headers=headers)
    assert expired.status_code == 401 and "expired" in expired.json()["detail"], expired.text
    refused = client.post("/account/tokens", data={"name": "x", "expires_in_days": "7", "csrf_token": csrf})
    assert refused.status_code == 422 and "lifetimes offered" in refused.text


def test_the_approver_chooses_how_long_the_device_s_token_works(client, db):
    from swarmhub.server.models import ApiToken

    make_user(db)
    code = start(client)
    csrf = login(client)
    page = client.get(f"/device?user_code={code['user_code']}").text
    assert '<select name="expires_in_days">' in page and "never (until revoked)" in page
    refused = client.post(
        "/device",
        data={"user_code": code["user_code"], "decision": "approve", "expires_in_days": "7", "csrf_token": csrf},
    )
    assert refused.status_code == 422 and "lifetimes offered" in refused.text
    allow_next_poll(db)
    assert poll(client, code).json()["error"] == "authorization_pending"  # nothing was approved
    client.post(
        "/device",
        data={"user_code": code["user_code"], "decision": "approve", "expires_in_days": "30", "csrf_token": csrf},
    )
    allow_next_poll(db)
    token = poll(client, code).json()["access_token"]
    me = client.get("/api/me", headers={"Authorization": f"Bearer {token}"}).json()
    expires = datetime.fromisoformat(me["expires_at"])
    assert abs(expires - (utcnow() + timedelta(days=30))) < timedelta(minutes=5), me
    # without a choice, as before: until revoked
    assert approve(client, db, start(client)) and db_token_count(db, ApiToken.expires_at.is_(None)) == 1


def db_token_count(db, condition) -> int:
    from sqlalchemy import func, select

    from swarmhub.server.models import ApiToken

    with db.begin() as session:
        return int(session.scalar(select(func.count()).select_from(ApiToken).where(condition)) or 0)
