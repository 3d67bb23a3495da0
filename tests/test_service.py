"""The background worker: the systemd unit and launchd plist it installs, the limits in config.toml, the checks
behind them (hours, battery on a fake sysfs tree, other programs' CPU load on a fake /proc tree), and the runner's
decisions driving a real child process that stands in for `swarmhub join`: which experiment it runs (the list in
order, shares of the running time, or `--any`'s most needed one, listed by a real server).

The clock and the machine's power supply are the outside boundaries replaced here; the runner, the checks and the
commands are the real ones. `systemctl --user` is used for real only where a user service manager answers.
"""

from __future__ import annotations

import json
import os
import plistlib
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from swarmhub.server import experiments
from swarmhub.server.metrics.common import current_time
from swarmhub.worker.cli.main import main
from swarmhub.worker.cli.service import joinable_fetcher
from swarmhub.worker.client import ExitCode
from swarmhub.worker.service.limits import CpuSampler, Hours, ServiceConfig, on_battery_linux, on_battery_macos
from swarmhub.worker.service.runner import Conditions, Runner
from swarmhub.worker.service.state import read_state
from swarmhub.worker.service.units import (
    ServiceManager,
    launchd_plist,
    swarmhub_executable,
    systemd_unit,
    systemd_usable,
)
from swarmhub.worker.settings import WorkerSettings

from .conftest import LiveServer, make_experiment, make_user
from .support import token_for

TOKEN = "shh-service-secret-token"
NOON = datetime(2026, 12, 2, 12, 0)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary HOME and XDG_CONFIG_HOME; swarmhub's folders inside them; no SWARMHUB_* from the shell."""
    for name in list(os.environ):
        if name.startswith("SWARMHUB_"):
            monkeypatch.delenv(name)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "xdg-config"))
    monkeypatch.setenv("SWARMHUB_CONFIG_DIR", str(home / "xdg-config" / "swarmhub"))
    monkeypatch.setenv("SWARMHUB_STATE_DIR", str(home / "state"))
    monkeypatch.setenv("SWARMHUB_CACHE_DIR", str(home / "cache"))
    return home


def write_config(home: Path, text: str) -> Path:
    path = home / "xdg-config" / "swarmhub" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# -- the unit and the plist ---------------------------------------------------------------------------------


def unit_values(text: str) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            values.setdefault(key, []).append(value)
    return values


def test_the_unit_runs_the_installed_executable_restarts_on_failure_and_names_its_folders(home: Path) -> None:
    executable = swarmhub_executable()
    assert executable.is_absolute() and executable == Path(sys.executable).parent / "swarmhub"
    settings = WorkerSettings()
    from swarmhub.worker.service.units import service_environment

    values = unit_values(systemd_unit(executable, service_environment(settings)))
    assert values["ExecStart"] == [f'"{executable}" run-service']
    assert values["Restart"] == ["on-failure"]
    assert values["KillSignal"] == ["SIGINT"] and values["KillMode"] == ["mixed"]
    assert values["StandardOutput"] == ["journal"] and values["WantedBy"] == ["default.target"]
    env = dict(v.strip('"').split("=", 1) for v in values["Environment"])
    assert env["SWARMHUB_CONFIG_DIR"] == str(home / "xdg-config" / "swarmhub")
    assert env["SWARMHUB_STATE_DIR"] == str(home / "state")
    assert env["PYTHONUNBUFFERED"] == "1"


def test_the_launchd_agent_runs_the_installed_executable_and_restarts_after_a_failure(home: Path) -> None:
    settings = WorkerSettings()
    manager = ServiceManager(settings, system="darwin", usable=False)
    outcome = manager.install(swarmhub_executable())
    assert outcome.path == home / "Library" / "LaunchAgents" / "org.swarmhub.worker.plist"
    agent = plistlib.loads(outcome.path.read_bytes())
    assert agent["ProgramArguments"] == [str(swarmhub_executable()), "run-service"]
    assert agent["KeepAlive"] == {"SuccessfulExit": False} and agent["RunAtLoad"] is True
    assert agent["EnvironmentVariables"]["SWARMHUB_CONFIG_DIR"] == str(home / "xdg-config" / "swarmhub")
    assert agent["StandardErrorPath"] == str(home / "state" / "logs" / "service.log")
    assert outcome.todo == [["launchctl", "load", "-w", str(outcome.path)]]
    assert plistlib.loads(launchd_plist(Path("/x/swarmhub"), {}, Path("/l")))["Label"] == "org.swarmhub.worker"


