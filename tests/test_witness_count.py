"""How many witnesses the server runs for an experiment: one per averaging group of the volunteers' peers its
monitor counted, the server's own peers left out, at least one and at most ``MAX_WITNESSES``."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

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


@pytest.mark.swarm
def test_a_witness_with_no_round_yet_states_the_epoch_it_was_started_with() -> None:
    """A witness started again (after a crash or a server restart) in a swarm whose records it has not read states
    the ledger's newest epoch, not 0, until its own rounds show the swarm's (a real DHT, roster and hivemind
    progress tracker; nothing in the swarm yet)."""
    import time

    import hivemind
    from hivemind.utils.crypto import RSAPrivateKey

    from swarmhub.worker.swarm.epoch import Roster
    from swarmhub.worker.swarm.witness import Witness, make_recording_tracker_class

    dht = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    tracker = None
    try:
        key = RSAPrivateKey()
        tracker = make_recording_tracker_class()(dht=dht, prefix="restart", target_batch_size=64, start=True)
        deadline = time.monotonic() + 30
        while tracker.last_read is None and time.monotonic() < deadline:
            time.sleep(0.1)
        roster = Roster(dht, "restart", key.get_public_key(), "swarmhub")
        fresh = Witness(dht, "restart", b"key", roster)
        again = Witness(dht, "restart", b"key", roster, evidenced=42)
        assert fresh.swarm_epoch(tracker) == 0
        assert again.swarm_epoch(tracker) == 42
    finally:
        if tracker is not None:
            tracker.shutdown()
        dht.shutdown()
