"""A training peer's progress records: a bounded rate, with every epoch's start and final count sent at once.

hivemind's progress tracker stores a signed record in the DHT after every training step; each costs the peer's DHT
process, its p2pd and every receiving peer a signature and a check. swarmhub's tracker sends at most one every
``PROGRESS_INTERVAL`` seconds. These tests run hivemind's and swarmhub's trackers on a real DHT on 127.0.0.1 and
count the records each stores, and read the records back from the DHT.
"""

from __future__ import annotations

import time

import pytest
from hivemind.utils.crypto import RSAPrivateKey

from swarmhub.worker.swarm import epoch as swarm_epoch
from swarmhub.worker.swarm import progress as swarm_progress

pytestmark = pytest.mark.swarm

STEP_SECONDS = 0.01  # a fast peer: 100 steps a second
TARGET = 1_000_000


@pytest.fixture
def dht():
    import hivemind

    dht = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    try:
        yield dht
    finally:
        dht.shutdown()


def counting_stores(dht) -> list[float]:  # noqa: ANN001
    """Instrument hivemind's DHT handle: the times at which a progress record was stored through it."""
    stores: list[float] = []
    store = dht.store

    def counted(key, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        if str(key).endswith("_progress"):
            stores.append(time.monotonic())
        return store(key, *args, **kwargs)

    dht.store = counted
    return stores


def make_tracker(dht, run_id: str, swarmhub: bool):  # noqa: ANN001
    if swarmhub:
        roster = swarm_epoch.Roster(dht, run_id, RSAPrivateKey().get_public_key(), own_username="ada")
        return swarm_progress.make_tracker_class()(
            dht=dht, prefix=run_id, target_batch_size=TARGET, start=True, roster=roster
        )
    from hivemind.optim.progress_tracker import ProgressTracker

    return ProgressTracker(dht=dht, prefix=run_id, target_batch_size=TARGET, start=True)


def train(tracker, seconds: float, samples: int = 0, epoch: int = 0) -> int:  # noqa: ANN001
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        samples += 32
        tracker.report_local_progress(epoch, samples)
        time.sleep(STEP_SECONDS)
    return samples


def samples_seen(dht, run_id: str) -> dict[int, int]:  # noqa: ANN001
    """Epoch -> samples of every progress record in the DHT now."""
    found = dht.get(f"{run_id}_progress", latest=True)
    if found is None or not isinstance(found.value, dict):
        return {}
    return {entry.value["epoch"]: entry.value["samples_accumulated"] for entry in found.value.values()}


def test_a_fast_peer_stores_a_few_records_a_second_where_hivemind_stores_one_per_step(dht):
    first = dht
    counts = {}
    for swarmhub in (False, True):
        stores = counting_stores(first)
        tracker = make_tracker(first, f"rate-{int(swarmhub)}", swarmhub)
        try:
            train(tracker, 3.0)
        finally:
            tracker.shutdown()
        counts[swarmhub] = len(stores)
        del first.store  # undo the instrument
    seconds = 3.0
    assert counts[True] <= seconds / swarm_progress.PROGRESS_INTERVAL + 3, counts  # + the epoch's first, slack
    assert counts[False] > 3 * counts[True], counts


def test_the_latest_count_goes_out_within_the_interval_and_an_epoch_s_final_count_at_once(dht):
    first = dht
    run_id = "rate-final"
    stores = counting_stores(first)
    tracker = make_tracker(first, run_id, swarmhub=True)
    try:
        samples = train(tracker, 1.0)
        # The peer stops stepping (say, it waits for an averaging round): its last count still reaches the swarm.
        time.sleep(swarm_progress.PROGRESS_INTERVAL + 1.0)
        assert samples_seen(first, run_id).get(0) == samples
        # A count that completes the epoch goes out at once, however recently the last record went.
        tracker.report_local_progress(0, samples + 32)  # sent at once: the last record went long ago
        time.sleep(0.1)
        before = len(stores)
        tracker.target_batch_size = samples  # this count completes the epoch
        tracker.report_local_progress(0, samples + 64)
        deadline = time.monotonic() + swarm_progress.PROGRESS_INTERVAL / 2
        while len(stores) == before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(stores) > before, "the epoch's final count waited for the interval"
        # So does the first record of the next epoch.
        before = len(stores)
        tracker.report_local_progress(1, 0)
        deadline = time.monotonic() + swarm_progress.PROGRESS_INTERVAL / 2
        while len(stores) == before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(stores) > before, "the new epoch's first record waited for the interval"
        deadline = time.monotonic() + 10
        while samples_seen(first, run_id).get(1) != 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert samples_seen(first, run_id).get(1) == 0, samples_seen(first, run_id)
    finally:
        tracker.shutdown()