def test_install_and_uninstall_write_and_remove_the_unit_under_xdg_config_home(home: Path) -> None:
    write_config(home, 'experiments = ["alpha"]\n')
    runner = CliRunner()
    env = {"SWARMHUB_TOKEN": TOKEN}
    result = runner.invoke(main, ["service", "install"], env=env)
    assert result.exit_code == 0, result.output
    unit = home / "xdg-config" / "systemd" / "user" / "swarmhub.service"
    text = unit.read_text()
    assert f'ExecStart="{swarmhub_executable()}" run-service' in text
    assert TOKEN not in text  # the service reads the stored login; a token never lands in a unit file
    if not systemd_usable():
        # no user service manager here (a container): the exact commands are printed instead
        assert "systemctl --user daemon-reload\n  systemctl --user enable swarmhub.service" in result.output
    result = runner.invoke(main, ["service", "uninstall"])
    assert result.exit_code == 0, result.output
    assert not unit.exists()
    assert f"Removed {unit}" in result.output
    result = runner.invoke(main, ["service", "start"])
    assert result.exit_code == ExitCode.USAGE
    assert "not installed: run `swarmhub service install`" in result.output


@pytest.mark.skipif(not systemd_usable(), reason="`systemctl --user` has no user service manager on this machine")
def test_systemctl_enables_and_disables_the_installed_unit(home: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(main, ["service", "install"]).exit_code == 0
    manager = ServiceManager(WorkerSettings())
    assert manager.usable
    import subprocess

    enabled = subprocess.run(["systemctl", "--user", "is-enabled", "swarmhub.service"], capture_output=True, text=True)
    assert enabled.stdout.strip() == "enabled"
    assert runner.invoke(main, ["service", "uninstall"]).exit_code == 0
    gone = subprocess.run(["systemctl", "--user", "is-enabled", "swarmhub.service"], capture_output=True, text=True)
    assert gone.stdout.strip() != "enabled"


# -- config.toml --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ("cpu_threads = 0", "cpu_threads"),
        ("gpu_memory_fraction = 1.5", "gpu_memory_fraction"),
        ('hours = "22:00-31:00"', "hours"),
        ('hours = "nightly"', "hours"),
        ('experiments = ["Not A Slug"]', "experiments"),
        ('pause_on_battery = "sometimes"', "pause_on_battery"),
        ("cpu_thread = 2", "cpu_thread"),
        ('experiments = [{slug = "alpha", share = 0}]', "experiments[0].share"),
        ('experiments = ["beta", {slug = "alpha", share = -1}]', "experiments[1].share"),
        ('experiments = [{slug = "alpha", share = "3"}]', "experiments[0].share"),
        ('experiments = [{slug = "alpha", share = true}]', "experiments[0].share"),
        ('experiments = [{slug = "alpha", weight = 3}]', "weight"),
        ('experiments = "everything"', "experiments"),
        ("share_period_minutes = 0", "share_period_minutes"),
        ('share_period_minutes = "hourly"', "share_period_minutes"),
        ('any = "yes please"', "any"),
    ],
)
def test_a_bad_value_in_config_toml_is_one_line_naming_the_key(home: Path, toml: str, key: str) -> None:
    path = write_config(home, toml + "\n")
    result = CliRunner().invoke(main, ["run-service"], env={"SWARMHUB_TOKEN": TOKEN})
    assert result.exit_code == ExitCode.USAGE
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {path}: ")
    assert repr(key) in lines[0] or f"invalid {key}:" in lines[0]
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("toml", "says"),
    [
        ('experiments = [{slug = "alpha", share = 0}]', "set it to a number above 0, e.g. 3"),
        ('experiments = [{slug = "alpha", weight = 3}]', "remove it (an entry takes slug and share)"),
        ('experiments = ["alpha"]\nany = true', 'set either experiments = [...] or any = true (experiments = "any")'),
        ('experiments = ["alpha", {slug = "alpha", share = 2}]', "lists 'alpha' twice: keep one entry"),
    ],
)
def test_shares_and_any_say_what_to_do_when_wrong(home: Path, toml: str, says: str) -> None:
    path = write_config(home, toml + "\n")
    result = CliRunner().invoke(main, ["run-service"], env={"SWARMHUB_TOKEN": TOKEN})
    assert result.exit_code == ExitCode.USAGE
    assert result.output.count("\n") == 1 and result.output.startswith(f"Error: {path}: ")
    assert says in result.output


def test_the_ways_of_choosing_read_from_config_toml() -> None:
    plain = ServiceConfig.model_validate({"experiments": ["alpha", "beta"]})
    assert (plain.slugs, plain.shares, plain.any) == (["alpha", "beta"], None, False)
    shared = ServiceConfig.model_validate({"experiments": [{"slug": "alpha", "share": 3}, "beta"]})
    assert shared.shares == [("alpha", 3.0), ("beta", 1.0)] and shared.share_period_minutes == 60
    assert ServiceConfig.model_validate({"experiments": "any"}).any
    assert ServiceConfig.model_validate({"any": True}).slugs == []


