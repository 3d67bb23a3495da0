"""``swarmhub service install|start|stop|status|uninstall``: the background worker as a systemd user service
(Linux) or a launchd agent (macOS), both running ``swarmhub run-service``.

The unit and the plist are plain text built here; installing writes them and, where the service manager is
usable, loads them. Where it is not (a container, a session without a user bus), the file is still written and
the exact commands to run are printed instead.
"""

from __future__ import annotations

import os
import plistlib
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from swarmhub.worker.settings import WorkerSettings

UNIT_NAME = "swarmhub.service"
AGENT_LABEL = "org.swarmhub.worker"


def swarmhub_executable() -> Path:
    """The absolute path of the installed ``swarmhub`` console script: the one beside this interpreter (a
    virtual environment's bin folder), else the one on PATH."""
    beside = Path(sys.executable).parent / "swarmhub"
    if beside.is_file():
        return beside.absolute()
    found = shutil.which("swarmhub")
    if found:
        return Path(found).absolute()
    raise FileNotFoundError(
        "the swarmhub command is not installed: install the worker with the command your hub shows (GET /api/worker)"
    )


def service_environment(settings: WorkerSettings) -> dict[str, str]:
    """What the service needs from the installing shell: where its login, limits and state are (a service does
    not see the shell's variables). The token is never written here: the service reads the stored login."""
    env = {
        "PYTHONUNBUFFERED": "1",  # progress lines reach the journal as they happen
        "SWARMHUB_CONFIG_DIR": str(settings.config_dir.absolute()),
        "SWARMHUB_STATE_DIR": str(settings.state_dir.absolute()),
        "SWARMHUB_CACHE_DIR": str(settings.cache_dir.absolute()),
    }
    if settings.server:
        env["SWARMHUB_SERVER"] = settings.server
    return env


def _quote(value: str) -> str:
    # systemd's quoting: double quotes around a word, backslash before quotes and backslashes
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_unit(executable: Path, env: dict[str, str]) -> str:
    environment = "".join(f"Environment={_quote(f'{key}={value}')}\n" for key, value in env.items())
    return (
        "[Unit]\n"
        "Description=swarmhub volunteer worker (trains with the swarms you chose, within your limits)\n"
        "After=network-online.target\n"
        "Wants=network-online.target\n"
        "\n"
        "[Service]\n"
        "Type=simple\n"
        f"ExecStart={_quote(str(executable))} run-service\n"
        f"{environment}"
        "Restart=on-failure\n"
        "RestartSec=30\n"
        # SIGINT to the runner only: it stops its join child cleanly (leaving the swarm), within the timeout.
        "KillSignal=SIGINT\n"
        "KillMode=mixed\n"
        "TimeoutStopSec=120\n"
        "Nice=10\n"
        "StandardOutput=journal\n"
        "StandardError=journal\n"
        "\n"
        "[Install]\n"
        "WantedBy=default.target\n"
    )


def launchd_plist(executable: Path, env: dict[str, str], logs_dir: Path) -> bytes:
    return plistlib.dumps(
        {
            "Label": AGENT_LABEL,
            "ProgramArguments": [str(executable), "run-service"],
            "EnvironmentVariables": env,
            "RunAtLoad": True,
            "KeepAlive": {"SuccessfulExit": False},  # restart after a failure, as Restart=on-failure
            "ThrottleInterval": 30,
            "ProcessType": "Background",
            "LowPriorityIO": True,
            "Nice": 10,
            "ExitTimeOut": 120,
            "StandardOutPath": str(logs_dir / "service.log"),
            "StandardErrorPath": str(logs_dir / "service.log"),
        }
    )


def systemd_unit_path(home: Path | None = None) -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str((home or Path.home()) / ".config")
    return Path(base) / "systemd" / "user" / UNIT_NAME


def launchd_plist_path(home: Path | None = None) -> Path:
    return (home or Path.home()) / "Library" / "LaunchAgents" / f"{AGENT_LABEL}.plist"


@dataclass
class Outcome:
    """What a service command did, and the commands left for the volunteer to run (when it could not)."""

    path: Path
    ran: list[list[str]] = field(default_factory=list)
    todo: list[list[str]] = field(default_factory=list)
    failed: str | None = None


def systemd_usable() -> bool:
    """Whether ``systemctl --user`` can reach a user service manager here."""
    if shutil.which("systemctl") is None:
        return False
    try:
        probe = subprocess.run(
            ["systemctl", "--user", "show-environment"], capture_output=True, timeout=15, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


def _run_all(commands: list[list[str]], usable: bool, outcome: Outcome) -> Outcome:
    if not usable:
        outcome.todo = commands
        return outcome
    for done, argv in enumerate(commands):
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        outcome.ran.append(argv)
        if result.returncode != 0:
            outcome.ran.pop()
            outcome.failed = f"`{' '.join(argv)}` failed: {(result.stderr or result.stdout).strip()[:300]}"
            outcome.todo = commands[done:]
            break
    return outcome


class ServiceManager:
    """Install, control and remove the background worker on this platform (``system``: linux or darwin)."""

    def __init__(self, settings: WorkerSettings, *, system: str = sys.platform, usable: bool | None = None):
        self.settings = settings
        self.macos = system == "darwin"
        self._usable = usable

    @property
    def usable(self) -> bool:
        if self._usable is None:
            self._usable = (shutil.which("launchctl") is not None) if self.macos else systemd_usable()
        return self._usable

    @property
    def path(self) -> Path:
        return launchd_plist_path() if self.macos else systemd_unit_path()

    def _ctl(self, *args: str) -> list[str]:
        return ["systemctl", "--user", *args]

    def install(self, executable: Path) -> Outcome:
        env = service_environment(self.settings)
        path = self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        if self.macos:
            self.settings.logs_dir.mkdir(parents=True, exist_ok=True)
            path.write_bytes(launchd_plist(executable, env, self.settings.logs_dir))
            return Outcome(path, todo=[["launchctl", "load", "-w", str(path)]])
        path.write_text(systemd_unit(executable, env), encoding="utf-8")
        return _run_all([self._ctl("daemon-reload"), self._ctl("enable", UNIT_NAME)], self.usable, Outcome(path))

    def control(self, action: str) -> Outcome:
        """``start`` or ``stop`` the installed service."""
        path = self.path
        if self.macos:
            verb = "load" if action == "start" else "unload"
            return _run_all([["launchctl", verb, str(path)]], self.usable, Outcome(path))
        return _run_all([self._ctl(action, UNIT_NAME)], self.usable, Outcome(path))

    def uninstall(self) -> Outcome:
        path = self.path
        if self.macos:
            outcome = _run_all([["launchctl", "unload", "-w", str(path)]], self.usable and path.exists(), Outcome(path))
            path.unlink(missing_ok=True)
            return outcome
        exists = path.exists()
        disable = [self._ctl("disable", "--now", UNIT_NAME)] if exists else []
        reload = [self._ctl("daemon-reload")]
        if not self.usable:
            path.unlink(missing_ok=True)
            return Outcome(path, todo=disable + reload)
        outcome = _run_all(disable, True, Outcome(path))
        if outcome.failed is None:
            path.unlink(missing_ok=True)
            outcome = _run_all(reload, True, outcome)
        return outcome

    def manager_state(self) -> str | None:
        """``systemctl --user is-active`` (active, inactive, failed...), when it can be asked."""
        if self.macos or not self.usable:
            return None
        result = subprocess.run(self._ctl("is-active", UNIT_NAME), capture_output=True, text=True, check=False)
        return result.stdout.strip() or None
