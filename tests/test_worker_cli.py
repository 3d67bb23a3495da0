"""The volunteer's CLI on its own: the base install (no server extra)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from swarmhub.worker import cli

SERVER_STACK = ("fastapi", "sqlalchemy", "starlette", "alembic", "jinja2")

# An interpreter where the modules in argv[1] cannot be imported, as on a volunteer's machine with only the
# base install: it imports the worker's modules in argv[2], then runs the CLI with argv[3:].
WITHOUT = """
import importlib, importlib.abc, sys

blocked = sys.argv[1].split(",")


class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in blocked):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Missing())
for module in ["swarmhub.worker.cli", *filter(None, sys.argv[2].split(","))]:
    importlib.import_module(module)
assert not [name for name in sys.modules if any(name == b or name.startswith(b + ".") for b in blocked)]
sys.modules["swarmhub.worker.cli"].main(sys.argv[3:], prog_name="swarmhub")
"""


def without(blocked: tuple[str, ...], *args: str, imports: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", WITHOUT, ",".join(blocked), ",".join(imports), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_the_base_install_runs_without_the_server_stack():
    imports = (  # what `join` loads
        "swarmhub.worker.training",
        "swarmhub.worker.reporter",
        "swarmhub.worker.doctor",
        "swarmhub.worker.tasks.digits",
    )
    done = without((*SERVER_STACK, "swarmhub.server"), "--help", imports=imports)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "swarmhub login --server URL" in done.stdout
    for command in ("login", "join", "experiments", "doctor"):
        assert f"  {command} " in done.stdout


@pytest.mark.parametrize(
    "blocked", [SERVER_STACK, (*SERVER_STACK, "swarmhub.server")], ids=["web-stack-missing", "server-package-missing"]
)
@pytest.mark.parametrize("command", [["server"], ["admin", "root"], ["demo"]], ids=" ".join)
def test_server_commands_say_which_extra_to_install(blocked, command):
    done = without(blocked, *command)
    assert done.returncode == 1
    assert done.stderr == cli.SERVER_EXTRA_HINT + "\n"
    assert done.stdout == ""