def test_broken_toml_and_a_missing_experiment_say_what_to_do(home: Path) -> None:
    runner = CliRunner()
    path = write_config(home, "experiments = [\n")
    result = runner.invoke(main, ["run-service"], env={"SWARMHUB_TOKEN": TOKEN})
    assert result.exit_code == ExitCode.USAGE and f"{path} is not valid TOML" in result.output
    write_config(home, "cpu_threads = 2\n")
    result = runner.invoke(main, ["run-service"], env={"SWARMHUB_TOKEN": TOKEN})
    assert result.exit_code == ExitCode.USAGE
    assert "No experiment chosen: add experiments" in result.output
    result = runner.invoke(main, ["run-service", "--cpu-threads", "0", "--experiment", "alpha"])
    assert result.exit_code == ExitCode.USAGE
    assert result.output.startswith("Error: run-service: invalid --cpu-threads: set it to a whole number")


def test_the_hours_may_cross_midnight() -> None:
    night = Hours.parse("22:00-07:00")
    day = datetime(2026, 12, 2)
    assert night.contains(day.replace(hour=23, minute=30))
    assert night.contains(day.replace(hour=0, minute=0))
    assert night.contains(day.replace(hour=6, minute=59))
    assert not night.contains(day.replace(hour=7, minute=0))
    assert not night.contains(day.replace(hour=12))
    assert night.contains(day.replace(hour=22))
    office = Hours.parse("09:00-17:30")
    assert office.contains(day.replace(hour=17, minute=29)) and not office.contains(day.replace(hour=17, minute=30))
    assert not office.contains(day.replace(hour=8, minute=59))
    assert Hours.parse("00:00-24:00").contains(day.replace(hour=13))


# -- battery and CPU load -----------------------------------------------------------------------------------


def power_tree(root: Path, *, mains: bool | None, battery: str | None) -> Path:
    """A sysfs /sys/class/power_supply: AC (type Mains, online 0/1) and BAT0 (type Battery, status)."""
    for name, kind, key, value in (("AC", "Mains", "online", mains), ("BAT0", "Battery", "status", battery)):
        folder = root / name
        if value is None:
            continue
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "type").write_text(kind + "\n")
        (folder / key).write_text(("1" if value is True else "0" if value is False else str(value)) + "\n")
    root.mkdir(parents=True, exist_ok=True)
    return root


def test_battery_detection_on_a_sysfs_tree(tmp_path: Path) -> None:
    assert on_battery_linux(power_tree(tmp_path / "a", mains=False, battery="Discharging"))
    assert not on_battery_linux(power_tree(tmp_path / "b", mains=True, battery="Charging"))
    assert not on_battery_linux(power_tree(tmp_path / "c", mains=True, battery="Full"))
    assert not on_battery_linux(power_tree(tmp_path / "d", mains=True, battery=None))  # a desktop
    assert not on_battery_linux(power_tree(tmp_path / "e", mains=None, battery=None))  # nothing reported
    assert not on_battery_linux(tmp_path / "missing")
    assert on_battery_macos("Now drawing from 'Battery Power'\n -InternalBattery-0 (id=1)\t80%; discharging;")
    assert not on_battery_macos("Now drawing from 'AC Power'\n -InternalBattery-0 (id=1)\t100%; charged;")


def proc_tree(root: Path, cpu: tuple[int, ...], processes: dict[int, tuple[int, int, int]]) -> Path:
    """A /proc with `stat` (cpu user nice system idle iowait irq softirq steal) and pid -> (ppid, utime, stime)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "stat").write_text("cpu  " + " ".join(map(str, cpu)) + " 0 0\ncpu0 1 2 3 4\n")
    for pid, (ppid, utime, stime) in processes.items():
        (root / str(pid)).mkdir(exist_ok=True)
        rest = " ".join(["0"] * 9) + f" {utime} {stime} 0 0 20 0 1 0"
        (root / str(pid) / "stat").write_text(f"{pid} (python3 -m x) S {ppid} {rest}\n")
    return root


def test_the_cpu_load_of_other_programs_excludes_this_process_tree(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc_tree(proc, (100, 0, 100, 800, 0, 0, 0, 0), {10: (1, 50, 50), 11: (10, 100, 0), 20: (1, 50, 0)})
    sampler = CpuSampler(10, proc_root=proc)
    assert sampler.others_share() is None  # the first sample has nothing to compare with
    # 1000 more ticks: 700 busy, of which 300 are ours (pid 10 and its child 11), so others used 400
    proc_tree(proc, (500, 0, 400, 1100, 0, 0, 0, 0), {10: (1, 100, 100), 11: (10, 300, 0), 20: (1, 450, 0)})
    assert sampler.others_share() == pytest.approx(0.4)
    config = ServiceConfig(experiments=["alpha"], pause_when_busy=True, busy_threshold=0.3, pause_on_battery=False)
    shares = iter([0.4, 0.2])
    conditions = Conditions(config, battery=lambda: False, busy=lambda: next(shares))
    assert conditions.pause_reason(datetime(2026, 12, 2, 12)) == "busy: other programs use 40% of the CPU"
    assert conditions.pause_reason(datetime(2026, 12, 2, 12)) is None


# -- the runner's decisions, with a real child standing in for `swarmhub join` ------------------------------

STAND_IN = """
import json, os, signal, sys, time
from datetime import datetime, timezone
slug, progress, log, mode = sys.argv[1:5]
def note(text):
    with open(log, "a") as f:
        f.write(f"{text} {slug} {os.getpid()}\\n")
