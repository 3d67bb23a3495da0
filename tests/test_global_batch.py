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

from swarmhub.worker.swarm import access as swarm_access
from swarmhub.worker.swarm import epoch as swarm_epoch
from swarmhub.worker.swarm import progress as swarm_progress

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


def make_tracker(dht, run_id: str, target: int, roster: swarm_epoch.Roster):  # noqa: ANN001, ANN201
    """swarmhub's progress tracker with hivemind's read schedule, as a training peer runs it."""
    tracker_class = swarm_progress.make_tracker_class()
    return tracker_class(dht=dht, prefix=run_id, target_batch_size=target, start=True, roster=roster)


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
    tracker = swarm_progress.make_tracker_class()(
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


def test_peers_that_start_together_count_each_other_before_either_completes_the_batch_alone(two_dhts):
    """Two volunteers start at once. A peer's first read of the swarm's progress finds no record yet and no rate of
    its own (hivemind's EMA starts at ~0 samples/s): hivemind schedules the next read 3 s away (10 s once its own
    record is there), and a peer that completes the target in that time alone does: the first global batch was up to
    1.56 targets with two peers (bench/convergence.py at 1.4 s epochs). Here the next read comes when this peer's
    own rate says it should: the other's samples count while this one has done a fraction of the batch."""
    from hivemind.utils.timed_storage import get_dht_time

    ada_dht, bob_dht = two_dhts
    run_id, experiment, target = "joint-start", RSAPrivateKey(), 300_000
    roster = swarm_epoch.Roster(ada_dht, run_id, experiment.get_public_key(), own_username="ada")
    # hivemind's read schedule as a training peer runs it (0.5 s to 10 s apart, 3 s while no record is there)
    tracker = make_tracker(ada_dht, run_id, target, roster)
    try:
        tracker.report_local_progress(0, 1_000)  # the first step
        tracker.global_progress.next_fetch_time = 0.0  # the first read comes now, before anyone else's record
        tracker.fetched_global_progress_this_epoch.clear()
        tracker.global_state_updated.set()
        assert tracker.fetched_global_progress_this_epoch.wait(10), "the tracker did not read the swarm's progress"
        scheduled = tracker.global_progress.next_fetch_time - get_dht_time()
        assert scheduled >= 2.5, f"hivemind scheduled the next read {scheduled:.1f} s away"

        join_as_bob(bob_dht, run_id, experiment, BOB_SAMPLES)
        samples = 1_000
        while not tracker.kept_epochs and samples < 2 * target:  # until a read has followed bob's record
            time.sleep(0.01)  # a step of 1,000 samples every 10 ms or more: 3 s or more to the target alone
            samples += 1_000
            tracker.report_local_progress(0, samples)
        assert tracker.kept_epochs, "bob's record was never read"
        assert tracker.global_progress.samples_accumulated >= BOB_SAMPLES, "bob's samples were not counted"
        assert samples < 0.6 * target, f"bob was counted only once this peer alone had {samples:,} of {target:,}"
    finally:
        tracker.shutdown()


def test_the_rate_a_peer_publishes_is_timed_from_its_first_step(two_dhts):
    """The seconds between the tracker's creation and the first step are the worker's start-up (the model, the
    data, a state download), not training: counted, they keep the rate this peer publishes (which the other peers
    extrapolate its count with) far too low for dozens of steps. A slow step (ALBERT's are seconds) makes that a
    whole epoch."""
    ada_dht, _ = two_dhts
    roster = swarm_epoch.Roster(ada_dht, "rate", RSAPrivateKey().get_public_key(), own_username="ada")
    tracker = make_tracker(ada_dht, "rate", TARGET, roster)
    try:
        time.sleep(2.0)  # start-up
        started = time.monotonic()
        for step in range(1, 7):  # 1,000 samples a step, a step every 50 ms at most: 20,000 samples/s or more
            tracker.report_local_progress(0, step * 1_000)
            time.sleep(0.05)
        pace = 5_000 / (time.monotonic() - started)
        rate = tracker.performance_ema.samples_per_second
        assert rate > 0.5 * pace, f"the start-up counted: {rate:,.0f} samples/s published, {pace:,.0f} trained"
    finally:
        tracker.shutdown()


def test_after_the_epoch_length_guard_s_wait_a_lone_peer_trains_a_whole_batch_before_its_next_epoch(two_dhts):
    """The training loop waits after an epoch change when epochs are shorter than ``matchmaking_time``
    (``training_loop.trainer_loop``). The peer trains nothing while it waits; its next epoch must still take a whole
    target batch of its training, not end after a step or two because its record (stamped at the epoch change) was
    extrapolated over the wait: a peer alone in its swarm trained at a tenth of the guard's cap so."""
    from hivemind.utils.timed_storage import get_dht_time

    ada_dht, _ = two_dhts
    run_id, experiment, ada = "guard-wait", RSAPrivateKey(), RSAPrivateKey()
    public_key = ada.get_public_key().to_bytes()
    swarm_access.add_roster_validators(ada_dht, run_id, ada)  # as the worker does: its records are on the roster
    token = swarm_access.sign_token(experiment, run_id, "ada", public_key, timedelta(minutes=5))
    assert swarm_access.publish_roster_entry(ada_dht, run_id, token)
    roster = swarm_epoch.Roster(ada_dht, run_id, experiment.get_public_key(), own_username="ada")
    target = 1_600  # about half a second of this peer's training (32 samples a step, a step every 10 ms or more)
    tracker = swarm_progress.make_tracker_class()(
        dht=ada_dht, prefix=run_id, target_batch_size=target, start=True, roster=roster, private_key=ada
    )
    try:
        samples, deadline = 32, time.monotonic() + 10
        tracker.report_local_progress(0, samples)
        while tracker.global_progress.num_peers != 1 and time.monotonic() < deadline:  # its own record, followed
            tracker.global_progress.next_fetch_time = get_dht_time()
            tracker.global_state_updated.set()
            time.sleep(0.1)
        assert tracker.global_progress.num_peers == 1, tracker.global_progress
        while not tracker.ready_to_update_epoch:
            samples += 32
            tracker.report_local_progress(0, samples)
            time.sleep(0.01)
        with tracker.pause_updates():
            tracker.update_epoch(1)
        with tracker.performance_ema.pause():  # the guard's wait
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:  # hivemind reads the swarm's progress as it scheduled, during it
                tracker.global_progress.next_fetch_time = get_dht_time()
                tracker.global_state_updated.set()
                time.sleep(0.25)
        tracker.resume_after_wait()
        rate, resumed, samples = tracker.performance_ema.samples_per_second, time.monotonic(), 0
        while not tracker.ready_to_update_epoch:
            samples += 32
            tracker.report_local_progress(1, samples)
            time.sleep(0.01)
        seconds = time.monotonic() - resumed
        # A whole batch, or as long as one takes at the rate it published (a busy machine steps slower than that).
        # Extrapolated over the wait (3 s at its rate: about six batches), the epoch ended at once.
        assert samples >= 0.8 * target or seconds >= 0.6 * target / rate, (samples, target, seconds, rate)
    finally:
        tracker.shutdown()
