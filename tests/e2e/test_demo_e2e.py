"""End to end: `swarmhub demo` as the README runs it (server, demo experiments, two local workers), then
Ctrl-C: everything it started stops and nothing is left behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from ..conftest import free_port
from ..processes import descendants, http, outlived

# samples within 150 s, then Ctrl-C leaves nothing running, whatever the pace: it runs beside the other lane (lanes.py)
pytestmark = [pytest.mark.e2e, pytest.mark.waits, pytest.mark.timeout(420)]  # see tests/lanes.py
SWARMHUB = [sys.executable, "-m", "swarmhub.worker.cli.main"]
LOGIN = re.compile(r"Organizer:  log in at \S+ as 'organizer' with password (\S+)")


def reported_samples(url: str) -> int:
    """The samples the demo's volunteers have reported so far, by the public leaderboard."""
    try:
        board = http.get(f"{url}/api/experiments/demo-digits/leaderboard", timeout=5)
    except httpx.HTTPError:
        return 0
    return sum(entry["samples"] for entry in board.json()) if board.status_code == 200 else 0


def test_ctrl_c_stops_the_demo_and_leaves_no_process(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # The demo keeps its database and logs under ./.swarmhub-demo (wiped at start): run it in a scratch folder,
    # with none of this machine's SWARMHUB_* settings.
    env = {key: value for key, value in os.environ.items() if not key.startswith("SWARMHUB_")}
    log = open(tmp_path / "demo.out", "wb")  # noqa: SIM115 - closed below, after the process
    # Its own process group, as a shell gives a foreground job: Ctrl-C is SIGINT to the whole group. Started with
    # SIGINT ignored, as a script's background job (`swarmhub demo &`) starts it: Ctrl-C must stop it all the same.
    demo = subprocess.Popen(
        [*SWARMHUB, "demo", "--experiment", "demo-digits", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    started: set[int] = set()
    try:
        deadline = time.monotonic() + 150
        dashboard = None
        organizer_login = None
        while time.monotonic() < deadline and demo.poll() is None:
            started |= descendants(demo)
            if dashboard is None:
                try:
                    response = http.get(f"{url}/experiments/demo-digits", timeout=5)
                    dashboard = response.status_code
                except httpx.HTTPError:
                    pass
            elif reported_samples(url) > 0:
                break
            if organizer_login is None and (
                printed := LOGIN.search((tmp_path / "demo.out").read_text(errors="replace"))
            ):
                login = http.post(
                    f"{url}/api/auth/token", json={"username": "organizer", "password": printed.group(1)}, timeout=10
                )
                organizer_login = login.status_code
            time.sleep(0.5)
        samples = reported_samples(url)
        started |= descendants(demo)
        os.killpg(demo.pid, signal.SIGINT)
        code = demo.wait(150)  # workers get 75 s to leave the swarm, the server 30 s
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
        log.close()
    output = (tmp_path / "demo.out").read_text(errors="replace")
    assert dashboard == 200, output[-3000:]
    assert samples > 0, output[-3000:]
    assert code == 0, output[-3000:]
    assert "Stopped. Nothing is left running." in output
    # What the README says it prints: the dashboard's address and a login that worked while it ran.
    assert f"Dashboard:  {url}/experiments/demo-digits" in output, output[-3000:]
    assert organizer_login == 200, output[-3000:]
    assert "Traceback" not in output, output[max(0, output.find("Traceback") - 3000) :][:12000]
    # Each worker got one signal and left the swarm cleanly: a second one would have forced it out.
    for n in (1, 2):
        worker = (tmp_path / ".swarmhub-demo" / "logs" / f"worker-{n}.log").read_text(errors="replace")
        assert "Left the swarm" in worker and "Forcing the stop" not in worker, worker[-2000:]
    # The server, its swarm peer, both workers and every hivemind daemon they ran.
    assert len(started) >= 3, started
    assert outlived(started) == set()
