"""The group a trainer's gradient round waits for: itself, the other volunteers' peers and the witness whose progress
records it follows (``progress.group_peers``), and the matchmaking rule that reads it (``matchmaking.expect_group``)."""

from __future__ import annotations

from typing import Any

from hivemind.dht.schema import RSASignatureValidator
from hivemind.optim.progress_tracker import LocalTrainingProgress
from hivemind.utils import ValueWithExpiration
from hivemind.utils.crypto import RSAPrivateKey

from swarmhub.worker.swarm import matchmaking
from swarmhub.worker.swarm.access import SERVER_PEER_USERNAME
from swarmhub.worker.swarm.epoch import owner_peer_id
from swarmhub.worker.swarm.progress import group_peers


def _signed_record() -> tuple[bytes, Any, str]:
    subkey = RSASignatureValidator(RSAPrivateKey()).local_public_key
    peer = owner_peer_id(subkey)
    assert peer is not None
    progress = LocalTrainingProgress(
        peer_id=b"x", epoch=3, samples_accumulated=64, samples_per_second=10.0, time=1.0, client_mode=False
    )
    return subkey, ValueWithExpiration(progress.dict(), 1e12), peer


def test_the_expected_group_is_the_roster_s_other_volunteers_and_the_server_s_peers() -> None:
    records: dict[bytes, Any] = {}
    names: dict[str, str] = {}
    peers = {}
    for name in ("me", "ada", "ada-second-machine", "grace", "witness", "stranger"):
        subkey, value, peer = _signed_record()
        records[subkey] = value
        peers[name] = peer
        if name != "stranger":  # a signer on no roster entry is no one's group
            names[peer] = SERVER_PEER_USERNAME if name == "witness" else name.split("-")[0]
    names[peers["ada-second-machine"]] = "ada"  # two peers of one account are two peers of the group

    assert group_peers(records, names, peers["me"]) == (3, 1)
    assert group_peers(None, names, peers["me"]) == (0, 0)
    assert group_peers({b"[owner:not-a-key]": records[next(iter(records))]}, names, peers["me"]) == (0, 0)


def test_a_gradient_round_waits_for_its_expected_group_only_until_its_epoch_has_ended() -> None:
    class Step:
        triggered = False
        scheduled_time = 0.0

    class Peer:
        def to_base58(self) -> str:
            return "QmLeader"

    class Leader:  # the attributes of hivemind's Matchmaking that the rule reads
        _prefix = "run_grad_averager"
        step_control = Step()
        peer_id = Peer()
        current_followers: dict[Any, Any] = {}
        group_key_manager = None

    matchmaking.expect_group(0)
    leader = Leader()
    leader.__dict__["min_group_size"] = 2
    assert matchmaking._needed_group_size(leader) == 2  # nothing expected: hivemind's own threshold
    matchmaking.expect_group(5)
    assert matchmaking._needed_group_size(leader) == 5  # before its epoch's end: the whole group or keep looking
    assert matchmaking._target_group_size(leader) == 5  # and it begins the moment the fifth joins
    Leader.step_control.triggered = True
    assert matchmaking._needed_group_size(leader) == 2  # its epoch ended: whoever is there
    leader._prefix = "run_state_averager"
    Leader.step_control.triggered = False
    assert matchmaking._needed_group_size(leader) == 2  # state rounds are hivemind's
    assert matchmaking._target_group_size(leader) is None
    matchmaking.expect_group(0)
