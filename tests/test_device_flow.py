"""RFC 8628 device authorization, as `swarmhub login` uses it, with approval through the real page."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from swarmhub.server.models import DeviceAuthorization, utcnow

from .conftest import login, make_user


def start(client):
    response = client.post("/api/auth/device/code", json={"client_name": "swarmhub-cli on laptop"})
    assert response.status_code == 200
    return response.json()


def poll(client, code):
    return client.post("/api/auth/device/token", json={"device_code": code["device_code"]})


def allow_next_poll(db):
    with db.begin() as session:
        session.execute(update(DeviceAuthorization).values(last_polled_at=utcnow() - timedelta(seconds=30)))


def test_device_code_response(client):
    code = start(client)
    assert code["verification_uri"] == "http://testserver/device"
    assert code["verification_uri_complete"].endswith(f"?user_code={code['user_code']}")
    assert len(code["user_code"]) == 9 and code["user_code"][4] == "-"
    assert code["interval"] == 5 and code["expires_in"] == 600


def test_approve_in_browser_then_poll_gets_a_working_token(client, db):
    make_user(db)
    code = start(client)
    assert poll(client, code).json() == {"error": "authorization_pending"}
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
    assert response.json()["field"] == "device_code"
