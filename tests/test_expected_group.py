"""The group a trainer's gradient round waits for: itself, the other volunteers' peers and the witness whose progress
records it follows (``progress.group_peers``), and the matchmaking rule that reads it (``matchmaking.expect_group``)."""

from __future__ import annotations

from typing import Any

from hivemind.dht.schema import RSASignatureValidator
from hivemind.optim.progress_tracker import LocalTrainingProgress
from hivemind.utils import ValueWithExpiration
from hivemind.utils.crypto import RSAPrivateKey

from swarmhub.server.swarm import witnesses
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

    others = {peers[name] for name in ("ada", "ada-second-machine", "grace")}
    assert group_peers(records, names, peers["me"]) == (others, 1)
    assert group_peers(None, names, peers["me"]) == (frozenset(), 0)
    assert group_peers({b"[owner:not-a-key]": records[next(iter(records))]}, names, peers["me"]) == (frozenset(), 0)


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
    # with averaging groups: a dealt group of 2 volunteers' peers and its witness begins once those 3 are in, under
    # the experiment's target (group_size 3 and a witness); in the shared key, the experiment's target alone
    leader._prefix = "run_grad_averager"
    leader.__dict__["target_group_size"] = 4
    try:
        matchmaking.expect_group(3, group=1)
        assert matchmaking._target_group_size(leader) == 3
        assert matchmaking._needed_group_size(leader) == 3
        matchmaking.look_in_group(-1)
        assert matchmaking._target_group_size(leader) == 4
    finally:
        matchmaking.look_in_group(-1)
    matchmaking.expect_group(0)


def test_every_peer_deals_the_same_groups_of_at_most_group_size_and_each_epoch_anew() -> None:
    """Seven volunteers' peers in groups of 3: each deals from its own place the same three groups (3, 2, 2), one per
    witness the server runs for them; the next epoch deals them otherwise, so no two peers always share a group."""
    peers = [f"QmPeer{i}" for i in range(7)]
    assert matchmaking.groups_for(7, 3) == 3 == witnesses.wanted(7, 3)

    def dealt(epoch: int) -> dict[str, tuple[int, int]]:
        return {peer: matchmaking.deal(epoch, [p for p in peers if p != peer], peer, 3) for peer in peers}

    groups: dict[int, set[str]] = {}
    for peer, (group, members) in dealt(11).items():
        groups.setdefault(group, set()).add(peer)
    assert sorted(groups) == [0, 1, 2]
    assert sorted(len(members) for members in groups.values()) == [2, 2, 3]
    for peer, (group, members) in dealt(11).items():
        assert members == len(groups[group])  # what each expects is what the others dealt it
    assert any(dealt(epoch) != dealt(11) for epoch in range(12, 15))
    assert {matchmaking.deal(5, [], "QmAlone", 3)} == {(0, 1)}
    assert matchmaking.groups_for(100, 3) == matchmaking.MAX_GROUPS  # as many witnesses as the server runs at most


def test_a_dealt_group_looks_in_its_own_key_and_state_rounds_in_hivemind_s() -> None:
    from hivemind.averaging.key_manager import GroupKeyManager, is_valid_group

    class Dht:
        peer_id = None

    gradients = GroupKeyManager(Dht(), "run_grad_averager", "", 4)
    state = GroupKeyManager(Dht(), "run_state_averager", "", None)
    try:
        matchmaking.look_in_group(-1)
        assert gradients.current_key == "run_grad_averager.0b"  # the shared key
        matchmaking.look_in_group(5)
        assert gradients.current_key == "run_grad_averager.0b101" and is_valid_group(gradients.current_key)
        assert state.current_key == "run_state_averager.0b"
        assert matchmaking.dealt_group() == 5
    finally:
        matchmaking.look_in_group(-1)
