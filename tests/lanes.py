"""`make test`: the whole suite in three lanes that run at the same time.

- **processes**: the tests marked ``solo`` run real peers that train for a while, for so many minutes or to so many
  epochs (the end-to-end runs but the demo's, the background service's and the ALBERT run's, and the swarm tests
  that assert how far a swarm trains in its time). They run one at a time, in one pytest process: two training
  swarms side by side slow each other, and these tests' bounds on how far a swarm trains assume it has the
  machine's spare cores.
- **peers**: the other tests that start real peers or servers (marked ``swarm`` or ``e2e``): the short swarm tests
  (admission, leases, rogue requests, state downloads, signals), the swarm tests that train a fixed number of steps
  and assert what those steps did (averaged, with whom, the loss went down), the background service's and the
  ALBERT run's end-to-end runs, which assert no pace (the ALBERT run trains so many steps and asserts what they
  did).
- **the rest**: database, HTTP, websocket and unit tests, the pages in Chromium, and the end-to-end runs marked
  ``waits`` (the worker's install from the hub, the demo's start and stop: real processes, no pace asserted, which
  evened the lanes: the peers lane ended about 190 s after this one). Both of these lanes mostly wait
  on the database, a socket, a peer or the browser; side by side, each uses the cores the other leaves idle.

The processes lane's output streams as it goes; each other lane's is printed whole when it ends. Last come the
ten slowest tests of all lanes, the ten that used the most CPU, each lane's time and CPU, and the exit status: the
first failing lane's, else 0.

    python -m tests.lanes [PYTEST ARGS...]    # arguments are passed to every lane (for example -x or -k NAME)
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

LANES = {
    "processes": "solo",
    "peers": "not solo and not waits and (swarm or e2e)",
    "the rest": "not solo and (waits or not (swarm or e2e))",
}
NO_TESTS = 5  # pytest's exit status when a lane's selection is empty (for example under -k): not a failure


@dataclass
class Lane:
    name: str
    marks: str
    folder: Path
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    ended: float = 0.0

    @property
    def junit(self) -> Path:
        return self.folder / f"{self.name.replace(' ', '-')}.xml"

    @property
    def log(self) -> Path:
        return self.folder / f"{self.name.replace(' ', '-')}.log"

    def start(self, args: list[str], stream: bool) -> None:
        command = [sys.executable, "-m", "pytest", "-m", self.marks, f"--junitxml={self.junit}", *args]
        out = subprocess.PIPE if stream else self.log.open("wb")
        self.started = time.monotonic()
        self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)

    def wait(self) -> int:
        assert self.process is not None
        status = self.process.wait()
        self.ended = self.ended or time.monotonic()
        return status


def cases(lanes: list[Lane]) -> list[tuple[float, float, str, str]]:
    """(seconds, CPU seconds, test, lane) of every test of ``lanes``, set-up, call and tear-down together, from their
    JUnit files (the CPU seconds from the ``cpu_seconds`` property that tests/conftest.py records)."""
    found = []
    for lane in lanes:
        if not lane.junit.exists():
            continue
        for case in ET.parse(lane.junit).getroot().iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            cpu = [float(p.get("value") or 0) for p in case.iter("property") if p.get("name") == "cpu_seconds"]
            found.append((float(case.get("time") or 0), sum(cpu), name, lane.name))
    return found


def main(args: list[str]) -> int:
    folder = Path(os.environ.get("SWARMHUB_TEST_LANES_DIR") or tempfile.mkdtemp(prefix="swarmhub-lanes-"))
    folder.mkdir(parents=True, exist_ok=True)
    processes, *others = (Lane(name, marks, folder) for name, marks in LANES.items())
    began = time.monotonic()
    processes.start(args, stream=True)
    for lane in others:
        lane.start(args, stream=False)
    logs = ", ".join(f"lane '{lane.name}' writes {lane.log}" for lane in others)
    print(f"lane 'processes' ({processes.marks}) streams below; {logs}", flush=True)

    ended: queue.Queue[Lane] = queue.Queue()
    for lane in others:
        threading.Thread(target=lambda lane=lane: (lane.wait(), ended.put(lane)), daemon=True).start()
    printed: set[str] = set()

    def print_log(lane: Lane) -> None:
        print(f"\n===== lane '{lane.name}' ended after {lane.ended - lane.started:.0f} s =====", flush=True)
        sys.stdout.write(lane.log.read_text(errors="replace"))
        print("===== (lane 'processes' goes on) =====\n" if processes.process.poll() is None else "", flush=True)
        printed.add(lane.name)

    assert processes.process is not None and processes.process.stdout is not None
    for raw in processes.process.stdout:  # whole lines: another lane's log is printed between two of them
        sys.stdout.write(raw.decode(errors="replace"))
        sys.stdout.flush()
        while not ended.empty():
            print_log(ended.get())
    statuses = {lane.name: lane.wait() for lane in (processes, *others)}
    for lane in others:
        if lane.name not in printed:
            print_log(lane)

    found = cases([processes, *others])  # each JUnit file parsed once
    print("\n===== the ten slowest tests of all lanes (set-up, call and tear-down) =====")
    for seconds, _, name, lane_name in sorted(found, reverse=True)[:10]:
        print(f"{seconds:8.1f} s  {name}  [{lane_name}]")
    print("===== the ten tests of all lanes that used the most CPU (the lanes share 2 cores on the CI machine) =====")
    for seconds, cpu, name, lane_name in sorted(found, key=lambda case: case[1], reverse=True)[:10]:
        print(f"{cpu:8.1f} CPU s  {name}  [{lane_name}]")
    for lane in (processes, *others):
        cpu = sum(case[1] for case in found if case[3] == lane.name)
        print(
            f"lane '{lane.name}': {lane.ended - lane.started:.0f} s, {cpu:.0f} CPU s in its tests, "
            f"pytest exit status {statuses[lane.name]}"
        )
    print(f"the suite: {time.monotonic() - began:.0f} s of wall-clock time", flush=True)
    failed = [status for status in statuses.values() if status not in (0, NO_TESTS)]
    if all(status == NO_TESTS for status in statuses.values()):
        return NO_TESTS
    return failed[0] if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
