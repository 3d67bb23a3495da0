"""Pre-flight probes (a real server on 127.0.0.1) and `swarmhub doctor`: clock, bandwidth, open files,
reachability by dial-back, and the experiment's throughput on this machine."""

from __future__ import annotations

import socket

import httpx
import pytest
from click.testing import CliRunner

from swarmhub.worker.cli.main import main
from swarmhub.worker.join import doctor

from .conftest import PASSWORD, make_experiment, make_user


def bearer(url: str, username: str = "alice") -> dict[str, str]:
    response = httpx.post(f"{url}/api/auth/token", json={"username": username, "password": PASSWORD})
    return {"Authorization": f"Bearer {response.json()['access_token']}"}


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens there once the socket closes


def test_probes_need_a_login_and_bound_their_size(db, live_server):
    make_user(db)
    url = live_server.url
    assert httpx.get(f"{url}/api/probe").status_code == 401
    assert httpx.post(f"{url}/api/probe/reachability", json={"maddrs": ["/ip4/127.0.0.1/tcp/1"]}).status_code == 401
    headers = bearer(url)
    info = httpx.get(f"{url}/api/probe", headers=headers).json()
    assert info["client_host"] == "127.0.0.1" and info["server_time"] > 0
    body = httpx.get(f"{url}/api/probe/download", params={"size": 300_000}, headers=headers).content
    assert len(body) == 300_000
    too_big = httpx.get(f"{url}/api/probe/download", params={"size": 9 * 2**20}, headers=headers)
    assert too_big.status_code == 422 and too_big.json()["detail"][0]["loc"] == ["query", "size"]
    upload = httpx.post(f"{url}/api/probe/upload", content=b"x" * 100_000, headers=headers)
    assert upload.status_code == 200 and upload.json()["bytes"] == 100_000
    over = httpx.post(f"{url}/api/probe/upload", content=b"x" * (8 * 2**20 + 1), headers=headers)
    assert over.status_code == 413 and over.json()["field"] == "body"


def test_reachability_dials_back_only_the_caller(db, live_server):
    make_user(db)
    url, headers = live_server.url, bearer(live_server.url)
    with doctor.listening(["/ip4/127.0.0.1/tcp/0"]) as bound:
        open_port = int(bound[0].rsplit("/", 1)[1])
        answer = httpx.post(
            f"{url}/api/probe/reachability",
            json={"maddrs": [bound[0], f"/ip4/127.0.0.1/tcp/{closed_port()}"]},
            headers=headers,
        ).json()
    assert answer["reachable"] is True
    assert [(r["dialed"], r["ok"]) for r in answer["results"]][0] == (f"127.0.0.1:{open_port}", True)
    assert answer["results"][1]["ok"] is False and answer["results"][1]["error"]

    closed = httpx.post(
        f"{url}/api/probe/reachability", json={"maddrs": [f"/ip4/0.0.0.0/tcp/{closed_port()}"]}, headers=headers
    ).json()
    assert closed["reachable"] is False and closed["results"][0]["dialed"].startswith("127.0.0.1:")

    # Another host, a name, junk: the server dials nothing it was not asked by that host (no port scanning).
    for maddr, why in [
        ("/ip4/10.1.2.3/tcp/22", "only the address your request came from"),
        ("/dns4/example.org/tcp/80", "only /ip4/.../tcp/PORT"),
        ("/ip4/127.0.0.1/udp/53", "only /ip4/.../tcp/PORT"),
    ]:
        refused = httpx.post(f"{url}/api/probe/reachability", json={"maddrs": [maddr]}, headers=headers).json()
        assert refused["reachable"] is False and refused["results"][0]["dialed"] is None, maddr
        assert why in refused["results"][0]["error"]
    too_many = httpx.post(
        f"{url}/api/probe/reachability", json={"maddrs": ["/ip4/127.0.0.1/tcp/1"] * 9}, headers=headers
    )
    assert too_many.status_code == 422


@pytest.fixture
def cli_env(tmp_path, db, live_server):
    make_user(db)
    token = bearer(live_server.url)["Authorization"].removeprefix("Bearer ")
    return {
        "SWARMHUB_CONFIG_DIR": str(tmp_path / "config"),
        "SWARMHUB_STATE_DIR": str(tmp_path / "state"),
        "SWARMHUB_SERVER": live_server.url,
        "SWARMHUB_TOKEN": token,
    }


