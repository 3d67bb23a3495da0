"""The volunteer's CLI on its own: the base install (no server extra) and the live progress line of `join`."""

from __future__ import annotations

import io
import subprocess
import sys
import time

import pytest

from swarmhub.worker import errors
from swarmhub.worker.join import session
from swarmhub.worker.training.peer import Progress

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
for module in ["swarmhub.worker.cli.main", *filter(None, sys.argv[2].split(","))]:
    importlib.import_module(module)
assert not [name for name in sys.modules if any(name == b or name.startswith(b + ".") for b in blocked)]
sys.modules["swarmhub.worker.cli.main"].main(sys.argv[3:], prog_name="swarmhub")
"""


def without(blocked: tuple[str, ...], *args: str, imports: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", WITHOUT, ",".join(blocked), ",".join(imports), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_the_base_install_runs_without_the_server_stack():
    imports = (  # what `join` loads
        "swarmhub.worker.training.peer",
        "swarmhub.worker.join.reporter",
        "swarmhub.worker.join.doctor",
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
    assert done.stderr == errors.SERVER_EXTRA_HINT + "\n"
    assert done.stdout == ""


# -- the progress line of `join` ----------------------------------------------------------------------------


class Terminal(io.StringIO):
    """What `join` writes to when a person watches it."""

    def isatty(self) -> bool:
        return True


def progress(step: int, peers: int = 2, averaged: int = 0) -> Progress:
    return Progress(
        step=step,
        samples=64 * step,
        epoch=step // 10,
        loss=2.5 / step,
        samples_per_second=128.0,
        peers=peers,
        averaged_peers=averaged,
        elapsed=step / 2,
    )


def test_progress_on_a_terminal_rewrites_one_line():
    stream = Terminal()
    line = session._ProgressLine(stream)
    for step in (1, 2, 20):
        line.update(progress(step, averaged=2 if step == 20 else 0))
    shown = stream.getvalue()
    assert "\n" not in shown  # one line, rewritten in place
    assert shown.count("\r") == 3
    last = shown.rsplit("\r", 1)[1]
    assert last == "epoch 2 | 2 peers (averaged with 2) | 1,280 samples | loss 0.1250 | 128 samples/s\x1b[K"
    line.finish()
    assert stream.getvalue() == shown + "\n"  # what follows starts on a line of its own
    line.finish()
    assert stream.getvalue() == shown + "\n"


def test_progress_to_a_file_is_a_line_every_few_seconds(monkeypatch):
    monkeypatch.setattr(session, "PLAIN_PROGRESS_EVERY", 0.5)
    stream = io.StringIO()
    line = session._ProgressLine(stream)
    for step in range(1, 201):  # a fast loop reports far more often than a log wants
        line.update(progress(step, peers=1))
    assert stream.getvalue() == "epoch 0 | 1 peers | 64 samples | loss 2.5000 | 128 samples/s\n"
    time.sleep(0.6)
    line.update(progress(300, peers=3, averaged=3))
    line.finish()
    assert stream.getvalue().splitlines() == [
        "epoch 0 | 1 peers | 64 samples | loss 2.5000 | 128 samples/s",
        "epoch 30 | 3 peers (averaged with 3) | 19,200 samples | loss 0.0083 | 128 samples/s",
    ]
    assert "\r" not in stream.getvalue() and "\x1b" not in stream.getvalue()


@pytest.mark.parametrize("skew", [-35.0, 35.0])
def test_join_stops_beyond_30_s_of_clock_skew_and_not_within_it(skew):
    """The bound is 30 s each way; the skew is measured from the middle of the request's round trip, so a slow
    answer is not taken for a clock that is off."""
    from swarmhub.worker.client import ExitCode, WorkerError, check_clock

    now = 1_800_000_000.0
    check_clock(server_time=now, sent_at=now + skew * 25 / 35, received_at=now + skew * 25 / 35)  # 25 s: fine
    check_clock(server_time=now, sent_at=now - 20.0, received_at=now + 20.0)  # a 40 s round trip, clocks agree
    with pytest.raises(WorkerError) as refused:
        check_clock(server_time=now, sent_at=now + skew, received_at=now + skew)
    assert refused.value.exit_code == ExitCode.CLOCK
    assert f"35 s {'ahead of' if skew > 0 else 'behind'} the server's" in str(refused.value)


def test_ctrl_c_while_the_command_loads_ends_it_with_one_line_and_exit_130():
    """`swarmhub join --any` passes Ctrl-C on to the join it has just started, which may still be loading its
    modules (about a second; several on a busy machine). It ends as a loaded command does, with one line and exit
    code 130, never a KeyboardInterrupt traceback from inside an import."""
    import signal

    loader = (
        "import runpy, sys\n"
        "print('python is up', flush=True)\n"  # the interpreter's own start-up is not swarmhub's to handle
        "sys.argv = ['swarmhub', '--version']\n"
        "runpy.run_module('swarmhub.worker.cli.main', run_name='__main__')\n"
    )
    # Ctrl-C's default disposition, whatever the suite inherited (a background job starts with SIGINT ignored)
    process = subprocess.Popen(
        [sys.executable, "-c", loader],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert process.stdout is not None
    assert process.stdout.readline() == "python is up\n"
    began = time.monotonic()
    time.sleep(0.1)  # in the module's imports, which take 0.4 s or more
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert "Traceback" not in err, err
    assert (process.returncode, err.strip(), out) == (130, "Interrupted.", ""), (time.monotonic() - began, out, err)
