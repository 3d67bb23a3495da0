"""The worker this hub serves: a wheel of the running swarmhub, its sha256, and the command that installs it.

A volunteer installs the worker from the hub it joins, pinned to the hub's own version and to the wheel's hash:

    pip install "swarmhub @ https://HUB/download/swarmhub-X.Y.Z-py3-none-any.whl#sha256=..."

pip checks the hash before it installs anything, and a direct URL never resolves the name ``swarmhub`` on a package
index, so whoever publishes a package under that name elsewhere cannot stand in for this one. The worker's
dependencies (torch, hivemind, ...) come from the volunteer's package index as usual.

Where the wheel comes from, in order:
- ``SWARMHUB_WORKER_WHEEL_DIR``: a folder holding ``swarmhub-{version}-py3-none-any.whl`` of the running version
  (the container image builds it there at build time);
- otherwise, when this server runs from a source tree (a clone, an editable install), a wheel built from that tree
  once, in the background at start-up, with the Python build backend pyproject.toml names and no network, and kept in
  the user's cache folder under a digest of the sources: every server started from the same sources shares it, and a
  changed source builds a new one.
Neither: the pages say that this hub serves no worker, and ``GET /api/worker`` answers with ``available: false``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from platformdirs import user_cache_dir

from swarmhub import __version__
from swarmhub.common.platforms import PLATFORMS
from swarmhub.common.protocol import WorkerInstall

logger = logging.getLogger("swarmhub.worker_package")

# What goes into the wheel, relative to the source root (pyproject.toml's packages and package data).
SOURCES = ("pyproject.toml", "README.md", "swarmhub", "server", "worker", "web/templates", "web/static", "migrations")
VENDORED = "web/node_modules/uplot/dist"  # package data when present (uPlot for the dashboard's charts)
BUILD_TIMEOUT = 300.0


def wheel_name(version: str = __version__) -> str:
    return f"swarmhub-{version}-py3-none-any.whl"


@dataclass(frozen=True)
class WorkerPackage:
    path: Path
    sha256: str
    version: str = __version__

    @property
    def filename(self) -> str:
        return self.path.name

    def url(self, base_url: str) -> str:
        return f"{base_url.rstrip('/')}/download/{self.filename}"

    def command(self, base_url: str, upgrade: bool = False) -> str:
        """The command a volunteer runs: pinned to this hub's wheel and its hash."""
        flag = "-U " if upgrade else ""
        return f'pip install {flag}"swarmhub @ {self.url(base_url)}#sha256={self.sha256}"'


def source_root() -> Path | None:
    """The source tree this server runs from (a clone or an editable install), or None (installed from a wheel)."""
    root = Path(__file__).resolve().parents[2]
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file() or not (root / "worker").is_dir():
        return None
    with contextlib.suppress(OSError):
        if 'name = "swarmhub"' in pyproject.read_text():
            return root
    return None


def _files(root: Path) -> list[Path]:
    found = []
    for name in (*SOURCES, VENDORED):
        path = root / name
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found.extend(
                p
                for p in sorted(path.rglob("*"))
                if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
            )
    return found


def source_digest(root: Path) -> str:
    """A digest of the version and every file that goes into the wheel (names and contents)."""
    digest = hashlib.sha256(__version__.encode())
    for path in _files(root):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:24]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def build(root: Path, cache_dir: Path) -> Path:
    """The wheel of the sources under ``root``: from the cache when these sources were built before, else built now
    (into a copy of the sources, so that the tree gains no build folder and concurrent builds do not meet)."""
    target = cache_dir / source_digest(root)
    wheel = target / wheel_name()
    if wheel.is_file():
        return wheel
    cache_dir.mkdir(parents=True, exist_ok=True)
    with (cache_dir / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another server process may be building the same sources
        if wheel.is_file():
            return wheel
        with tempfile.TemporaryDirectory(prefix="swarmhub-wheel-") as tmp:
            copy = Path(tmp) / "src"
            for path in _files(root):
                dest = copy / path.relative_to(root)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, dest)
            out = Path(tmp) / "out"
            command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
            done = subprocess.run(  # noqa: S603 - our own interpreter and arguments
                [*command, "--wheel-dir", str(out), str(copy)],
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT,
                env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
            )
            built = out / wheel_name()
            if done.returncode != 0 or not built.is_file():
                raise RuntimeError(f"pip wheel failed ({done.returncode}): {(done.stderr or done.stdout)[-500:]}")
            staging = cache_dir / f".{target.name}.tmp"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            shutil.move(str(built), staging / wheel.name)
            staging.rename(target)
    return wheel


class WorkerPackages:
    """The wheel one server process serves: found or built once, in the background, from start-up."""

    def __init__(self, wheel_dir: Path | None, cache_dir: Path | None = None):
        self.wheel_dir = wheel_dir
        self.cache_dir = cache_dir or Path(user_cache_dir("swarmhub")) / "worker-wheels"
        self._package: WorkerPackage | None = None
        self.problem: str | None = None  # why none is served, once that is known
        self._ready = threading.Event()
        self._started = False
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
        threading.Thread(target=self._prepare, name="swarmhub-worker-wheel", daemon=True).start()

    def wait(self, timeout: float | None = None) -> WorkerPackage | None:
        self.start()
        self._ready.wait(timeout)
        return self._package

    def current(self) -> WorkerPackage | None:
        """The package when it is ready (None while it is prepared, or when there is none)."""
        return self._package

    def _prepare(self) -> None:
        try:
            path = self._locate()
            self._package = WorkerPackage(path=path, sha256=file_sha256(path))
            logger.info("serving the worker %s (sha256 %s)", path.name, self._package.sha256)
        except Exception as exc:  # the hub runs on without serving its worker; the pages say so
            self.problem = str(exc)
            logger.warning("this hub serves no worker package: %s", exc)
        finally:
            self._ready.set()

    def _locate(self) -> Path:
        if self.wheel_dir is not None:
            path = self.wheel_dir / wheel_name()
            if not path.is_file():
                raise FileNotFoundError(f"SWARMHUB_WORKER_WHEEL_DIR holds no {wheel_name()}")
            return path
        root = source_root()
        if root is None:
            raise FileNotFoundError(
                f"installed without its sources: set SWARMHUB_WORKER_WHEEL_DIR to a folder holding {wheel_name()}"
            )
        return build(root, self.cache_dir)


def install_info(packages: WorkerPackages, base: str) -> WorkerInstall:
    """What ``GET /api/worker`` answers and the pages show, for a hub reached at ``base``."""
    package = packages.current()
    if package is None:
        return WorkerInstall(available=False, version=__version__, platforms=PLATFORMS, problem=packages.problem)
    return WorkerInstall(
        available=True,
        version=package.version,
        filename=package.filename,
        url=package.url(base),
        sha256=package.sha256,
        command=package.command(base),
        upgrade_command=package.command(base, upgrade=True),
        platforms=PLATFORMS,
    )


def main() -> int:
    """``python -m swarmhub.server.http.worker_package``: build (or find) the wheel this source tree's server serves, as
    ``make setup`` does, so that no server builds it at start-up."""
    root = source_root()
    if root is None:
        print("not a source tree: nothing to build (the server serves SWARMHUB_WORKER_WHEEL_DIR's wheel)")
        return 0
    packages = WorkerPackages(None)
    package = packages.wait()
    if package is None:
        print(f"could not build the worker wheel: {packages.problem}", file=sys.stderr)
        return 1
    print(f"worker wheel: {package.path} (sha256 {package.sha256})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
