"""End to end: a real `swarmhub server` with a running experiment, and one volunteer's real `swarmhub run-service`
supervising a real `swarmhub join`. Unplugging the (fake sysfs) charger pauses it: the join leaves the swarm
cleanly as after Ctrl-C; plugging it back in rejoins; SIGTERM (systemd's stop) leaves no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from swarmhub.worker.service.state import ServiceState, read_state

from ..processes import DIGITS_SLUG as SLUG
from ..processes import SWARMHUB, descendants, http, outlived, running_server, signup
from ..processes import start_digits_experiment as start_experiment

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]


def set_power(root: Path, *, plugged: bool) -> None:
    for name, kind, key, value in (
        ("AC", "Mains", "online", "1" if plugged else "0"),
        ("BAT0", "Battery", "status", "Charging" if plugged else "Discharging"),
    ):
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "type").write_text(kind + "\n")
        (root / name / key).write_text(value + "\n")


def wait_state(path: Path, ok: Callable[[ServiceState], bool], what: str, process: subprocess.Popen) -> ServiceState:
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        assert process.poll() is None, "run-service exited"
        state = read_state(path)
        if state is not None and ok(state):
            return state
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; last state: {read_state(path)}")


def test_a_background_worker_pauses_on_battery_and_rejoins_on_mains(tmp_path: Path) -> None:
    with running_server(tmp_path) as (url, _):
        start_experiment(url)
        home = tmp_path / "ada"
        env = {**os.environ, "SWARMHUB_CONFIG_DIR": str(home / "config"), "SWARMHUB_STATE_DIR": str(home / "state")}
        env.pop("SWARMHUB_TOKEN", None)
        env.pop("SWARMHUB_SERVER", None)
        login = subprocess.run(
            [*SWARMHUB, "login", "--server", url, "--with-token"],
            input=signup(url, "ada") + "\n",
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert login.returncode == 0, login.stderr
        (home / "config" / "config.toml").write_text(f'experiments = ["{SLUG}"]\ncpu_threads = 1\n')
        power = tmp_path / "power_supply"
        set_power(power, plugged=True)
        state_file = home / "state" / "service" / "state.json"
        out = open(tmp_path / "service.out", "wb")
        service = subprocess.Popen(
            [*SWARMHUB, "run-service", "--poll", "1", "--settle", "0", "--power-supply-root", str(power)]
            + ["--listen", "/ip4/127.0.0.1/tcp/0"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        seen: set[int] = set()
        try:
            first = wait_state(
                state_file,
                lambda s: s.state == "running" and s.progress is not None and s.progress.last_ack_at is not None,
                "training, and a report acknowledged",
                service,
            )
            assert first.progress is not None and first.progress.experiment == SLUG
            seen |= descendants(service)

            set_power(power, plugged=False)
            paused = wait_state(state_file, lambda s: s.state == "paused", "the pause", service)
            assert paused.reason == "on battery"
            assert descendants(service) == set()  # the join has exited, not been left running
            log = (tmp_path / "service.out").read_text(errors="replace")
            assert "Left the swarm (Ctrl-C)." in log and "Done: " in log  # the clean leave and its summary

            set_power(power, plugged=True)
            again = wait_state(
                state_file,
                lambda s: s.state == "running" and s.progress is not None and s.progress.updated_at > paused.updated_at,
                "training after the pause",
                service,
            )
            assert again.restarts == 0  # a pause is not a crash
            seen |= descendants(service)
            status = subprocess.run(
                [*SWARMHUB, "service", "status"], env=env, capture_output=True, text=True, timeout=60
            )
            assert "state: running" in status.stdout and f"experiment: {SLUG}" in status.stdout
        finally:
            seen |= descendants(service)
            service.send_signal(signal.SIGTERM)
            code = service.wait(120)
            out.close()
        output = (tmp_path / "service.out").read_text(errors="replace")
        assert code == 0, output[-3000:]
        assert "Traceback" not in output
        assert not outlived(seen)
        stopped = read_state(state_file)
        assert stopped is not None and stopped.state == "stopped"
        board = http.get(f"{url}/api/experiments/{SLUG}/leaderboard").json()
        assert board, "the volunteer's reports reached the server"
