"""A volunteer installs the worker from the hub it joins, with the command the hub's pages show, and joins.

A real ``swarmhub server`` builds the wheel of its own sources at start-up (``server/http/worker_package.py``) and shows
``pip install "swarmhub @ URL#sha256=..."`` on its pages and in ``GET /api/worker``. The test runs that command in a
fresh virtual environment that has no swarmhub (the worker's dependencies, torch and hivemind, are lent to it from
the project's environment through a ``.pth`` file, as a volunteer who installed torch first has them; nothing is
downloaded: pip runs with ``--no-index``), then ``swarmhub --version`` and a short ``swarmhub join`` from it.
A wheel whose bytes differ from the hash the hub states is refused by pip: a tampered download installs nothing.
"""

from __future__ import annotations

import html
import os
import re
import shlex
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from swarmhub import __version__

from ..processes import DIGITS_SLUG, http, running_server, signup, start_digits_experiment

pytestmark = [pytest.mark.e2e, pytest.mark.waits, pytest.mark.timeout(420)]  # see tests/lanes.py


def wait_package(url: str, timeout: float = 240.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = http.get(f"{url}/api/worker", timeout=10).json()
        if found["available"] or found["problem"]:
            return found
        time.sleep(1.0)
    raise AssertionError("the hub did not prepare its worker package in time")


def fresh_environment(where: Path) -> Path:
    """A new virtual environment without swarmhub, its dependencies visible through a folder of links to the
    project environment's site-packages (everything but swarmhub's own files)."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, capture_output=True, timeout=120)
    python = where / "bin" / "python"
    # Python 3.11's venv bundles an old setuptools, which would shadow the lent one (torch needs a newer one)
    subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", "setuptools"], capture_output=True, timeout=120)
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    lent = where.parent / "lent-site-packages"
    lent.mkdir()
    ours = Path(sysconfig.get_paths()["purelib"])
    for entry in ours.iterdir():
        if entry.name.startswith(("swarmhub", "__editable__", "_swarmhub", "pip")) or entry.suffix == ".pth":
            continue
        (lent / entry.name).symlink_to(entry)
    (Path(purelib) / "lent.pth").write_text(f"{lent}\n")
    return python


def test_a_fresh_environment_installs_the_worker_from_the_hub_and_joins(tmp_path):
    with running_server(tmp_path) as (url, _):
        package = wait_package(url)
        assert package["available"], package
        assert package["version"] == __version__
        assert re.fullmatch(r"[0-9a-f]{64}", package["sha256"])
        command = package["command"]
        assert command == f'pip install "swarmhub @ {url}/download/{package["filename"]}#sha256={package["sha256"]}"'
        # the pages show the same command (the front page and an experiment's dashboard)
        start_digits_experiment(url)
        for page in ("/", f"/experiments/{DIGITS_SLUG}"):
            shown = html.unescape(http.get(f"{url}{page}", timeout=30).text)
            assert command in shown, page

        python = fresh_environment(tmp_path / "fresh")
        swarmhub = python.parent / "swarmhub"
        assert not swarmhub.exists()
        # the page's command, run by the fresh environment's pip (offline: every dependency is already there)
        argv = shlex.split(command)
        assert argv[:2] == ["pip", "install"]
        installed = subprocess.run(
            [str(python), "-m", *argv, "--no-index"], capture_output=True, text=True, timeout=240, cwd=tmp_path
        )
        assert installed.returncode == 0, installed.stdout + installed.stderr
        version = subprocess.run(
            [str(swarmhub), "--version"], capture_output=True, text=True, timeout=120, cwd=tmp_path
        )
        assert version.stdout.strip() == f"swarmhub, version {__version__}", version.stdout + version.stderr
        where = subprocess.run(
            [str(python), "-c", "import swarmhub; print(swarmhub.__file__)"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )
        assert str(tmp_path / "fresh") in where.stdout, where.stdout  # the installed copy, not the project's

        # `swarmhub upgrade` names the same wheel and hash
        upgrade = subprocess.run(
            [str(swarmhub), "upgrade", "--server", url, "--dry-run"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        assert upgrade.returncode == 0, upgrade.stderr
        assert f"swarmhub @ {package['url']}#sha256={package['sha256']}" in upgrade.stdout

        # ... and the installed worker joins the hub's experiment and trains
        token = signup(url, "newcomer")
        env = {
            **os.environ,
            "SWARMHUB_SERVER": url,
            "SWARMHUB_TOKEN": token,
            "SWARMHUB_CONFIG_DIR": str(tmp_path / "newcomer"),
            "SWARMHUB_STATE_DIR": str(tmp_path / "newcomer"),
            "SWARMHUB_CACHE_DIR": str(tmp_path / "newcomer" / "cache"),
        }
        joined = subprocess.run(
            [str(swarmhub), "join", DIGITS_SLUG, "--max-steps", "5", "--listen", "/ip4/127.0.0.1/tcp/0"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert joined.returncode == 0, joined.stdout[-2000:] + joined.stderr[-2000:]
        assert f"Joined '{DIGITS_SLUG}'" in joined.stdout, joined.stdout[-2000:]
        assert "Done: 5 steps" in joined.stderr, joined.stderr[-2000:]


def test_a_wheel_that_does_not_match_the_stated_hash_installs_nothing(tmp_path):
    """A download altered on the way (a hostile mirror or proxy): pip checks the hash the hub's command pins."""
    with running_server(tmp_path) as (url, _):
        package = wait_package(url)
        assert package["available"], package
        python = fresh_environment(tmp_path / "fresh")
        forged = "0" * 64
        refused = subprocess.run(
            [str(python), "-m", "pip", "install", "--no-index", f"swarmhub @ {package['url']}#sha256={forged}"],
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert refused.returncode != 0
        assert "DO NOT MATCH THE HASHES" in refused.stderr, refused.stderr[-2000:]
        assert not (python.parent / "swarmhub").exists()
        # and the hub serves only its own wheel
        for name in ("../settings.py", "swarmhub-0.0.1-py3-none-any.whl", "..%2F..%2Fpyproject.toml"):
            assert http.get(f"{url}/download/{name}", timeout=10).status_code == 404, name