def leave(signum, frame):
    note("left-" + signal.Signals(signum).name)
    sys.exit(130 if signum == signal.SIGINT else 143)
signal.signal(signal.SIGINT, leave)
signal.signal(signal.SIGTERM, leave)
note("started")
if mode.startswith("exit"):
    sys.exit(int(mode[4:]))
server = mode[len("follow="):] if mode.startswith("follow=") else None
now = datetime.now(timezone.utc).isoformat()
record = dict(experiment=slug, step=7, samples=224, samples_per_second=31.5, loss=2.25, peers=2,
              unacked_reports=0, last_ack_at=now, updated_at=now)
with open(progress + ".tmp", "w") as f:
    json.dump(record, f)
os.replace(progress + ".tmp", progress)
while True:
    time.sleep(0.1)
    if server:  # as a real join does: exit 6 once the experiment stops running
        import urllib.request
        with urllib.request.urlopen(f"{server}/api/experiments/{slug}") as answer:
            if json.load(answer)["status"] != "running":
                note("not-accepting")
                sys.exit(6)
"""


StandIn = tuple[Path, dict[str, str], Callable[[str, Path], list[str]]]  # log, modes, command


class FakeClock:
    """Wall time and monotonic time that move only when the test says."""

    def __init__(self, now: datetime):
        self.wall = now
        self.mono = 1000.0

    def now(self) -> datetime:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += timedelta(seconds=seconds)


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def events(log: Path) -> list[tuple[str, str, int]]:
    if not log.exists():
        return []
    return [(e, slug, int(pid)) for e, slug, pid in (line.split() for line in log.read_text().splitlines())]


@pytest.fixture
def stand_in(tmp_path: Path) -> Iterator[StandIn]:
    """The child command: the stand-in script, with a per-experiment mode ("run", "exit1", "exit6", or
    "follow=URL": run until the server at URL says the experiment no longer runs, then exit 6)."""
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    log = tmp_path / "children.log"
    modes: dict[str, str] = {}

    def command(slug: str, progress: Path) -> list[str]:
        return [sys.executable, str(script), slug, str(progress), str(log), modes.get(slug, "run")]

    yield log, modes, command


MakeRunner = Callable[..., Runner]


@pytest.fixture
def make_runner(home: Path, stand_in: StandIn) -> Iterator[MakeRunner]:
    """``make_runner(config, **options)``: a Runner on the stand-in child, with a fake clock at noon and the
    config's own conditions unless given; every runner made is closed after the test (no child left behind)."""
    made: list[Runner] = []

    def make(config: ServiceConfig, **options: object) -> Runner:
        options.setdefault("clock", FakeClock(NOON))
        options.setdefault("conditions", Conditions(config))
        runner = Runner(config, home / "state" / "service", command=stand_in[2], **options)  # type: ignore[arg-type]
        made.append(runner)
        return runner

    yield make
    for runner in made:
        runner.close()


def wait_started(log: Path, runner: Runner) -> None:
    """Until the running child has noted its start (its signal handlers are in place: it may be stopped now)."""
    child = runner.child
    assert child is not None
    wait_for(lambda: ("started", runner.experiment, child.pid) in events(log), f"{runner.experiment}'s start")


