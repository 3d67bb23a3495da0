"""The volunteer's CLI against a real server (uvicorn on 127.0.0.1): login, whoami, experiments, logout,
and the one-line failures of `join`."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

from swarmhub import __version__
from swarmhub.common import tokens as swarm_tokens
from swarmhub.common.protocol import SWARM_PROTOCOL
from swarmhub.server import experiments
from swarmhub.server.app import create_app
from swarmhub.server.models import SwarmPeerKey, User, utcnow
from swarmhub.server.services import services
from swarmhub.server.swarm import leases
from swarmhub.worker.cli.main import main

from .conftest import PASSWORD, LiveServer, csrf_from, make_experiment, make_user
from .support import token_for


@pytest.fixture
def cli_env(tmp_path, live_server):
    return {
        "SWARMHUB_CONFIG_DIR": str(tmp_path / "config"),
        "SWARMHUB_STATE_DIR": str(tmp_path / "state"),
        "SWARMHUB_SERVER": None,
        "SWARMHUB_TOKEN": None,
    }


def run(args, env, input=None):
    return CliRunner().invoke(main, args, env=env, input=input, catch_exceptions=False)


def test_login_with_token_whoami_experiments_logout(db, live_server, cli_env, tmp_path):
    owner = make_user(db)
    make_experiment(db, owner, slug="open-run", status="running")
    token = token_for(live_server.url)

    login = run(["login", "--server", live_server.url, "--with-token"], cli_env, input=token + "\n")
    assert login.exit_code == 0, login.output
    assert f"Logged in to {live_server.url} as alice" in login.output
    stored = tmp_path / "config" / "credentials.json"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert token not in login.output

    whoami = run(["whoami"], cli_env).output
    assert whoami.startswith(f"alice (admin) on {live_server.url}")
    assert "organizer token, until revoked" in whoami  # what this token may do, and for how long
    short = httpx.post(
        f"{live_server.url}/api/auth/token",
        json={"username": "alice", "password": PASSWORD, "scope": "volunteer", "expires_in_days": 30},
    ).json()["access_token"]
    expires = (datetime.now(UTC) + timedelta(days=30)).strftime("%Y-%m-%d")
    volunteer = run(["whoami"], {**cli_env, "SWARMHUB_SERVER": live_server.url, "SWARMHUB_TOKEN": short}).output
    assert f"volunteer token, expires {expires}" in volunteer, volunteer
    listing = run(["experiments"], cli_env).output
    assert re.search(r"open-run\s+running\s+digits", listing)

    logout = run(["logout"], cli_env)
    assert logout.exit_code == 0
    assert "token revoked on the server" in logout.output
    assert not stored.exists()
    me = httpx.get(f"{live_server.url}/api/me", headers={"Authorization": f"Bearer {token}"})
    assert me.status_code == 401


def test_login_with_a_bad_token_stores_nothing(live_server, cli_env, tmp_path):
    result = run(["login", "--server", live_server.url, "--with-token"], cli_env, input="shb_wrong\n")
    assert result.exit_code == 3
    assert "swarmhub login" in result.output
    assert not (tmp_path / "config" / "credentials.json").exists()


def test_join_failures_are_one_line_with_the_next_step(db, live_server, cli_env):
    owner = make_user(db)
    make_experiment(db, owner, slug="on-hold", status="paused")
    token = token_for(live_server.url)

    not_logged_in = run(["join", "on-hold"], {**cli_env, "SWARMHUB_SERVER": live_server.url})
    assert not_logged_in.exit_code == 3
    assert not_logged_in.output.strip().splitlines() == [not_logged_in.output.strip()]
    assert "swarmhub login" in not_logged_in.output

    env = {**cli_env, "SWARMHUB_SERVER": live_server.url, "SWARMHUB_TOKEN": token}
    unknown = run(["join", "no-such-run"], env)
    assert unknown.exit_code == 4
    assert "swarmhub experiments" in unknown.output

    paused = run(["join", "on-hold"], env)
    assert paused.exit_code == 6
    assert "paused" in paused.output

    make_experiment(db, owner, slug="open-one", status="running")
    organizer = {"Authorization": f"Bearer {token_for(live_server.url)}"}
    make_user(db, "bob")
    bob_env = {**env, "SWARMHUB_TOKEN": token_for(live_server.url, "bob")}
    httpx.post(f"{live_server.url}/api/experiments/open-one/bans", json={"username": "bob"}, headers=organizer)
    removed = run(["join", "open-one"], bob_env)
    assert removed.exit_code == 8
    assert "You were removed from 'open-one' by its organizer" in removed.output

    # This server runs no swarm peers: its 503 has no Retry-After, so `join` says so at once instead of waiting
    # the minutes a swarm takes to start.
    started = time.monotonic()
    no_swarm = run(["join", "open-one"], env)
    assert no_swarm.exit_code == 5 and time.monotonic() - started < 30
    assert "The server cannot run 'open-one' now: this server runs no swarm peers" in no_swarm.output

    httpx.delete(f"{live_server.url}/api/auth/token", headers={"Authorization": f"Bearer {token}"})
    revoked = run(["join", "on-hold"], env)
    assert revoked.exit_code == 3
    assert "swarmhub login" in revoked.output
    for result in (not_logged_in, unknown, paused, removed, no_swarm, revoked):
        assert "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) == 1


def test_join_with_server_down_says_so(cli_env):
    env = {**cli_env, "SWARMHUB_SERVER": "http://127.0.0.1:9", "SWARMHUB_TOKEN": "shb_x"}
    result = run(["join", "some-run"], env)
    assert result.exit_code == 5
    assert "Cannot reach" in result.output


def test_device_code_login_approved_in_the_browser(db, live_server, tmp_path):
    make_user(db)
    env = {**os.environ, "SWARMHUB_CONFIG_DIR": str(tmp_path / "config"), "SWARMHUB_STATE_DIR": str(tmp_path)}
    env.pop("SWARMHUB_TOKEN", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "swarmhub.worker.cli.main", "login", "--server", live_server.url],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        code = None
        for line in process.stdout:
            match = re.search(r"enter the code ([A-Z]{4}-[A-Z]{4})", line)
            if match:
                code = match.group(1)
                break
        assert code, "the CLI should print a user code"
        with httpx.Client(base_url=live_server.url) as browser:
            form = csrf_from(browser.get("/login").text)
            browser.post("/login", data={"username": "alice", "password": PASSWORD, "csrf_token": form})
            page = browser.get("/device", params={"user_code": code})
            assert code in page.text
            # `swarmhub login` asks for a volunteer token, and the page says what that token can do, and warns
            assert "<strong>volunteer</strong> access" in page.text and "join experiments, report" in page.text
            assert "If\n       someone sent you this code, deny it" in page.text
            approved = browser.post(
                "/device", data={"user_code": code, "decision": "approve", "csrf_token": csrf_from(page.text)}
            )
            assert "Approved" in approved.text
        output = process.communicate(timeout=60)[0]
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output
    assert "as alice" in output
    assert stat.S_IMODE((tmp_path / "config" / "credentials.json").stat().st_mode) == 0o600
    # the stored token joins and reads, but cannot create or run experiments
    stored = json.loads((tmp_path / "config" / "credentials.json").read_text())["token"]
    headers = {"Authorization": f"Bearer {stored}"}
    assert httpx.get(f"{live_server.url}/api/me", headers=headers).status_code == 200
    created = httpx.post(f"{live_server.url}/api/experiments", headers=headers, json={"slug": "mine", "title": "Mine"})
    assert created.status_code == 403 and created.json()["field"] == "scope", created.text
    assert "swarmhub login --scope organizer" in created.json()["detail"]


def test_admin_command_creates_an_administrator(db, settings, tmp_path):
    make_user(db, "first")  # the first user is already the administrator
    env = {"SWARMHUB_DATABASE_URL": settings.database_url, "SWARMHUB_DATA_DIR": str(tmp_path)}
    created = run(["admin", "ops", "--password-stdin"], env, input=PASSWORD + "\n")
    assert created.exit_code == 0, created.output
    assert "Created administrator ops" in created.output
    promoted = run(["admin", "ops", "--password-stdin"], env, input="\n")
    assert "ops is now an administrator" in promoted.output
    weak = run(["admin", "weak", "--password-stdin"], env, input="short\n")
    assert weak.exit_code == 1
    assert "Traceback" not in weak.output
    with db() as session:
        admins = session.scalars(select(User.username).where(User.is_admin).order_by(User.username)).all()
    assert admins == ["first", "ops"]


def test_admin_command_refuses_the_server_peers_name(db, settings, tmp_path):
    env = {"SWARMHUB_DATABASE_URL": settings.database_url, "SWARMHUB_DATA_DIR": str(tmp_path)}
    for name in ("swarmhub", "SWARMHUB", "swarm_hub"):
        refused = run(["admin", name, "--password-stdin"], env, input=PASSWORD + "\n")
        assert refused.exit_code == 1, refused.output
        assert refused.output.strip() == "Error: that username is reserved for the swarm peers of the server"
    with db() as session:
        assert session.scalars(select(User.username)).all() == []


def clock_shifting_proxy(upstream: str, shift: float):
    """A real ASGI app in front of the server: it passes every request on, and moves the server's clock in join
    answers by ``shift`` seconds, so the worker sees the server as a machine whose clock is that far off would."""

    def shift_clock(answer: dict) -> None:
        answer["server_time"] += shift

    return join_rewriting_proxy(upstream, shift_clock)


def join_rewriting_proxy(upstream: str, rewrite):
    """A real ASGI app in front of the server: it passes every request on, and hands each join answer to
    ``rewrite`` (which changes the dict in place) before the worker sees it."""

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        headers = [(k.decode(), v.decode()) for k, v in scope["headers"] if k != b"host"]
        url = upstream + scope["path"] + (f"?{scope['query_string'].decode()}" if scope["query_string"] else "")
        # the worker's own timeouts are what is tested: the proxy waits as long as the server takes (httpx's 5-s
        # default once failed a join on a busy machine)
        async with httpx.AsyncClient(timeout=60.0) as upstream_client:
            response = await upstream_client.request(scope["method"], url, headers=headers, content=body)
        content = response.content
        if scope["path"].endswith("/join") and response.status_code == 200:
            answer = response.json()
            rewrite(answer)
            content = json.dumps(answer).encode()
        kept = [(k.encode(), v.encode()) for k, v in response.headers.items() if k not in ("content-length", "date")]
        kept.append((b"content-length", str(len(content)).encode()))
        await send({"type": "http.response.start", "status": response.status_code, "headers": kept})
        await send({"type": "http.response.body", "body": content})

    return app


@pytest.mark.parametrize(("shift", "direction"), [(120.0, "behind"), (-120.0, "ahead of")])
def test_join_refuses_a_clock_far_off_the_servers(settings, tmp_path, shift, direction):
    """Swarm tokens and records expire by each peer's clock: `join` stops at 30 s off, before the swarm."""
    app, _ = hosted_elsewhere(settings, "clock-run")  # no peer is dialed before the clock check anyway
    result = join_through_proxy(app, "clock-run", lambda url: clock_shifting_proxy(url, shift), tmp_path)
    assert result.exit_code == 7, result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    skew = re.search(rf"This machine's clock is (\d+) s {direction} the server's", result.output)
    assert skew and 115 <= int(skew.group(1)) <= 125, result.output
    assert "sudo timedatectl set-ntp true" in result.output


