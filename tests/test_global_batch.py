"""The swarm's batch counts every admitted peer's samples from its first progress record.

A training peer reads the other peers' progress records through the swarm's roster (a record is followed only when
its signer holds an admitted token). A peer that joined after the reader's last roster read used to count for
nothing until the reader's next scheduled read (``ROSTER_CACHE_SECONDS``): the reader then kept accumulating as if it
were alone, and the epoch's global batch overshot its target by up to that peer's share. Real hivemind DHTs on
127.0.0.1, swarmhub's progress tracker, a roster entry signed as the server signs tokens.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from hivemind.utils.crypto import RSAPrivateKey

from swarmhub.worker import robust, swarm_access, swarm_epoch

pytestmark = pytest.mark.swarm

TARGET = 1_000_000
BOB_SAMPLES = 5_000


@pytest.fixture
def two_dhts():
    import hivemind

    first = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    second = hivemind.DHT(
        initial_peers=[str(m) for m in first.get_visible_maddrs()], host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True
    )
    try:
        yield first, second
    finally:
        second.shutdown()
        first.shutdown()


def join_as_bob(dht, run_id: str, experiment: RSAPrivateKey, samples: int) -> None:  # noqa: ANN001
    """bob's peer enters the swarm: its roster entry (a token of the run), then a progress record, both signed by its
    key, stored through ``dht``."""
    from hivemind.optim.progress_tracker import LocalTrainingProgress
    from hivemind.utils.timed_storage import get_dht_time

    bob = RSAPrivateKey()
    public_key = bob.get_public_key().to_bytes()
    swarm_access.add_roster_validators(dht, run_id, bob)  # this DHT now signs with bob's key
    token = swarm_access.sign_token(experiment, run_id, "bob", public_key, timedelta(minutes=5))
    assert swarm_access.publish_roster_entry(dht, run_id, token)
    record = LocalTrainingProgress(
        peer_id=dht.peer_id.to_bytes(),
        epoch=0,
        samples_accumulated=samples,
        samples_per_second=0.0,  # a count that does not grow: what is counted is the record itself
        time=get_dht_time(),
        client_mode=False,
    )
    assert dht.store(
        f"{run_id}_progress",
        subkey=swarm_access.roster_subkey(public_key),
        value=record.dict(),
        expiration_time=get_dht_time() + 60,
    )


def test_a_peer_that_joins_after_the_last_roster_read_counts_towards_the_batch_at_once(two_dhts):
    ada_dht, bob_dht = two_dhts
    run_id, experiment = "late-roster", RSAPrivateKey()
    roster = swarm_epoch.Roster(ada_dht, run_id, experiment.get_public_key(), own_username="ada")
    tracker = robust.make_tracker_class()(
        dht=ada_dht,
        prefix=run_id,
        target_batch_size=TARGET,
        start=True,
        roster=roster,
        min_refresh_period=0.2,
        max_refresh_period=0.5,
        default_refresh_period=0.5,
    )
    try:
        assert roster.usernames() == {}  # read now (no one else is here yet): the next scheduled read is 10 s away
        first_read = time.monotonic()
        join_as_bob(bob_dht, run_id, experiment, BOB_SAMPLES)
        # Well within the roster's cache time: bob's samples count from his first record.
        deadline = time.monotonic() + swarm_epoch.ROSTER_UNKNOWN_SECONDS + 3.0
        while tracker.global_progress.samples_accumulated < BOB_SAMPLES and time.monotonic() < deadline:
            time.sleep(0.1)
        counted = tracker.global_progress.samples_accumulated
        assert time.monotonic() - first_read < swarm_epoch.ROSTER_CACHE_SECONDS, "too slow to tell the two apart"
        assert counted >= BOB_SAMPLES, f"bob's record was not counted: {counted} samples"
    finally:
        tracker.shutdown()