def test_the_runner_pauses_on_battery_and_outside_the_hours_and_resumes_when_they_clear(
    tmp_path: Path, stand_in: StandIn, make_runner: MakeRunner
) -> None:
    log, _, _ = stand_in
    power = power_tree(tmp_path / "power", mains=True, battery="Charging")
    config = ServiceConfig(experiments=["alpha"], hours="22:00-07:00", pause_on_battery=True)
    clock = FakeClock(datetime(2026, 12, 2, 23, 0))
    runner = make_runner(
        config, conditions=Conditions(config, battery=lambda: on_battery_linux(power)), clock=clock, settle=30.0
    )

    assert runner.tick().state == "running"
    wait_for(lambda: runner.progress_path.exists(), "the child's progress")
    first = runner.child
    assert first is not None and events(log) == [("started", "alpha", first.pid)]
    state = runner.tick()
    assert state.state == "running" and state.progress is not None
    assert (state.progress.step, state.progress.samples_per_second) == (7, 31.5)
    assert state.progress.last_ack_at is not None

    power_tree(power, mains=False, battery="Discharging")  # unplugged
    state = runner.tick()
    assert (state.state, state.reason) == ("paused", "on battery")
    assert runner.child is None and first.returncode == 130  # left cleanly on SIGINT, and waited for
    assert events(log)[-1] == ("left-SIGINT", "alpha", first.pid)
    result = CliRunner().invoke(main, ["service", "status"])
    assert result.exit_code == 0 and "state: paused: on battery" in result.output
    assert "experiment: alpha" in result.output

    power_tree(power, mains=True, battery="Charging")  # plugged in again: resumes once it stays so
    state = runner.tick()
    assert state.state == "paused" and runner.child is None and "cleared" in (state.reason or "")
    clock.advance(31)
    assert runner.tick().state == "running"
    second = runner.child
    assert second is not None and second.pid != first.pid
    wait_for(lambda: len(events(log)) == 3, "the second start")
    assert events(log)[-1] == ("started", "alpha", second.pid)
    wait_for(lambda: runner.progress_path.exists(), "the second child's progress")
    runner.tick()
    result = CliRunner().invoke(main, ["service", "status"])
    assert "state: running" in result.output and "31.5 samples/s" in result.output

    clock.wall = datetime(2026, 12, 3, 7, 0)  # morning: outside the hours
    state = runner.tick()
    assert (state.state, state.reason) == ("paused", "outside the hours 22:00-07:00")
    assert second.returncode == 130 and events(log)[-1] == ("left-SIGINT", "alpha", second.pid)

    runner.close()
    saved = read_state(runner.state_path)
    assert saved is not None and saved.state == "stopped"


def test_a_crashing_join_restarts_with_growing_backoff(stand_in: StandIn, make_runner: MakeRunner) -> None:
    log, modes, _ = stand_in
    modes["alpha"] = "exit1"
    clock = FakeClock(NOON)
    runner = make_runner(ServiceConfig(experiments=["alpha"], pause_on_battery=False), clock=clock, backoff_first=5.0)

    def crash() -> None:
        child = runner.child
        assert child is not None
        child.wait(20)

    assert runner.tick().state == "running"
    crash()
    state = runner.tick()
    assert state.state == "waiting" and state.restarts == 1 and state.last_exit_code == 1
    assert state.reason == "restarting alpha in 5 s after exit code 1"
    clock.advance(4)
    assert runner.tick().state == "waiting" and runner.child is None
    clock.advance(1)
    assert runner.tick().state == "running"  # the second start
    crash()
    state = runner.tick()
    assert state.reason == "restarting alpha in 10 s after exit code 1"  # doubled
    clock.advance(9)
    assert runner.tick().state == "waiting"
    clock.advance(1)
    assert runner.tick().state == "running"
    crash()
    assert [e for e, _, _ in events(log)] == ["started"] * 3
    runner.tick()
    result = CliRunner().invoke(main, ["service", "status"])
    assert "state: waiting: restarting alpha in 20 s after exit code 1" in result.output
    assert "restarts: 3 (last exit code 1)" in result.output


def test_an_experiment_that_stops_accepting_volunteers_hands_over_to_the_next(
    stand_in: StandIn, make_runner: MakeRunner
) -> None:
    log, modes, _ = stand_in
    modes["alpha"] = f"exit{int(ExitCode.NOT_ACCEPTING)}"
    runner = make_runner(ServiceConfig(experiments=["alpha", "beta"], pause_on_battery=False))
    runner.tick()
    assert runner.child is not None
    runner.child.wait(20)
    state = runner.tick()
    assert (state.state, state.experiment) == ("running", "beta")  # at once, no backoff
    wait_for(lambda: len(events(log)) == 2, "beta's start")
    assert [(e, slug) for e, slug, _ in events(log)] == [("started", "alpha"), ("started", "beta")]


def test_experiments_that_all_refuse_at_once_are_retried_with_backoff_not_cycled(
    stand_in: StandIn, make_runner: MakeRunner
) -> None:
    """Both experiments in the list stopped taking volunteers: the first hand-over goes on at once, the next ones
    wait with the crash backoff, so the runner does not start a join after a join."""
    log, modes, _ = stand_in
    for slug in ("alpha", "beta"):
        modes[slug] = f"exit{int(ExitCode.NOT_ACCEPTING)}"
    clock = FakeClock(NOON)
    config = ServiceConfig(experiments=["alpha", "beta"], pause_on_battery=False)
    runner = make_runner(config, clock=clock, backoff_first=5.0)

    def refused() -> None:
        assert runner.child is not None
        runner.child.wait(20)

    runner.tick()
    refused()
    assert (runner.tick().state, runner.experiment) == ("running", "beta")  # the first hand-over: at once
    refused()
    state = runner.tick()
    assert (state.state, runner.experiment, runner.child) == ("waiting", "alpha", None)
    refusal = f"exit code {int(ExitCode.NOT_ACCEPTING)} (the experiment is not accepting volunteers)"
    assert state.reason == f"restarting alpha in 5 s after {refusal}"
    clock.advance(5)
    assert runner.tick().state == "running"
    refused()
    assert runner.tick().reason == f"restarting beta in 10 s after {refusal}"
    started = [(e, slug) for e, slug, _ in events(log)]
    assert started == [("started", "alpha"), ("started", "beta"), ("started", "alpha")]

    modes["beta"] = "run"  # beta takes volunteers again, and runs past the quick window before alpha refuses
    clock.advance(10)
    assert (runner.tick().state, runner.experiment) == ("running", "beta")
    wait_started(log, runner)  # its handlers are in place before the fixture stops it


