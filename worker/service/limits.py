"""The limits a volunteer sets for the background worker (``swarmhub run-service``), and the checks behind them.

``<config_dir>/config.toml`` (next to ``credentials.json``) holds them; ``run-service`` flags override them:

    experiments = ["demo-albert"]      # joined in this order: one that stops accepting volunteers hands over
    # or shares of the running time, in slices that add up to share_period_minutes (here 45 min, then 15 min):
    #   experiments = [{slug = "demo-albert", share = 3}, {slug = "demo-digits", share = 1}]
    #   share_period_minutes = 60
    # or the experiment that needs peers most among those you may join (`swarmhub join --any`):
    #   experiments = "any"            # (or: any = true)
    cpu_threads = 2                    # torch.set_num_threads in the training process
    gpu_memory_fraction = 0.5          # torch.cuda.set_per_process_memory_fraction, when CUDA is present
    hours = "22:00-07:00"              # train only within this local-time window (it may cross midnight)
    pause_on_battery = true            # leave the swarm while a laptop runs on battery
    pause_when_busy = true             # leave the swarm while other programs keep the CPU busy
    busy_threshold = 0.5               # ... more than this share of all CPU time

Each check reads the machine through a parameter (the sysfs power-supply folder, the ``/proc`` folder, the
``pmset`` output), so tests point it at a tree of their own.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, time
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from swarmhub.common.protocol import SLUG_RE
from swarmhub.worker.client import ExitCode, WorkerError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

CONFIG_FILE = "config.toml"
POWER_SUPPLY_ROOT = Path("/sys/class/power_supply")
PROC_ROOT = Path("/proc")
_HOURS_RE = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$")


@dataclass(frozen=True)
class Hours:
    """A daily window of local time, ``start`` included and ``end`` excluded; it crosses midnight when
    ``end <= start`` ("22:00-07:00" is from 22:00 to 07:00 the next morning)."""

    start: time
    end: time

    @classmethod
    def parse(cls, text: str) -> Hours:
        match = _HOURS_RE.match(text)
        if not match:
            raise ValueError('expected "HH:MM-HH:MM", e.g. "22:00-07:00"')
        h1, m1, h2, m2 = (int(g) for g in match.groups())
        if h1 > 23 or h2 > 24 or m1 > 59 or m2 > 59 or (h2 == 24 and m2):
            raise ValueError("hours run from 00:00 to 24:00")
        return cls(time(h1, m1), time(0, 0) if h2 == 24 else time(h2, m2))

    def contains(self, moment: datetime) -> bool:
        now = moment.time()
        if self.start < self.end:
            return self.start <= now < self.end
        return now >= self.start or now < self.end  # crosses midnight (or the whole day when start == end)

    def __str__(self) -> str:
        return f"{self.start:%H:%M}-{self.end:%H:%M}"


class ExperimentShare(BaseModel):
    """One entry of ``experiments``: a name (a plain string in the file), and its share of the running time."""

    model_config = ConfigDict(extra="forbid")

    slug: Annotated[str, Field(pattern=SLUG_RE.pattern)]
    share: Annotated[float, Field(gt=0, le=1_000_000, strict=True)] | None = None  # strict: "3" or true is refused


class ServiceConfig(BaseModel):
    """The volunteer's limits for the background worker; unknown keys are refused (a typo must not be ignored)."""

    model_config = ConfigDict(extra="forbid")

    experiments: list[ExperimentShare] = Field(default_factory=list)
    any: bool = False  # the experiment that needs peers most (``experiments = "any"`` says the same)
    share_period_minutes: Annotated[float, Field(gt=0, le=10_080)] = 60.0
    cpu_threads: Annotated[int, Field(ge=1, le=1024)] | None = None
    gpu_memory_fraction: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    hours: str | None = None
    pause_on_battery: bool = True
    pause_when_busy: bool = False
    busy_threshold: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.5

    @field_validator("hours")
    @classmethod
    def _hours(cls, value: str | None) -> str | None:
        if value is not None:
            Hours.parse(value)
        return value

    @model_validator(mode="before")
    @classmethod
    def _names_or_any(cls, values: Any) -> Any:
        if not isinstance(values, dict):
            return values
        listed = values.get("experiments")
        if listed == "any":
            return {**values, "experiments": [], "any": True}
        if isinstance(listed, list):  # a plain name is an entry without a share
            return {**values, "experiments": [{"slug": e} if isinstance(e, str) else e for e in listed]}
        return values

    @model_validator(mode="after")
    def _one_way_to_choose(self) -> ServiceConfig:
        if self.any and self.experiments:
            raise ValueError('set either experiments = [...] or any = true (experiments = "any"), not both')
        seen: set[str] = set()
        for entry in self.experiments:
            if entry.slug in seen:
                raise ValueError(f"experiments lists {entry.slug!r} twice: keep one entry (with its share)")
            seen.add(entry.slug)
        return self

    @property
    def slugs(self) -> list[str]:
        return [entry.slug for entry in self.experiments]

    @property
    def shares(self) -> list[tuple[str, float]] | None:
        """``(slug, share)`` for every experiment when any entry gives a share (1 where one does not); None for a
        plain list, which is joined in order of preference instead."""
        if all(entry.share is None for entry in self.experiments):
            return None
        return [(entry.slug, entry.share if entry.share is not None else 1.0) for entry in self.experiments]

    @property
    def window(self) -> Hours | None:
        return Hours.parse(self.hours) if self.hours else None


