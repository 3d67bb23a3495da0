"""How many witnesses the server runs for an experiment: one per averaging group of the volunteers' peers its
monitor counted, the server's own peers left out, at least one and at most ``MAX_WITNESSES``."""

from __future__ import annotations

import subprocess
from pathlib import Path

from swarmhub.server.swarm.events import Progress
from swarmhub.server.swarm.host import Peer, SwarmHost
from swarmhub.server.swarm.witnesses import MAX_WITNESSES


def test_one_witness_per_group_of_volunteers_peers(tmp_path: Path) -> None:
    host = SwarmHost(tmp_path, "127.0.0.1")
    process = subprocess.Popen(["sleep", "60"])
    try:
        peer = host._peers["run"] = Peer(run_id="run", process=process)
        assert host.witnesses_wanted("run", 3) == 1  # nothing read yet

        def read(volunteers: int) -> None:
            contributors = [{"peer_id": f"peer-{i}", "username": f"volunteer-{i % 4}"} for i in range(volunteers)]
            contributors += [{"peer_id": "witness", "username": "swarmhub"}, {"peer_id": "x", "username": None}]
            peer.progress = Progress(
                epoch=1, peers=volunteers + 2, samples_per_second=1.0, samples=1, contributors=contributors
            )

        read(7)
        assert host.witnesses_wanted("run", 3) == 3  # groups of 3, 3 and 1
        assert host.witnesses_wanted("run", 0) == 1  # one group
        read(6)
        assert host.witnesses_wanted("run", 3) == 2
        assert host.witnesses_wanted("run", 2) == 3
        read(1000)
        assert host.witnesses_wanted("run", 2) == MAX_WITNESSES
        read(0)
        assert host.witnesses_wanted("run", 2) == 1
    finally:
        process.kill()
        process.wait()