def join_through_proxy(app, slug: str, proxy_for, tmp_path):
    """`swarmhub join SLUG` (the real CLI) through ``proxy_for(the app's URL)``, with a token of the app's own."""
    with LiveServer(app) as server, LiveServer(proxy_for(server.url)) as proxy:
        env = {
            "SWARMHUB_CONFIG_DIR": str(tmp_path / "config"),
            "SWARMHUB_STATE_DIR": str(tmp_path / "state"),
            "SWARMHUB_SERVER": proxy.url,
            "SWARMHUB_TOKEN": token_for(server.url),
        }
        return run(["join", slug], env)


def hosted_elsewhere(settings, slug: str):
    """An app whose running experiment ``slug`` has its swarm in another server process (which holds the lease and
    published its bootstrap address): this one answers joins without starting a peer."""
    app = create_app(settings.model_copy(update={"swarm_enabled": True}))
    db = services(app).sessionmaker
    experiment = make_experiment(db, make_user(db), slug=slug, status="running")
    run_id = experiments.run_id(experiment)
    bootstrap = swarm_tokens.peer_id_for_public_key(swarm_tokens.SigningKey.generate().get_public_key().to_bytes())
    with db.begin() as session:
        assert leases.acquire(session, run_id, "another-replica", now=utcnow() + timedelta(hours=1))
        leases.publish(session, run_id, "another-replica", [f"/ip4/127.0.0.1/tcp/9/p2p/{bootstrap}"], peers=1)
    return app, db