_HINTS = {
    "experiments": 'a list of experiment names, e.g. ["demo-albert"] (see `swarmhub experiments`), names with '
    'shares, e.g. [{slug = "demo-albert", share = 3}, {slug = "demo-digits", share = 1}], or "any"',
    "any": "true or false (true: join the experiment that needs peers most among those you may join)",
    "share_period_minutes": "a number of minutes above 0, e.g. 60: one round of every experiment's share",
    "cpu_threads": "a whole number of CPU threads, at least 1",
    "gpu_memory_fraction": "a number above 0 and at most 1, e.g. 0.5",
    "hours": 'a window of local time "HH:MM-HH:MM", e.g. "22:00-07:00"',
    "pause_on_battery": "true or false",
    "pause_when_busy": "true or false",
    "busy_threshold": "a share of all CPU time above 0 and below 1, e.g. 0.5",
}


SHARE_HINT = "a number above 0, e.g. 3: the experiment's part of the running time"


def config_path(config_dir: Path) -> Path:
    return Path(config_dir) / CONFIG_FILE


def validate_config(values: dict[str, Any], source: str, *, flags: bool = False) -> ServiceConfig:
    """``values`` as a :class:`ServiceConfig`, or a one-line usage error that names the first bad key (as the
    ``run-service`` option of that name with ``flags``)."""
    try:
        return ServiceConfig.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = err["loc"]
        if not loc:  # a rule across keys: its message says what to do
            raise WorkerError(f"{source}: {err['msg'].removeprefix('Value error, ')}", ExitCode.USAGE) from None
        field = str(loc[0])
        if field == "experiments" and len(loc) == 3 and isinstance(loc[1], int) and loc[2] != "slug":
            entry = f"experiments[{loc[1]}]"  # TOML's own counting starts at 0 too: the first entry is [0]
            if err["type"] == "extra_forbidden":
                raise WorkerError(
                    f"{source}: unknown key {loc[2]!r} in {entry}: remove it (an entry takes slug and share)",
                    ExitCode.USAGE,
                ) from None
            raise WorkerError(f"{source}: invalid {entry}.{loc[2]}: set it to {SHARE_HINT}", ExitCode.USAGE) from None
        hint = _HINTS.get(field, err["msg"])
        key = "--" + field.replace("_", "-") if flags else field
        if err["type"] == "extra_forbidden":
            known = ", ".join(_HINTS)
            raise WorkerError(
                f"{source}: unknown key {key!r}: remove it (known keys: {known})", ExitCode.USAGE
            ) from None
        raise WorkerError(f"{source}: invalid {key}: set it to {hint}", ExitCode.USAGE) from None


