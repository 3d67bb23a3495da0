"""Real processes for the end-to-end tests: a `swarmhub server` of its own, volunteers signed up through the real
routes, and the `swarmhub` processes they start (waited for, and checked to leave nothing running)."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil

from swarmhub.server.swarm.supervision import KEEPER_STOP_SECONDS

from .conftest import PASSWORD, csrf_from, free_port
from .swarm_processes import wait_healthy

SWARMHUB = [sys.executable, "-m", "swarmhub.worker.cli.main"]


# A loaded 2-core machine (the suite's three lanes, each running swarms) answers a password check, or a page while the
# server's peers start, in more than httpx's 5 s default: the requests these tests make to a live server wait longer.
HTTP_TIMEOUT = 60.0


class http:  # noqa: N801 - used as a module of request functions, like httpx's
    """httpx's request functions with ``HTTP_TIMEOUT`` unless a call gives its own."""

    get = staticmethod(functools.partial(httpx.get, timeout=HTTP_TIMEOUT))
    post = staticmethod(functools.partial(httpx.post, timeout=HTTP_TIMEOUT))
    put = staticmethod(functools.partial(httpx.put, timeout=HTTP_TIMEOUT))
    delete = staticmethod(functools.partial(httpx.delete, timeout=HTTP_TIMEOUT))


def signup(url: str, username: str) -> str:
    """Sign up through the page, then get an API token through the API."""
    with httpx.Client(base_url=url, timeout=HTTP_TIMEOUT) as browser:
        token = csrf_from(browser.get("/signup").text)
        response = browser.post("/signup", data={"username": username, "password": PASSWORD, "csrf_token": token})
        assert response.status_code in (200, 303)
    response = http.post(f"{url}/api/auth/token", json={"username": username, "password": PASSWORD})
    return response.json()["access_token"]


def descendants(process: subprocess.Popen) -> set[int]:
    try:
        return {child.pid for child in psutil.Process(process.pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def alive(pids: set[int]) -> set[int]:
    def running(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    return {pid for pid in pids if running(pid)}


def outlived(pids: set[int], grace: float = 10.0) -> set[int]:
    """The processes still running after a short grace period (helpers such as torch_shm_manager take a
    moment to notice that their parent is gone)."""
    deadline = time.monotonic() + grace
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive(pids)


@contextlib.contextmanager
def running_server(tmp_path: Path, **settings: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """`swarmhub server` in its own process, with SWARMHUB_* settings from keyword arguments."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "SWARMHUB_DATA_DIR": str(tmp_path / "data"),
        "SWARMHUB_DATABASE_URL": f"sqlite:///{tmp_path / 'e2e.db'}",
        **{f"SWARMHUB_{key.upper()}": value for key, value in settings.items()},
    }
    log = open(tmp_path / "server.log", "wb")
    process = subprocess.Popen(
        [*SWARMHUB, "server", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        wait_healthy(url, process, log=tmp_path / "server.log")
        yield url, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:  # the server stops its peers at once, each within its bound: the checkpoint peer's is the longest
                process.wait(KEEPER_STOP_SECONDS + 30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                log.close()
                tail = (tmp_path / "server.log").read_text(errors="replace")[-4000:]
                raise AssertionError(f"the server did not stop on SIGTERM; its log ends:\n{tail}") from None
        log.close()


def wait_volunteers(
    workers: list[tuple[str, Any, subprocess.Popen]], tmp: Path, until: Callable[[], bool] | None = None
) -> tuple[set[int], dict[str, str]]:
    """Wait for every worker to end; returns the PIDs of every process they started, and their output.

    ``until``: once it holds (checked every second), each worker still running gets Ctrl-C: it leaves the swarm
    cleanly, prints its summary and exits 130. A run of so much progress, not so many minutes: its
    ``--max-minutes`` is then a bound, which a slow machine may reach first."""
    seen_children: set[int] = set()
    deadline = time.monotonic() + 300
    checked, stopped = 0.0, until is None
    for _, _, process in workers:
        while process.poll() is None and time.monotonic() < deadline:
            seen_children |= descendants(process)
            if not stopped and time.monotonic() - checked >= 1.0:
                checked = time.monotonic()
                if until is not None and until():
                    stopped = True
                    for _, _, running in workers:
                        if running.poll() is None:
                            running.send_signal(signal.SIGINT)
            time.sleep(0.5)
    outputs = {}
    for name, out, _ in workers:
        out.close()
        outputs[name] = (tmp / f"{name}.out").read_text(errors="replace")
        assert "Traceback" not in outputs[name]
    return seen_children, outputs


def last_epoch(output: Path) -> int:
    """The swarm epoch of the last progress line `swarmhub join` printed to ``output`` (-1 before the first)."""
    try:
        found = re.findall(r"^epoch (\d+) \|", output.read_text(errors="replace"), flags=re.MULTILINE)
    except FileNotFoundError:
        return -1
    return int(found[-1]) if found else -1


DIGITS_SLUG = "e2e-digits"


def start_digits_experiment(url: str) -> None:
    """An organizer signs up, creates the small digits experiment ``DIGITS_SLUG`` and starts it."""
    organizer = signup(url, "organizer")
    headers = {"Authorization": f"Bearer {organizer}"}
    created = http.post(
        f"{url}/api/experiments",
        headers=headers,
        json={
            "slug": DIGITS_SLUG,
            "title": "E2E digits",
            "task": "digits",
            "task_params": {"hidden_size": 64, "batch_size": 32},
            "target_batch_size": 128,
            "matchmaking_time": 2.0,
            "averaging_timeout": 20.0,
            "learning_rate": 0.003,
        },
    )
    assert created.status_code == 201, created.text
    started = http.post(f"{url}/api/experiments/{DIGITS_SLUG}/status", headers=headers, json={"action": "start"})
    assert started.json()["status"] == "running"