@pytest.mark.parametrize(
    ("hub_speaks", "fix"),
    [
        (None, "the hub runs an earlier swarmhub: ask its operator to upgrade the server"),
        (SWARM_PROTOCOL - 1, "the hub runs an earlier swarmhub: ask its operator to upgrade the server"),
        (SWARM_PROTOCOL + 1, "upgrade with `swarmhub upgrade` (the worker the hub serves), then join again"),
    ],
)
def test_join_refuses_a_hub_whose_swarm_speaks_another_protocol(settings, tmp_path, hub_speaks, fix):
    """A hub of an earlier swarmhub names no protocol in its join answer (its peers sign each DHT request, and
    refuse this worker's), a later one a higher number: `join` says which side to upgrade, in one line."""
    app, _ = hosted_elsewhere(settings, "protocol-run")

    def speak(answer: dict) -> None:
        if hub_speaks is None:
            del answer["swarm_protocol"]
        else:
            answer["swarm_protocol"] = hub_speaks

    result = join_through_proxy(app, "protocol-run", lambda url: join_rewriting_proxy(url, speak), tmp_path)
    assert result.exit_code == 1, result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    speaks = 1 if hub_speaks is None else hub_speaks
    assert f"speaks protocol {speaks} and this swarmhub {SWARM_PROTOCOL}: {fix}" in result.output