def load_config(config_dir: Path) -> ServiceConfig:
    """The limits in ``<config_dir>/config.toml`` (defaults when there is no such file)."""
    path = config_path(config_dir)
    try:
        with path.open("rb") as handle:
            values = tomllib.load(handle)
    except FileNotFoundError:
        return ServiceConfig()
    except tomllib.TOMLDecodeError as exc:
        raise WorkerError(f"{path} is not valid TOML ({exc}): fix that line", ExitCode.USAGE) from None
    return validate_config(values, str(path))


# -- the checks ------------------------------------------------------------------------------------------------


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def on_battery_linux(power_root: Path = POWER_SUPPLY_ROOT) -> bool:
    """True when a battery discharges and no mains supply is online (sysfs ``type``/``online``/``status``).

    A desktop (no battery) or a laptop on its charger is not on battery."""
    if not power_root.is_dir():
        return False
    mains_online = False
    discharging = False
    for supply in sorted(power_root.iterdir()):
        kind = _read(supply / "type")
        if kind in ("Mains", "USB", "USB_C", "USB_PD") and _read(supply / "online") == "1":
            mains_online = True
        elif kind == "Battery" and _read(supply / "status") == "Discharging":
            discharging = True
    return discharging and not mains_online


def on_battery_macos(pmset_output: str | None = None) -> bool:
    """From ``pmset -g batt``: its first line says "Now drawing from 'Battery Power'" on battery."""
    if pmset_output is None:
        try:
            pmset_output = subprocess.run(
                ["pmset", "-g", "batt"], capture_output=True, text=True, timeout=10, check=False
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return False
    return "'Battery Power'" in pmset_output


def on_battery(power_root: Path = POWER_SUPPLY_ROOT) -> bool:
    return on_battery_macos() if sys.platform == "darwin" else on_battery_linux(power_root)


class CpuSampler:
    """The share of all CPU time that processes other than ``root_pid`` and its descendants used since the
    previous sample, from ``<proc_root>/stat`` and ``<proc_root>/<pid>/stat`` (Linux).

    The training child is one of our descendants, so a worker never pauses because of its own load."""

    def __init__(self, root_pid: int, proc_root: Path = PROC_ROOT):
        self.root_pid = root_pid
        self.proc_root = proc_root
        self._last: tuple[int, int, int] | None = None  # (total, busy, ours) in clock ticks

    def _system(self) -> tuple[int, int]:
        for line in _read(self.proc_root / "stat").splitlines():
            if line.startswith("cpu "):
                ticks = [int(v) for v in line.split()[1:]]
                idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
                total = sum(ticks[:8])  # guest time is already counted in user time
                return total, total - idle
        return 0, 0

    def _ours(self) -> int:
        children: dict[int, list[int]] = {}
        times: dict[int, int] = {}
        for entry in self.proc_root.iterdir():
            if not entry.name.isdigit():
                continue
            text = _read(entry / "stat")
            if not text:
                continue
            # the command name is in parentheses and may hold spaces: the fields follow the last ')'
            fields = text[text.rfind(")") + 2 :].split()
            if len(fields) < 13:
                continue
            pid = int(entry.name)
            children.setdefault(int(fields[1]), []).append(pid)
            times[pid] = int(fields[11]) + int(fields[12])  # utime + stime
        total, todo = 0, [self.root_pid]
        while todo:
            pid = todo.pop()
            total += times.get(pid, 0)
            todo.extend(children.get(pid, []))
        return total

    def others_share(self) -> float | None:
        """Other programs' share of all CPU time since the last call; None on the first call."""
        total, busy = self._system()
        ours = self._ours()
        last, self._last = self._last, (total, busy, ours)
        if last is None or total <= last[0]:
            return None
        # a child that exited took its ticks along: never count that as someone else's load
        others = (busy - last[1]) - max(0, ours - last[2])
        return max(0.0, min(1.0, others / (total - last[0])))
