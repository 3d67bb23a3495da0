"""End to end: a real uvicorn server (`swarmhub server`), volunteers made through the real routes, two real
`swarmhub join` processes training one hivemind swarm on 127.0.0.1, then a clean shutdown of everything."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from swarmhub.worker.swarm import access as swarm_access

from ..conftest import PASSWORD
from ..processes import (
    DIGITS_SLUG as SLUG,
)
from ..processes import (
    SWARMHUB,
    descendants,
    http,
    last_epoch,
    outlived,
    running_server,
    signup,
    wait_volunteers,
)
from ..processes import (
    start_digits_experiment as start_experiment,
)

pytestmark = [pytest.mark.e2e, pytest.mark.solo, pytest.mark.timeout(420)]  # see tests/lanes.py


def launch_volunteers(
    url: str, tmp: Path, limit: list[str], names: tuple[str, ...] = ("ada", "grace")
) -> list[tuple[str, Any, subprocess.Popen]]:
    """Volunteers (two by default) sign up, log in with the CLI and start `swarmhub join` with ``limit``, all logins
    first: the joins start together (a login takes seconds on a busy machine, and the runs' overlap is what is
    asserted)."""
    envs = {}
    for name in names:
        token = signup(url, name)
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
        envs[name] = env
    workers = []
    for name, env in envs.items():
        out = open(tmp / f"{name}.out", "wb")
        command = [*SWARMHUB, "join", SLUG, *limit, "--listen", "/ip4/127.0.0.1/tcp/0"]
        workers.append((name, out, subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)))
    return workers


def run_volunteers(url: str, tmp: Path, limit: list[str]) -> set[int]:
    workers = launch_volunteers(url, tmp, limit)
    seen_children, outputs = wait_volunteers(workers, tmp)
    for name, _, process in workers:
        assert process.returncode == 0, f"{name} exited {process.returncode}:\n{outputs[name][-3000:]}"
    return seen_children


def averaged_epochs(tmp: Path, since: float = 0.0) -> list[tuple[str, int]]:
    """Per volunteer: how many distinct swarm epochs it reported as averaged with another peer (the other volunteer,
    the server's auxiliary peer or both)."""
    engine = sa.create_engine(f"sqlite:///{tmp / 'e2e.db'}")
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT u.username, COUNT(DISTINCT p.epoch) FROM metric_points p "
                "JOIN worker_runs w ON w.id = p.worker_run_id JOIN users u ON u.id = w.user_id "
                "WHERE p.averaged_peers >= 2 AND p.received_at >= :since GROUP BY u.username ORDER BY u.username"
            ),
            {"since": datetime.fromtimestamp(since, timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")},
        ).all()
    engine.dispose()
    return [(name, count) for name, count in rows]


def leaving_seconds(log: Path) -> float:
    """Seconds from the worker's optimizer saying goodbye to the swarm to its being shut down, from its log."""

    def at(line: str) -> datetime:
        return datetime.strptime(line[:19], "%b %d %H:%M:%S.%f")

    lines = log.read_text(errors="replace").splitlines()
    goodbye = [at(line) for line in lines if line.endswith("Sending goodbye to peers...")]
    down = [at(line) for line in lines if line.endswith("SwarmOptimizer is shut down")]
    assert goodbye and down, lines[-20:]
    return (down[-1] - goodbye[-1]).total_seconds()


def test_two_volunteers_train_together_over_several_token_lifetimes(tmp_path):
    """With 15-second swarm tokens, a 90-second run outlives six of them: every peer renews its token (workers
    through the server, the server's peer by itself) and the two volunteers average together to the end. (A
    60-second run was too short on a slow, busy machine: the swarm reached epoch 5 in it, and one volunteer averaged
    with the other in only two of its epochs.)"""
    with running_server(tmp_path, swarm_token_minutes="0.25") as (url, server_process):
        start_experiment(url)
        started = time.time()
        seen_children = run_volunteers(url, tmp_path, ["--max-minutes", "1.5"])
        ran = time.time() - started

        # Both averaged with each other over at least three swarm epochs, and still did after two token lifetimes.
        rows = averaged_epochs(tmp_path)
        assert [name for name, _ in rows] == ["ada", "grace"]
        assert all(epochs >= 3 for _, epochs in rows), rows
        late = averaged_epochs(tmp_path, since=started + 35)
        assert [name for name, _ in late] == ["ada", "grace"], late
        assert all(epochs >= 2 for _, epochs in late), late

        # Each left within seconds: the state round started at its last epoch's end, which no group will join once
        # the other has gone, is cancelled, not waited for (the second to leave once waited out the whole 20-s
        # averaging timeout in it).
        for name in ("ada", "grace"):
            assert leaving_seconds(tmp_path / name / "logs" / f"{SLUG}.log") < 10, name
            # the log holds the swarm's events, not a line per HTTP request (the deny list is read every 5 s)
            assert "HTTP Request:" not in (tmp_path / name / "logs" / f"{SLUG}.log").read_text(errors="replace"), name

        board = http.get(f"{url}/api/experiments/{SLUG}/leaderboard").json()
        assert sorted(entry["username"] for entry in board) == ["ada", "grace"]
        assert all(entry["samples"] > 0 for entry in board)
        # The organizer's view: signed records back the honest volunteers' claims; nothing is flagged.
        organizer = http.post(f"{url}/api/auth/token", json={"username": "organizer", "password": PASSWORD})
        headers = {"Authorization": f"Bearer {organizer.json()['access_token']}"}
        board = http.get(f"{url}/api/experiments/{SLUG}/leaderboard", headers=headers).json()
        for entry in board:
            backed = entry["samples"] + entry["pending_samples"]
            # What the witness saw, never more than was claimed. How much of the claim that is depends on how much
            # of the two runs overlapped (a peer's credit is held to what the other volunteer gained over the same
            # minutes, and on 2 busy cores one volunteer often trains alone for the first or last seconds).
            assert 0 < entry["samples"] and backed <= entry["claimed_samples"], entry
            assert entry["time_online_seconds"] > 5 and entry["flags"] == [], entry
        assert sum(entry["share"] for entry in board) == pytest.approx(1.0, abs=1e-3)

        series = http.get(f"{url}/api/experiments/{SLUG}/metrics").json()["series"]
        # 10-second buckets (metrics.BUCKET_WIDTHS): a run of a minute is a few points, loss falling
        assert len(series) >= 2
        assert [p["t"] for p in series] == sorted({p["t"] for p in series})
        assert series[-1]["loss"] < series[0]["loss"]
        assert all(p["peers"] >= 1 for p in series)

        # Each worker asked for the deny list about once per DENY_POLL_SECONDS, not once per process it runs (its
        # DHT and averagers look the list up on every request; they read what its main process fetched).
        asked = (tmp_path / "server.log").read_text().count(f"GET /api/experiments/{SLUG}/denylist ")
        assert 0 < asked <= 2 * (ran / swarm_access.DENY_POLL_SECONDS + 3), (asked, ran)

        # Nothing the workers started outlives them; the server's swarm peer goes with the server.
        assert seen_children, "the workers should have started hivemind helper processes"
        assert outlived(seen_children) == set()
        server_children = descendants(server_process)
        assert server_children, "the server should run a swarm peer for the running experiment"
        server_process.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal: -SIGTERM is its clean exit.
        assert server_process.wait(60) in (0, -signal.SIGTERM)
        assert outlived(server_children) == set()


def test_removed_volunteer_leaves_and_the_others_go_on(tmp_path):
    with running_server(tmp_path) as (url, _):
        start_experiment(url)
        workers = launch_volunteers(url, tmp_path, ["--max-minutes", "4"])  # a bound, not the plan
        processes = {name: process for name, _, process in workers}
        organizer = http.post(f"{url}/api/auth/token", json={"username": "organizer", "password": PASSWORD})
        headers = {"Authorization": f"Bearer {organizer.json()['access_token']}"}
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and len(averaged_epochs(tmp_path)) < 2:
            time.sleep(1)  # until both have averaged together
        assert len(averaged_epochs(tmp_path)) == 2, "the two volunteers never averaged together"
        banned = http.post(f"{url}/api/experiments/{SLUG}/bans", json={"username": "grace"}, headers=headers)
        assert banned.status_code == 204
        removed_at = time.monotonic()
        processes["grace"].wait(90)
        took = time.monotonic() - removed_at
        time.sleep(5)
        ada_still_training = processes["ada"].poll() is None
        processes["ada"].send_signal(signal.SIGTERM)  # the organizer's run goes on; this test ends it here
        seen_children, outputs = wait_volunteers(workers, tmp_path)
    assert processes["grace"].returncode == 8, outputs["grace"][-2000:]
    assert "You were removed from 'e2e-digits' by its organizer" in outputs["grace"]
    assert took < 3 * 20.0 + 15, took  # docs/organizers.md's bound: at most about three averaging timeouts + 15 s
    assert ada_still_training, outputs["ada"][-2000:]
    assert processes["ada"].returncode == 143, outputs["ada"][-2000:]
    assert outlived(seen_children) == set()


def test_a_worker_whose_login_is_revoked_stops_within_a_deny_list_poll(tmp_path):
    """`swarmhub logout` on the volunteer's machine (which revokes the login's token on the server, as revoking it
    on the account page does) while `swarmhub join` runs: its next deny-list poll (every 5 s) gets 401, and the worker
    stops with the login line and exit code 3, instead of training on for up to an hour, until its swarm token
    expires and the other peers shut it out. (Its token renewal would be refused the same way: test_cli_server.)
    The server's own check of open report sockets (every 30 s by default, which would also stop it, through the
    reporter's reconnect: test_report_ws) is set to an hour here, so that the worker's poll is what is tested."""
    with running_server(tmp_path, login_recheck_seconds="3600") as (url, _):
        start_experiment(url)
        [(name, out, process)] = launch_volunteers(url, tmp_path, ["--max-minutes", "4"], names=("ada",))
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and process.poll() is None and last_epoch(tmp_path / "ada.out") < 1:
            time.sleep(1)  # until it trains in the swarm (an epoch with the server's peer)
        assert last_epoch(tmp_path / "ada.out") >= 1, (tmp_path / "ada.out").read_text()
        env = {**os.environ, "SWARMHUB_CONFIG_DIR": str(tmp_path / name), "SWARMHUB_STATE_DIR": str(tmp_path / name)}
        env.pop("SWARMHUB_TOKEN", None)
        logout = subprocess.run([*SWARMHUB, "logout"], env=env, capture_output=True, text=True, timeout=60)
        revoked_at = time.monotonic()
        while process.poll() is None and time.monotonic() - revoked_at < 90:
            time.sleep(0.5)
        took = time.monotonic() - revoked_at
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)  # it trained on: the assertions below say so
        seen_children, outputs = wait_volunteers([(name, out, process)], tmp_path)
    assert logout.returncode == 0 and "token revoked on the server" in logout.stdout, logout.stdout + logout.stderr
    assert process.returncode == 3, outputs["ada"][-2000:]
    assert "Your token was rejected (revoked or expired): run `swarmhub login` again" in outputs["ada"]
    assert took < 30, took  # a poll every 5 s, then the step in progress and hivemind's shutdown
    assert outlived(seen_children) == set()