def test_join_waits_while_the_swarm_starts_and_says_so_once(settings, tmp_path):
    """A hub answers a join with 503 and Retry-After while it starts the experiment's swarm peer (a fresh peer
    took over a minute on a busy 2-core server): `join` says once that it waits, and goes on when the hub is
    ready (here to the protocol check of the real answer, which ends the run in one more line).

    The hub's clock is 29 s ahead of this machine's, inside the 30-s bound: the clock check compares the hub's time
    with the exchange that brought it, not with the whole wait (a join that had waited over a minute for a busy
    server's swarm was once refused as 40 s behind the server's own clock)."""
    app, _ = hosted_elsewhere(settings, "starting-run")
    joins: list[int] = []

    def ahead(answer: dict) -> None:
        answer.update(swarm_protocol=SWARM_PROTOCOL + 1, server_time=answer["server_time"] + 29.0)

    def starting(url: str):
        inner = join_rewriting_proxy(url, ahead)

        async def app(scope, receive, send):
            if scope["type"] == "http" and scope["path"].endswith("/join"):
                joins.append(1)
                if len(joins) <= 3:
                    body = json.dumps({"detail": "the experiment's swarm is starting: try again shortly"}).encode()
                    headers = [(b"content-type", b"application/json"), (b"retry-after", b"1")]
                    await send({"type": "http.response.start", "status": 503, "headers": headers})
                    await send({"type": "http.response.body", "body": body})
                    return
            await inner(scope, receive, send)

        return app

    result = join_through_proxy(app, "starting-run", starting, tmp_path)
    assert len(joins) == 4, result.output
    lines = result.output.strip().splitlines()
    assert lines[0] == "The swarm of 'starting-run' is starting on the server: waiting for it (up to 3 minutes).", lines
    assert len(lines) == 2 and "speaks protocol" in lines[1] and "Traceback" not in result.output