def test_run_service_stops_its_child_cleanly_on_sigterm(home: Path, tmp_path: Path) -> None:
    """The real `swarmhub run-service` loop, with a stand-in join: SIGTERM (systemd's stop) leaves no child."""
    import subprocess

    import psutil

    write_config(home, 'experiments = ["alpha"]\npause_on_battery = false\n')
    state_file = home / "state" / "service" / "state.json"
    # `join` itself would need a server: with a token for a server that is down, the child exits 5 and the
    # runner backs off and records it, which is what this test watches (and it leaves no process behind).
    env = {**os.environ, "SWARMHUB_TOKEN": TOKEN, "SWARMHUB_SERVER": "http://127.0.0.1:9"}
    process = subprocess.Popen(
        [str(swarmhub_executable()), "run-service", "--poll", "0.5"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: (s := read_state(state_file)) is not None and s.state == "waiting", "a backoff", 60)
        state = read_state(state_file)
        assert state is not None and state.last_exit_code == ExitCode.UNREACHABLE
        children = {c.pid for c in psutil.Process(process.pid).children(recursive=True)}
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    output = process.stdout.read().decode() if process.stdout else ""
    assert "Traceback" not in output
    state = read_state(state_file)
    assert state is not None and state.state == "stopped"
    assert not [pid for pid in children if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert json.loads(state_file.read_text())["reason"] == "the service was stopped"


# -- the limits reach the training process ------------------------------------------------------------------


def test_the_join_command_carries_the_limits() -> None:
    from swarmhub.worker.service.runner import join_command

    config = ServiceConfig(experiments=["alpha"], cpu_threads=2, gpu_memory_fraction=0.5)
    command = join_command(config, ["swarmhub"], listen=["/ip4/127.0.0.1/tcp/0"], insecure=True)
    argv = command("alpha", Path("/s/progress.json"))
    assert argv == [
        "swarmhub",
        "join",
        "alpha",
        "--progress-file",
        "/s/progress.json",
        "--listen",
        "/ip4/127.0.0.1/tcp/0",
        "--insecure",
        "--cpu-threads",
        "2",
        "--gpu-memory-fraction",
        "0.5",
    ]
    plain = join_command(ServiceConfig(experiments=["alpha"]), ["swarmhub"])("alpha", Path("/p"))
    assert plain == ["swarmhub", "join", "alpha", "--progress-file", "/p"]


def test_cpu_threads_set_torchs_threads_and_a_gpu_fraction_is_ignored_on_the_cpu() -> None:
    import torch

    from swarmhub.worker.join.prepare import apply_resource_limits

    before = torch.get_num_threads()
    try:
        apply_resource_limits(torch.device("cpu"), 1, 0.5)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(
    not __import__("torch").cuda.is_available(), reason="no CUDA device here: the memory fraction needs one"
)
def test_the_gpu_memory_fraction_caps_what_training_may_allocate() -> None:
    import torch

    from swarmhub.worker.join.prepare import apply_resource_limits

    device = torch.device("cuda", 0)
    total = torch.cuda.get_device_properties(device).total_memory
    apply_resource_limits(device, None, 0.25)
    try:
        with pytest.raises(torch.cuda.OutOfMemoryError):
            torch.empty(int(total * 0.5), dtype=torch.uint8, device=device)
        small = torch.empty(int(total * 0.1), dtype=torch.uint8, device=device)
        del small
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
        torch.cuda.empty_cache()


def test_the_status_says_what_a_joins_exit_code_means(stand_in: StandIn, make_runner: MakeRunner) -> None:
    _, modes, _ = stand_in
    modes["alpha"] = f"exit{int(ExitCode.AUTH)}"
    runner = make_runner(ServiceConfig(experiments=["alpha"], pause_on_battery=False))
    runner.tick()
    assert runner.child is not None
    runner.child.wait(20)
    runner.tick()
    result = CliRunner().invoke(main, ["service", "status"])
    assert "state: waiting: restarting alpha in 5 s after exit code 3 (not logged in or token rejected: run " in (
        result.output
    )


# -- choosing the experiment: shares of the running time, and --any's most needed -------------------------------


def test_shares_split_the_running_time_in_proportion_with_clean_switches(
    stand_in: StandIn, make_runner: MakeRunner
) -> None:
    log, _, _ = stand_in
    config = ServiceConfig.model_validate(
        {"experiments": [{"slug": "alpha", "share": 3}, "beta"], "share_period_minutes": 60, "pause_on_battery": False}
    )
    clock = FakeClock(NOON)
    runner = make_runner(config, clock=clock)
    minutes: Counter[str] = Counter()
    for minute in range(4 * 60):  # four rounds, a check a minute
        state = runner.tick()
        assert state.state == "running" and state.experiment is not None
        minutes[state.experiment] += 1
        wait_started(log, runner)
        if minute == 15:
            result = CliRunner().invoke(main, ["service", "status"])
            assert "experiment: alpha\n" in result.output
            assert "chosen: share slice: share 3 of 4, 45 of every 60 minutes; 30.0 min of this slice left" in (
                result.output
            )
        clock.advance(60)
    assert minutes == {"alpha": 180, "beta": 60}  # 3 : 1
    seen = [(event, slug) for event, slug, _ in events(log)]
    # every switch is join's clean leave (SIGINT: the spool keeps what the server has not acknowledged)
    round_trip = [("started", "alpha"), ("left-SIGINT", "alpha"), ("started", "beta"), ("left-SIGINT", "beta")]
    assert seen == round_trip * 3 + round_trip[:3]
    assert runner.restarts == 0  # a switch is not a crash


def test_a_share_counts_running_time_only_not_a_pause(
    tmp_path: Path, stand_in: StandIn, make_runner: MakeRunner
) -> None:
    log, _, _ = stand_in
    power = power_tree(tmp_path / "power", mains=True, battery=None)
    config = ServiceConfig.model_validate(
        {"experiments": [{"slug": "alpha", "share": 1}, {"slug": "beta", "share": 1}], "share_period_minutes": 20}
    )
    clock = FakeClock(NOON)
    runner = make_runner(config, clock=clock, conditions=Conditions(config, battery=lambda: on_battery_linux(power)))
    assert runner.tick().experiment == "alpha"
    wait_started(log, runner)
    clock.advance(4 * 60)
    power_tree(power, mains=False, battery="Discharging")
    assert runner.tick().state == "paused"
    clock.advance(60 * 60)  # an hour on battery
    power_tree(power, mains=True, battery="Charging")
    runner.settle = 0
    state = runner.tick()
    assert (state.state, state.experiment) == ("running", "alpha")  # 6 of its 10 minutes are still to run
    wait_started(log, runner)
    clock.advance(5 * 60)
    assert runner.tick().experiment == "alpha"
    clock.advance(60)
    assert runner.tick().experiment == "beta"
    wait_started(log, runner)  # stopped at teardown once it can stop cleanly (a child still starting waits it out)


@pytest.fixture
def hub(app, db) -> Iterator[LiveServer]:
    """A real server (in a thread) with two running experiments that vera may join, "crowded" with one peer
    online and "quiet" with none, and a private one with no peers that she may not join."""
    olga, vera, pia = (make_user(db, name) for name in ("olga", "vera", "pia"))
    for slug in ("crowded", "quiet"):
        make_experiment(db, olga, slug=slug, status="running")
    make_experiment(db, olga, slug="private-run", status="running", join_policy="invite")
    with db.begin() as session:
        crowded = experiments.get_visible(session, "crowded", None)
        experiments.start_worker_run(session, crowded, session.merge(pia), "cpu").last_seen_at = current_time()
    assert vera.username == "vera"
    with LiveServer(app) as server:
        yield server


def test_any_joins_the_most_needed_experiment_and_moves_when_it_finishes(
    home: Path, stand_in: StandIn, make_runner: MakeRunner, hub: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, modes, _ = stand_in
    for slug in ("crowded", "quiet", "private-run"):
        modes[slug] = f"follow={hub.url}"
    monkeypatch.setenv("SWARMHUB_SERVER", hub.url)
    monkeypatch.setenv("SWARMHUB_TOKEN", token_for(hub.url, "vera"))
    config = ServiceConfig(any=True, pause_on_battery=False)
    clock = FakeClock(NOON)
    runner = make_runner(config, fetch=joinable_fetcher(WorkerSettings(), insecure=False), recheck=30.0, clock=clock)

    state = runner.tick()
    assert (state.state, state.experiment) == ("running", "quiet")  # no peer online, and vera may join it
    assert state.chosen == "most needed of the 2 you may join: 0 peers online (need 1.00)"
    wait_started(log, runner)
    result = CliRunner().invoke(main, ["service", "status"])
    assert "experiment: quiet\nchosen: most needed of the 2 you may join: 0 peers online" in result.output

    organizer = {"Authorization": f"Bearer {token_for(hub.url, 'olga')}"}
    clock.advance(600)  # it trains a while before the organizer finishes it
    finish = httpx.post(f"{hub.url}/api/experiments/quiet/status", json={"action": "finish"}, headers=organizer)
    assert finish.status_code == 200, finish.text
    first = runner.child
    assert first is not None and first.wait(20) == ExitCode.NOT_ACCEPTING
    state = runner.tick()
    assert (state.state, state.experiment) == ("running", "crowded")  # at once: the next most needed
    assert state.chosen == "most needed of the 1 you may join: 1 peer online (need 0.50)"
    wait_started(log, runner)

    clock.advance(600)
    finish = httpx.post(f"{hub.url}/api/experiments/crowded/status", json={"action": "finish"}, headers=organizer)
    assert finish.status_code == 200, finish.text
    second = runner.child
    assert second is not None and second.wait(20) == ExitCode.NOT_ACCEPTING
    state = runner.tick()
    assert state.state == "waiting" and runner.child is None
    assert state.reason == "no running experiment you may join: asking the server again shortly"
    assert [(event, slug) for event, slug, _ in events(log)] == [
        ("started", "quiet"),
        ("not-accepting", "quiet"),
        ("started", "crowded"),
        ("not-accepting", "crowded"),
    ]  # never the private experiment, though it had no peer at all


def test_any_waits_and_says_why_when_the_server_cannot_list(
    home: Path, make_runner: MakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWARMHUB_SERVER", "http://127.0.0.1:9")
    monkeypatch.setenv("SWARMHUB_TOKEN", TOKEN)
    clock = FakeClock(NOON)
    config = ServiceConfig(any=True, pause_on_battery=False)
    runner = make_runner(config, clock=clock, fetch=joinable_fetcher(WorkerSettings(), insecure=False), recheck=30.0)
    state = runner.tick()
    assert state.state == "waiting" and runner.child is None
    assert (state.reason or "").startswith("cannot list the experiments you may join: Cannot reach http://127.0.0.1:9")
    clock.advance(10)
    assert runner.tick().reason == state.reason  # not asked again before the recheck
    assert read_state(runner.state_path) is not None


def test_join_any_refuses_a_slug_or_a_limit_of_one_experiment(home: Path) -> None:
    runner = CliRunner()
    env = {"SWARMHUB_TOKEN": TOKEN, "SWARMHUB_SERVER": "http://127.0.0.1:9"}
    both = runner.invoke(main, ["join", "alpha", "--any"], env=env)
    assert both.exit_code == ExitCode.USAGE and both.output.startswith("Error: Give either SLUG or --any")
    steps = runner.invoke(main, ["join", "--any", "--max-steps", "5"], env=env)
    assert steps.exit_code == ExitCode.USAGE and "with --any, stop with Ctrl-C" in steps.output
    neither = runner.invoke(main, ["join"], env=env)
    assert neither.exit_code == ExitCode.USAGE and "`swarmhub join --any`" in neither.output
    logged_out = runner.invoke(main, ["join", "--any"], env={"SWARMHUB_SERVER": "http://127.0.0.1:9"})
    assert logged_out.exit_code == ExitCode.AUTH and "Not logged in" in logged_out.output


def test_join_any_runs_a_real_join_of_the_most_needed_and_leaves_cleanly_on_ctrl_c(
    home: Path, tmp_path: Path, hub: LiveServer
) -> None:
    """The real `swarmhub join --any` and the real `join` it starts: this server runs no swarm, so the join waits
    for one (as for a swarm that is starting) until Ctrl-C, which reaches it through `--any` and leaves nothing."""
    import subprocess

    from .processes import SWARMHUB, descendants, outlived

    env = {**os.environ, "SWARMHUB_SERVER": hub.url, "SWARMHUB_TOKEN": token_for(hub.url, "vera")}
    log = tmp_path / "join-any.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*SWARMHUB, "join", "--any", "--device", "cpu", "--listen", "/ip4/127.0.0.1/tcp/0"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for(lambda: "joining quiet: most needed of the 2 you may join" in log.read_text(), "the choice", 60)
            wait_for(lambda: bool(descendants(process)), "the join it starts", 60)
            children = descendants(process)
            time.sleep(1.0)  # the join is past its start-up and asking the server
            process.send_signal(signal.SIGINT)
            code = process.wait(90)
        finally:
            if process.poll() is None:
                process.kill()
    output = log.read_text()
    assert code == ExitCode.INTERRUPTED, output[-2000:]
    assert "Traceback" not in output and "private-run" not in output
    assert "join quiet --progress-file" in output and "--device cpu" in output  # join's options reach the join
    assert not outlived(children)
