"""Stopping the server's peer processes: all at once, each within its own bound (``supervision.terminate_all``)."""

from __future__ import annotations

import subprocess
import sys
import time

from swarmhub.server.swarm.supervision import terminate_all

# A process that takes ``argv[1]`` seconds to leave after SIGTERM, as a peer leaving its swarm does; "never" ignores
# SIGTERM. It prints "ready" once its handler is in place.
LEAVING = """
import signal, sys, time
delay = sys.argv[1]
if delay == "never":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *_: (time.sleep(float(delay)), sys.exit(0)))
print("ready", flush=True)
while True:
    time.sleep(0.1)
"""


def leaving(delay: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", LEAVING, delay],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # as the host starts its peers: SIGKILL goes to the group
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    return process


def test_peers_stop_in_parallel_and_one_that_ignores_sigterm_is_killed_at_its_bound():
    """Three peers that each take 2 s to leave stop in about 2 s, not 6 (a busy server once took over a minute to
    stop an ALBERT run's peers one after another); a peer that ignores SIGTERM is killed when its bound passes."""
    slow = [leaving("2") for _ in range(3)]
    stuck = leaving("never")
    started = time.monotonic()
    terminate_all([*((process, 30.0, "a slow peer") for process in slow), (stuck, 3.0, "a stuck peer")])
    took = time.monotonic() - started
    assert [process.returncode for process in slow] == [0, 0, 0]
    assert stuck.returncode == -9
    assert 2.0 <= took < 6.0, took  # one after another: 9 s