def test_doctor_reports_every_finding_and_the_throughput(db, live_server, cli_env):
    owner = make_user(db, "olga")
    make_experiment(db, owner, slug="doctor-run", status="running")
    result = CliRunner().invoke(
        main, ["doctor", "doctor-run", "--listen", "/ip4/127.0.0.1/tcp/0"], env=cli_env, catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    found = {line.split("]", 1)[1].split(":", 1)[0].strip(): line for line in lines if line.startswith("[")}
    assert set(found) == {"platform", "device", "open files", "clock", "bandwidth", "reachability", "throughput"}
    assert found["platform"].startswith("[  ok] platform: "), found["platform"]
    assert found["device"].startswith("[  ok] device: cpu")
    assert "Mbit/s" in found["bandwidth"]
    assert "the server dialed 127.0.0.1:" in found["reachability"]
    assert "samples/s on 'digits'" in found["throughput"]
    # the experiment's settings (target batch 128, matchmaking 2 s) cap the swarm at 64 samples/s
    assert found["throughput"].startswith("[warn] throughput") and "at most 64 samples/s" in found["throughput"]
    assert lines[-1] == "Ready to join."  # a warning: nothing to fix here


def test_doctor_says_what_to_fix(db, live_server, cli_env):
    # A worker that listens where the server cannot dial it: a warning with the fix, not a failure.
    result = CliRunner().invoke(
        main, ["doctor", "--listen", "/ip4/10.255.255.1/tcp/0"], env=cli_env, catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    assert "[warn] reachability: cannot listen on /ip4/10.255.255.1/tcp/0 -> check --listen" in result.output
    unknown = CliRunner().invoke(main, ["doctor", "no-such-run"], env=cli_env, catch_exceptions=False)
    assert unknown.exit_code == 4 and "no-such-run" in unknown.output


def test_a_worker_the_server_cannot_dial_joins_in_client_mode(db, live_server, cli_env):
    """As behind a NAT: the worker listens on an address that is not the one the server sees it at."""
    from swarmhub.worker.client import ApiClient

    with ApiClient(live_server.url, cli_env["SWARMHUB_TOKEN"]) as client:
        finding, bound = doctor.check_reachability(client, ["/ip4/127.0.0.2/tcp/0"])
    assert finding.status == doctor.WARN
    assert "you join in client mode" in finding.detail and "forward the TCP port" in finding.fix
    assert bound[0].startswith("/ip4/127.0.0.2/tcp/") and not bound[0].endswith("/tcp/0")


def test_doctor_measures_a_task_that_trains_on_the_experiments_text(db, live_server, cli_env, tmp_path):
    from swarmhub.server.corpus import text as corpus

    owner = make_user(db, "olga")
    make_experiment(db, owner, slug="albert-run", task="albert-mlm", task_params={"size": "tiny", "batch_size": 4})
    url = live_server.url
    args = ["doctor", "albert-run", "--listen", "/ip4/127.0.0.1/tcp/0"]
    env = {**cli_env, "SWARMHUB_CACHE_DIR": str(tmp_path / "cache")}
    # A draft serves no text: the throughput is not measured, with what to do, and nothing fails.
    draft = CliRunner().invoke(main, args, env=env, catch_exceptions=False)
    assert "throughput: not measured" in draft.output and "Traceback" not in draft.output, draft.output
    text = corpus.builtin_text("python-docstrings", max_bytes=60_000).encode()
    headers = bearer(url, "olga")
    response = httpx.put(
        f"{url}/api/experiments/albert-run/corpus",
        headers=headers,
        files={"file": ("docs.txt", text)},
        data={"vocab_size": "300", "seq_length": "16"},
    )
    assert response.status_code == 200, response.text
    httpx.post(f"{url}/api/experiments/albert-run/status", headers=headers, json={"action": "start"})
    result = CliRunner().invoke(main, args, env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "samples/s on 'albert-mlm'" in result.output
    assert list((tmp_path / "cache").rglob("tokenizer.json"))  # downloaded as `join` would, and cached


@pytest.mark.parametrize(
    ("system", "machine", "release", "status", "says"),
    [
        ("Linux", "x86_64", "6.1.0", doctor.OK, "Linux x86_64"),
        ("Linux", "aarch64", "6.1.0", doctor.OK, "Linux aarch64"),
        ("Linux", "x86_64", "5.15.153.1-microsoft-standard-WSL2", doctor.OK, "(WSL2)"),
        ("Darwin", "arm64", "23.1.0", doctor.OK, "Darwin arm64"),
        ("Windows", "AMD64", "10", doctor.FAIL, "install WSL2"),
        ("Linux", "armv7l", "6.1.0", doctor.FAIL, "no build for Linux armv7l"),
        ("FreeBSD", "amd64", "14.0", doctor.FAIL, "join from Linux (x86_64, aarch64) or macOS"),
    ],
)
def test_doctor_says_where_the_worker_runs(system, machine, release, status, says):
    """Volunteers on a platform hivemind ships no build for are told so, and what to use instead (WSL2 on Windows),
    before any other check."""
    finding = doctor.check_platform(system, machine, release)
    assert finding.status == status
    assert says in finding.line(), finding.line()