def test_the_server_refuses_a_worker_too_old_for_its_swarm_and_admits_nothing(settings):
    """A 0.2.0 worker cuts the vectors it averages into hivemind's 512 KiB parts: every round it joined would fail
    (0.1.0 ones sign their DHT requests and refuse unsigned answers). Its join (what it sends: a version and a key)
    gets a 426 naming the field, and no key is admitted."""
    app, db = hosted_elsewhere(settings, "old-worker-run")
    key = swarm_tokens.SigningKey.generate().get_public_key().to_bytes().decode()
    with LiveServer(app) as server:
        headers = {"Authorization": f"Bearer {token_for(server.url)}"}
        old = httpx.post(
            f"{server.url}/api/experiments/old-worker-run/join",
            json={"client_version": "0.2.0", "peer_public_key": key, "device": "cpu"},
            headers=headers,
        )
        with db() as session:
            admitted = session.scalar(select(func.count()).select_from(SwarmPeerKey))
        current = httpx.post(
            f"{server.url}/api/experiments/old-worker-run/join",
            json={"client_version": __version__, "peer_public_key": key, "device": "cpu"},
            headers=headers,
        )
    assert old.status_code == 426, old.text
    assert old.json()["field"] == "client_version"
    assert "swarmhub 0.2.0 cannot join this swarm" in old.json()["detail"]
    assert "upgrade with `swarmhub upgrade`" in old.json()["detail"]
    assert admitted == 0
    assert current.status_code == 200, current.text  # the control: the same join from this version
    assert current.json()["swarm_protocol"] == SWARM_PROTOCOL == 3


def test_a_worker_too_old_for_the_swarm_gets_no_renewal_either(settings):
    """A worker that joined before the hub was upgraded to a newer swarm protocol renews its token with the version
    every `swarmhub` command names in its User-Agent: it gets the join's 426 (``field: User-Agent``), and the
    client turns it into the server's line and exit code 9. This version, and a client of the API's own that names
    none, are renewed."""
    from swarmhub.common.protocol import JoinRequest
    from swarmhub.worker.client import USER_AGENT, ApiClient, ExitCode, WorkerError

    app, _db = hosted_elsewhere(settings, "upgraded-hub")
    key = swarm_tokens.SigningKey.generate().get_public_key().to_bytes().decode()
    with LiveServer(app) as server:
        token = token_for(server.url)
        with ApiClient(server.url, token, user_agent=USER_AGENT) as client:
            joined = client.join(
                "upgraded-hub", JoinRequest(device="cpu", client_version=__version__, peer_public_key=key)
            )
            renewed = client.swarm_token(joined, key)
        headers = {"Authorization": f"Bearer {token}", "User-Agent": "swarmhub-worker/0.2.9"}
        old = httpx.post(f"{server.url}{joined.token_path}", json={"peer_public_key": key}, headers=headers)
        with ApiClient(server.url, token, user_agent="swarmhub-worker/0.2.9") as outdated:
            with pytest.raises(WorkerError) as refused:
                outdated.swarm_token(joined, key)
        script = httpx.post(
            f"{server.url}{joined.token_path}",
            json={"peer_public_key": key},
            headers={"Authorization": f"Bearer {token}", "User-Agent": "python-httpx/0.28"},
        )
        with ApiClient(server.url, token, user_agent="swarmhub-worker/0.2.9") as outdated:
            with pytest.raises(WorkerError) as poll_refused:
                outdated.denylist("upgraded-hub")
        with ApiClient(server.url, token, user_agent=USER_AGENT) as client:
            polled = client.denylist("upgraded-hub")
    assert renewed.public_key and renewed.username  # the control: this version is renewed
    assert old.status_code == 426, old.text
    assert old.json()["field"] == "User-Agent"
    assert "swarmhub 0.2.9 cannot stay in this swarm" in old.json()["detail"]
    assert refused.value.exit_code == ExitCode.UPGRADE == 9
    assert refused.value.message == old.json()["detail"]
    assert "upgrade with `swarmhub upgrade`" in refused.value.message
    assert script.status_code == 200, script.text
    # the deny-list poll (every 5 s while a worker trains) tells it too, and still answers this version
    assert poll_refused.value.exit_code == ExitCode.UPGRADE
    assert polled == set()


