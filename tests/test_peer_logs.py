"""A server peer's log cannot fill the disk: a process that logs without end (as a peer does when strangers flood it
with refused averaging calls, one warning each) leaves at most (backups + 1) x the cap on disk, and the newest
lines are kept."""

from __future__ import annotations

import re
import subprocess
import sys

from swarmhub.server.swarm import peer_logs

FLOOD = """
import logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
log = logging.getLogger("hivemind.averaging")
for i in range(int(sys.argv[1])):
    log.warning("refused rpc_join_group from QmRogue%06d: not on the swarm's roster", i)
log.warning("last line")
"""


def test_a_flooding_peer_process_leaves_at_most_the_capped_logs_on_disk(tmp_path):
    lines = 300_000  # about 25 MB of warnings
    process = subprocess.Popen(
        [sys.executable, "-c", FLOOD, str(lines)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert process.stdout is not None
    copier = peer_logs.copy_to_log(process.stdout, tmp_path / "run.aux.log", max_bytes=2**20, backups=2)
    assert process.wait(120) == 0
    copier.join(60)
    assert not copier.is_alive()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["run.aux.log", "run.aux.log.1", "run.aux.log.2"], files
    sizes = [p.stat().st_size for p in tmp_path.iterdir()]
    assert all(size <= 2**20 for size in sizes) and sum(sizes) <= 3 * 2**20, sizes
    assert (tmp_path / "run.aux.log").read_text().rstrip().endswith("last line")
    # rotated in order: each backup holds the lines just before the newer file's
    numbers = [
        [int(n) for n in re.findall(r"QmRogue(\d{6}):", (tmp_path / name).read_text())]
        for name in ("run.aux.log.2", "run.aux.log.1", "run.aux.log")
    ]
    assert max(numbers[0]) < min(numbers[1]) and max(numbers[1]) < min(numbers[2]) and max(numbers[2]) == lines - 1


def test_a_restarted_peer_appends_to_its_log_within_the_cap(tmp_path):
    path = tmp_path / "run.checkpoints.log"
    path.write_bytes(b"x" * 900)
    log = peer_logs.CappedLog(path, max_bytes=1000, backups=1)
    log.write(b"y" * 250)
    log.close()
    assert path.read_bytes() == b"y" * 150
    assert (tmp_path / "run.checkpoints.log.1").read_bytes() == b"x" * 900 + b"y" * 100