def test_what_a_training_worker_asks_in_the_background_records_a_refusal_for_good(settings, tmp_path, monkeypatch):
    """A training worker asks the server, in the background, for its deny-list (every 5 s) and for a fresh swarm
    token (before the one it holds expires). Once its login is revoked (401) both are refused for good: each
    records the refusal, which stops its training (``training.should_stop``) instead of letting it train on until
    the other peers refuse its expired token. A server that is unreachable for now is not a refusal: the last list
    and the current token serve meanwhile."""
    from hivemind.utils.crypto import RSAPrivateKey

    from swarmhub.common.protocol import JoinRequest
    from swarmhub.worker.client import USER_AGENT, ApiClient, ExitCode
    from swarmhub.worker.swarm import access as swarm_access
    from swarmhub.worker.swarm.deny_list import DenyList
    from swarmhub.worker.training.access import PeerAccess

    # PeerAccess makes the peer's key hivemind's process-wide signing key: put the one before back afterwards
    monkeypatch.setattr(RSAPrivateKey, "_process_wide_key", RSAPrivateKey._process_wide_key)
    app, _db = hosted_elsewhere(settings, "revoked-login")
    identity = tmp_path / "identity.key"
    key = swarm_access.public_key_text(swarm_access.load_or_create_identity(identity))
    with LiveServer(app) as server:
        url, token = server.url, token_for(server.url)

        def client() -> ApiClient:
            return ApiClient(url, token, user_agent=USER_AGENT)

        with client() as joining:
            joined = joining.join(
                "revoked-login", JoinRequest(device="cpu", client_version=__version__, peer_public_key=key)
            )

        def fetch_token():
            with client() as renewing:
                return renewing.swarm_token(joined, key)

        def denied() -> set[str]:
            with client() as polling:
                return polling.denylist("revoked-login")

        deny_list = DenyList(denied, interval=3600)  # polled by hand below
        access = PeerAccess(joined, identity, fetch_token, deny_list)
        first = access.fetch()
        deny_list._safe_read()
        served = (access.refused, deny_list.refused)
        with client() as leaving:
            leaving.revoke_token()  # `swarmhub logout` on the volunteer's machine
        deny_list._safe_read()
        kept = access.fetch()
        deny_list.close()
    assert first.signature and served == (None, None)  # the control: a valid login is served
    assert deny_list.refused is not None and deny_list.refused.exit_code == ExitCode.AUTH
    assert access.refused is not None and access.refused.exit_code == ExitCode.AUTH
    assert "run `swarmhub login` again" in access.refused.message
    assert kept is first  # the current token still serves until training stops

    # the server gone for now: no refusal, the last token and list stay
    offline_access = PeerAccess(joined, identity, fetch_token, DenyList(None))
    offline_list = DenyList(denied, interval=3600)
    offline_access.fetch()
    offline_list.close()
    assert offline_access.refused is None and offline_list.refused is None
