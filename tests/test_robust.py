"""What a peer accepts from strangers (``worker/swarm/robust.py``), through the pieces' own interfaces: hivemind's
reducer
protocol (``accumulate_part``), the epoch bound, the state checks; and the ``aggregation`` setting through the API.
The same protections against real attacking processes are in ``test_byzantine_swarm.py``."""

from __future__ import annotations

import asyncio
import math
import random

import pytest
import torch

from swarmhub.worker.swarm import access as swarm_access
from swarmhub.worker.swarm import aggregation, policy, robust, state_guard
from swarmhub.worker.swarm import epoch as swarm_epoch

from .conftest import api_token, make_user

REDUCERS: list = []  # every reducer :func:`reduce` made, latest last


@pytest.fixture(autouse=True)
def fresh_standing():
    """Each test's reducer rounds start with no sender's standing (it lives as long as the averager's process)."""
    robust.STANDING = aggregation.Standing()
    yield
    robust.STANDING = aggregation.Standing()


def reduce(
    parts: list[torch.Tensor],
    weights: list[float],
    aggregation: str,
    max_weight: float = math.inf,
    state_round: bool = False,
    own_id: str | None = None,
):
    """One slice through the guarded reducer, every sender concurrently, as hivemind's all-reduce calls it (a
    gradient round, or with ``state_round`` a round of the state averager, which the runner marks so), in the
    process of the peer ``own_id`` (one of the senders, ``peer-I``, or none of them)."""
    policy.POLICY.aggregation, policy.POLICY.max_weight = aggregation, max_weight
    reducer_class = robust.make_reducer_class()

    async def run() -> list[torch.Tensor]:  # made in the loop, as hivemind's all-reduce makes it
        senders = [f"peer-{i}" for i in range(len(parts))]
        reducer = reducer_class([parts[0].shape], len(parts), senders, "state" if state_round else None, own_id)
        REDUCERS.append(reducer)
        calls = [reducer.accumulate_part(i, 0, part, weight=w) for i, (part, w) in enumerate(zip(parts, weights))]
        return await asyncio.gather(*calls)

    try:
        results = asyncio.run(run())
    finally:
        policy.POLICY.aggregation, policy.POLICY.max_weight = "mean", math.inf
    assert all(torch.equal(results[0], r) for r in results)  # every sender gets the same average back
    return results[0]


def honest(n: int = 3, size: int = 2000, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.ones(size) + 0.1 * torch.randn(size, generator=generator) for _ in range(n)]


def test_the_plain_mean_is_hivemind_s_weighted_mean():
    parts = honest()
    result = reduce(parts, [10.0, 20.0, 30.0], "mean")
    expected = (10 * parts[0] + 20 * parts[1] + 30 * parts[2]) / 60
    assert torch.allclose(result, expected, atol=1e-6)


def test_a_non_finite_part_is_dropped_and_its_sender_flagged():
    robust.take_flags()
    parts = [*honest(), torch.full((2000,), float("nan"))]
    result = reduce(parts, [1.0, 1.0, 1.0, 1.0], "mean")
    assert torch.allclose(result, sum(parts[:3]) / 3, atol=1e-6)
    assert robust.take_flags() == {"peer-3": {"non-finite gradients": 1}}
    assert [peer for peer, _ in robust.credited(REDUCERS[-1])] == ["peer-0", "peer-1", "peer-2"]  # and no credit
    assert [peer for peer, _ in robust.credited(REDUCERS[-1])] == ["peer-0", "peer-1", "peer-2"]  # and not credited


def test_a_huge_claimed_weight_counts_at_most_twice_the_median_and_never_over_the_batch():
    parts = [*honest(), torch.full((2000,), 50.0)]
    result = reduce(parts, [64.0, 64.0, 64.0, 1e12], "mean", max_weight=256.0)
    # the liar counts as 128 (2 x the median claim), not as 1e12: its share is 128 / 320
    expected = (64 * (parts[0] + parts[1] + parts[2]) + 128 * parts[3]) / 320
    assert torch.allclose(result, expected, atol=1e-5)
    assert aggregation.capped_weights([64.0, 1e12], max_weight=256.0) == [64.0, 256.0]  # two senders: the batch caps it
    assert aggregation.capped_weights([64.0, float("inf"), -5.0, float("nan")]) == [64.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("attack", ["x-1000", "x100", "noise"])
def test_centered_clip_stays_near_the_honest_parts_where_the_mean_does_not(attack):
    parts = honest()
    mean_honest = sum(parts) / 3
    norm = mean_honest.norm()
    generator = torch.Generator().manual_seed(1)
    bad = {
        "x-1000": -1000 * parts[0],
        "x100": 100 * parts[0],
        "noise": (lambda n: n * norm / n.norm())(torch.randn(2000, generator=generator)),
    }[attack]
    weights = [1.0, 1.0, 1.0, 1.0]
    clipped = reduce([*parts, bad], weights, "centered-clip")
    plain = reduce([*parts, bad], weights, "mean")
    assert (clipped - mean_honest).norm() < 0.1 * norm  # within 10 % of the honest mean
    if attack != "noise":
        assert (plain - mean_honest).norm() > 10 * norm


@pytest.mark.parametrize("attack", ["x-1000", "x100"])
def test_centered_clip_of_two_parts_bounds_the_larger_by_the_smaller(attack):
    """A round of one honest sender and one attacker: no majority, and no medoid to start from. The attacker's part
    counts at the honest part's norm at most, whichever of the two comes first."""
    good = honest(1)[0]
    bad = {"x-1000": -1000 * good, "x100": 100 * good}[attack]
    for parts in ([good, bad], [bad, good]):
        clipped = reduce(parts, [1.0, 1.0], "centered-clip")
        assert clipped.norm() <= good.norm() * (1 + 1e-5)
        if attack == "x100":  # a scaled honest part: the result is the honest part itself
            assert torch.allclose(clipped, good, atol=1e-5)
        plain = reduce(parts, [1.0, 1.0], "mean")
        assert plain.norm() > 10 * good.norm()
    # two honest parts of similar norms: close to their mean
    pair = honest(2)
    assert (reduce(pair, [1.0, 1.0], "centered-clip") - sum(pair) / 2).norm() < 0.1 * (sum(pair) / 2).norm()


@pytest.mark.parametrize("attack", ["x-1000", "x100"])
def test_a_far_outlier_has_no_say_when_the_honest_noise_exceeds_the_gradient(attack):
    """At a volunteer's batch each honest part is mostly noise (here 3x the true gradient's norm): a part clipped
    to the honest spread would still pull the result by a third of it, enough to cancel the gradient. A part far
    outside the spread is left out, so the result is what the honest parts alone give."""
    generator = torch.Generator().manual_seed(2)
    size = 4096
    gradient = torch.ones(size) / size**0.5
    parts = [gradient + 3 * torch.randn(size, generator=generator) / size**0.5 for _ in range(3)]
    bad = {"x-1000": -1000 * parts[0], "x100": 100 * parts[0]}[attack]
    alone = reduce(parts, [1.0] * 3, "centered-clip")
    for order in ([*parts, bad], [bad, *parts]):
        assert torch.allclose(reduce(order, [1.0] * 4, "centered-clip"), alone, atol=1e-6)
    mean_honest = sum(parts) / 3
    cosine = torch.nn.functional.cosine_similarity
    assert cosine(alone, gradient, 0) > 0.9 * cosine(mean_honest, gradient, 0)


def test_a_part_inside_the_outlier_bound_moves_the_result_by_at_most_its_share_of_the_radius():
    """What the outlier bound leaves in is clipped: however far inside it the attacker sits, the result stays
    within about half the honest spread (the mean moves by a quarter of the attacker's distance)."""
    parts = honest(3)
    mean_honest = sum(parts) / 3
    spread = max((p - mean_honest).norm() for p in parts)
    direction = torch.randn(2000, generator=torch.Generator().manual_seed(3))
    for factor in (0.3, 0.6, 0.9):  # how far out, as a share of the outlier bound
        bad = mean_honest + factor * aggregation.CLIP_OUTLIER_FACTOR * spread * direction / direction.norm()
        clipped = reduce([*parts, bad], [1.0] * 4, "centered-clip")
        off = float((reduce([*parts, bad], [1.0] * 4, "mean") - mean_honest).norm())  # a quarter of its distance
        assert off == pytest.approx(factor * aggregation.CLIP_OUTLIER_FACTOR * float(spread) / 4, rel=1e-3)
        assert (clipped - mean_honest).norm() < 0.6 * spread  # clipped: the same bound however far out it is


PARTS = 30  # parts of each sender a reducer sees in the standing tests


def noisy_round(generator: torch.Generator, noise: float, samples=(1.0, 1.0, 1.0, 1.0)) -> list[torch.Tensor]:
    """Four honest parts of one gradient: each the gradient plus noise that shrinks with the sender's samples."""
    size = 2000
    gradient = torch.ones(size) / size**0.5
    return [gradient + noise / n**0.5 * torch.randn(size, generator=generator) / size**0.5 for n in samples]


@pytest.mark.parametrize(
    ("attack", "noise", "first"),
    [
        # the honest parts' cosine with the others' center about 0.87: a flipped part points clearly against it
        ("sign-flip", 0.5, 1),
        # about 0.37: no single part tells, a standing under zero does once seen in STANDING_EARLY_PARTS parts
        ("sign-flip", 1.3, aggregation.STANDING_EARLY_PARTS),
        # about 0.55, and a noise part's near zero: at the latest once seen in STANDING_MIN_PARTS parts
        ("noise", 1.0, aggregation.STANDING_MIN_PARTS),
    ],
    ids=["sign-flip-clear", "sign-flip-noisy", "noise"],
)
def test_a_part_of_an_honest_norm_that_keeps_pointing_elsewhere_loses_its_say_after_a_few_rounds(attack, noise, first):
    """Sign-flipped or random parts of an honest part's norm sit inside the honest spread, where clipping alone
    cannot tell them apart (each still pulls the result by its share of the radius). A flipped part in a part whose
    senders clearly share a direction points against it and has no say from its first round; otherwise, over rounds,
    the sender's standing stays at or below zero while the honest senders' stays positive. From then on its parts
    have no say, the result is what the honest parts give alone, and the sender is flagged once its standing is
    under the bound it is held to by STANDING_FLAG_T standard errors (not on one part's evidence): a sign-flipper
    for gradients against the swarm's, a noise sender (a freeloader: its parts train nothing) for gradients
    unrelated to it."""
    robust.take_flags()
    generator = torch.Generator().manual_seed(5)
    offsets, screened = [], []
    for _ in range(PARTS):
        parts = noisy_round(generator, noise=noise)
        bad = -parts[3] if attack == "sign-flip" else torch.randn(2000, generator=generator)
        parts[3] = bad * parts[3].norm() / bad.norm()
        result = reduce(parts, [1.0] * 4, "centered-clip")
        alone = aggregation.centered_clip(torch.stack(parts[:3]), torch.ones(3))
        offsets.append(float((result - alone).norm() / alone.norm()))
        assert robust.STANDING.left_out in ([], ["peer-3"])  # never an honest sender
        screened.append(robust.STANDING.left_out == ["peer-3"])
        credited = [peer for peer, _ in robust.credited(REDUCERS[-1])]  # what the server's witness would record
        assert credited == [f"peer-{i}" for i in range(4 - len(robust.STANDING.left_out))]
    seen_when_screened = screened.index(True) + 1
    if attack == "sign-flip":
        assert seen_when_screened == first, screened
    else:
        assert 1 < seen_when_screened <= first, screened
    assert all(screened[seen_when_screened - 1 :]), screened  # and from then on in every part
    if seen_when_screened > 1:
        assert min(offsets[: seen_when_screened - 1]) > 0.01  # clipped, it still moved the result
    assert max(o for o, s in zip(offsets, screened) if s) < 1e-6  # screened: the honest parts' result alone
    flags = robust.take_flags()
    assert set(flags) == {"peer-3"}, flags  # flagged with the evidence of its standing, no honest sender
    # One flag a part once its standing is under the bound it is held to by 3 standard errors: a sign-flipper's
    # (under zero) from its STANDING_MIN_PARTS-th part at the latest, a noise sender's (near zero, under half the
    # others' median) from its 20th at the latest; never before its STANDING_EARLY_PARTS-th.
    reason, latest = (
        (robust.DISSENT_REASON, aggregation.STANDING_MIN_PARTS)
        if attack == "sign-flip"
        else (robust.UNRELATED_REASON, 20)
    )
    assert set(flags["peer-3"]) == {reason}, flags
    assert PARTS - latest + 1 <= flags["peer-3"][reason] <= PARTS - aggregation.STANDING_EARLY_PARTS + 1, flags


def test_a_reducer_leaves_out_its_own_stray_part_but_never_flags_its_own_peer():
    """An honest peer's reducer screens every sender's part the same way, its own included (a noisy part of its own
    can stand apart from the others'), but a flag is evidence against another peer for the organizer: in a full
    run, an honest volunteer's reducer had flagged its own peer twice."""
    robust.take_flags()
    generator = torch.Generator().manual_seed(5)
    screened = []
    for _ in range(aggregation.STANDING_MIN_PARTS + 4):
        parts = noisy_round(generator, noise=1.3)
        parts[3] = -parts[3]  # a part of its own that points away from the others', as a sign-flip's does
        reduce(parts, [1.0] * 4, "centered-clip", own_id="peer-3")
        screened.append(robust.STANDING.left_out == ["peer-3"])
    assert screened[-1], screened  # left out of the reduction like any sender's
    assert robust.take_flags() == {}  # and never flagged by its own reducer


def test_a_standing_under_zero_by_chance_is_no_evidence_and_a_sign_flippers_is():
    """The dissent flag is evidence for the organizer: an honest sender whose agreements are mostly noise (0.1 +-
    0.4 a part) dips under zero now and then, and is not flagged for it; a sign-flipper's (-0.3 +- 0.3) stays there
    and is, within a few dozen parts. 200 pairs of senders over 60 parts each."""
    rng = random.Random(3)
    dipped = flagged_honest = 0
    first_flags = []
    for _ in range(200):
        standing = aggregation.Standing()
        first = None
        for part in range(1, 61):
            standing.observe(["honest", "flipper"], [rng.gauss(0.1, 0.4), rng.gauss(-0.3, 0.3)], [1.0, 1.0])
            if part >= aggregation.STANDING_EARLY_PARTS and standing.score["honest"] < 0:
                dipped += 1
                flagged_honest += standing.evidence("honest") <= -aggregation.STANDING_FLAG_T
            if first is None and standing.evidence("flipper") <= -aggregation.STANDING_FLAG_T:
                first = part
        first_flags.append(first if first is not None else 999)
    assert dipped > 100  # the old rule (under zero after 4 parts) would have flagged each of these
    assert flagged_honest <= 2, flagged_honest
    assert sorted(first_flags)[180] <= 30, sorted(first_flags)  # 9 flippers in 10 flagged within 30 parts


def test_honest_senders_keep_their_say_whether_fast_slow_or_noisy():
    """Honest senders with an eighth of the others' samples, and rounds whose parts are mostly noise: nobody is
    screened out (a screened honest sender's samples would be wasted), and nobody is flagged."""
    robust.take_flags()
    generator = torch.Generator().manual_seed(6)
    for noise, samples in ((2.0, (16.0, 16.0, 16.0, 1.0)), (6.0, (1.0, 1.0, 1.0, 1.0))):
        robust.STANDING = aggregation.Standing()
        for _ in range(60):
            parts = noisy_round(generator, noise, samples)
            reduce(parts, list(samples), "centered-clip")
            assert robust.STANDING.left_out == []
    assert robust.take_flags() == {}


def test_centered_clip_of_honest_parts_is_their_mean_within_their_spread():
    parts = honest(4)
    spread = max((p - sum(parts) / 4).norm() for p in parts)
    assert (reduce(parts, [1.0] * 4, "centered-clip") - sum(parts) / 4).norm() < 0.2 * spread


def test_a_state_round_averages_peers_a_step_apart_instead_of_taking_one_side():
    """Peers in step hold identical parameters. Two that missed the last step and two that took it: a robust
    estimate around the medoid takes one pair's parameters whole (here the stale pair's, undoing the step for
    everyone); a state round under centered-clip is the weighted mean, as under hivemind's own averaging."""
    behind = torch.linspace(-1.0, 1.0, 2000)
    ahead = behind - 0.01 * torch.sign(behind)  # one optimizer step later
    parts = [behind.clone(), behind.clone(), ahead.clone(), ahead.clone()]
    medoid = aggregation.centered_clip(torch.stack(parts), torch.ones(4))
    assert torch.equal(medoid, behind)  # the stale side, whole
    result = reduce(parts, [1.0] * 4, "centered-clip", state_round=True)
    assert torch.allclose(result, (behind + ahead) / 2, atol=1e-6)


def test_a_state_round_leaves_out_a_part_whose_norm_is_far_from_the_others():
    parts = [*honest(), honest(1, seed=1)[0] * 100]  # an attacker's parameters x100
    result = reduce(parts, [1.0] * 4, "mean", state_round=True)
    assert torch.allclose(result, sum(parts[:3]) / 3, atol=1e-6)
    robust_result = reduce(parts, [1.0] * 4, "centered-clip", state_round=True)
    assert torch.equal(robust_result, torch.stack(parts[:3]).median(dim=0).values)
    two = reduce([parts[0], parts[3]], [1.0, 1.0], "mean", state_round=True)  # no majority: the smaller norm is kept
    assert torch.equal(two, parts[0])


def test_a_state_round_under_centered_clip_gives_parameters_of_an_honest_norm_no_say():
    """Three peers in step hold the same parameters; the fourth sends parameters of the same norm, elsewhere (as a
    peer whose own optimizer stepped uphill would). The norm bound cannot tell it apart: under the mean every peer
    takes a quarter of it at every epoch; under centered-clip the coordinate median leaves the honest parameters
    as they are. Weights do not buy a say either."""
    params = torch.linspace(-1.0, 1.0, 2000)
    elsewhere = params.flip(0) * 0.9 + 0.05 * torch.randn(2000, generator=torch.Generator().manual_seed(3))
    assert 0.9 < float(elsewhere.norm() / params.norm()) < 1.1
    parts = [params.clone(), params.clone(), params.clone(), elsewhere]
    mean = reduce(parts, [1.0] * 4, "mean", state_round=True)
    assert torch.allclose(mean, (3 * params + elsewhere) / 4, atol=1e-6)
    assert torch.equal(reduce(parts, [1.0, 1.0, 1.0, 50.0], "centered-clip", state_round=True), params)
    # two senders have no majority: the mean of the two, as hivemind's
    two = reduce([params, elsewhere], [1.0, 1.0], "centered-clip", state_round=True)
    assert torch.allclose(two, (params + elsewhere) / 2, atol=1e-6)


def test_the_swarm_s_epoch_has_one_vote_per_account():
    # from ada's view (epoch 7): bob is at 7, mallory says 1007 with two peers; the lower median of the other
    # accounts' votes is 7, so records past 8 are ignored
    entries = [("ada", 7), ("bob", 7), ("mallory", 1007), ("mallory", 1007)]
    assert swarm_epoch.epoch_bound(entries, "ada", 7) == 8
    # a newcomer at epoch 0 judges the same way
    assert swarm_epoch.epoch_bound([*entries, ("joan", 0)], "joan", 0) == 8
    # an account that forges a low epoch does not hold back a peer further on
    assert swarm_epoch.epoch_bound([("ada", 7), ("mallory", 0)], "ada", 7) == 8
    # alone, or with only its own account: nothing to judge by
    assert swarm_epoch.epoch_bound([("ada", 7)], "ada", 7) is None


def test_state_comes_from_the_server_s_peer_first_and_never_from_past_the_bound():
    names = {"srv": swarm_access.SERVER_PEER_USERNAME, "a": "ada", "m": "mallory", "b": "bob"}
    order, ahead = state_guard.order_sources(
        {"srv": 9.0, "a": 10.0, "m": 1010.0, "b": 8.0}, names, bound=11, own_id="me"
    )
    assert order == ["srv", "a", "b"] and ahead == ["m"]
    # a server peer far behind (a checkpoint minutes old) is not preferred over the swarm's newest state
    order, _ = state_guard.order_sources({"srv": 2.0, "a": 10.0}, names, bound=11, own_id="me")
    assert order == ["a", "srv"]
    # peers not on the roster are never asked
    assert state_guard.order_sources({"x": 5.0}, names, bound=None, own_id="me") == ([], [])


def test_a_peer_flagged_with_evidence_is_not_followed_but_a_lagging_one_is():
    robust.take_flags()
    robust.flag("late", "epoch ahead of the swarm")  # an honest peer can be off the swarm's epoch for a while
    robust.flag("poisoner", "state with non-finite values")
    assert "poisoner" in robust.distrusted() and "late" not in robust.distrusted()
    # its records neither vote nor count: the swarm's epoch is read from the others
    from hivemind.optim.progress_tracker import LocalTrainingProgress
    from hivemind.utils.crypto import RSAPrivateKey
    from hivemind.utils.timed_storage import ValueWithExpiration

    keys = {name: RSAPrivateKey() for name in ("ada", "bob", "carl", "joan", "poisoner")}
    ids = {name: swarm_access.peer_id_for_public_key(k.get_public_key().to_bytes()) for name, k in keys.items()}
    epochs = {"ada": 7, "bob": 7, "carl": 7, "joan": 8, "poisoner": 8}
    subkeys = {name: b"[owner:" + key.get_public_key().to_bytes() + b"]" for name, key in keys.items()}
    metadata = {
        subkeys[name]: ValueWithExpiration(
            LocalTrainingProgress(
                peer_id=b"x", epoch=epoch, samples_accumulated=1, samples_per_second=1.0, time=0.0, client_mode=False
            ).dict(),
            0.0,
        )
        for name, epoch in epochs.items()
    }
    names = {ids[name]: ("mallory" if name == "poisoner" else name) for name in keys}
    distrusted = {ids["poisoner"]} | robust.distrusted()
    kept, bound, _ = swarm_epoch.bounded_progress(metadata, names, "ada", 7, frozenset(distrusted))
    assert bound == 8 and set(kept) == {subkeys[n] for n in ("ada", "bob", "carl", "joan")}  # joan's 8 moves ada
    kept, _, _ = swarm_epoch.bounded_progress(metadata, names, "ada", 7)
    assert len(kept) == 5
    # one epoch past both ada's and the others' median is followed only from a peer ada averaged with: joan gets
    # there by completing a round, a forger by publishing a record
    robust.averaged_with([ids["joan"]])
    partners = robust.partners()
    assert ids["joan"] in partners and ids["poisoner"] not in partners
    kept, _, ahead = swarm_epoch.bounded_progress(metadata, names, "ada", 7, frozenset(), partners)
    assert set(kept) == {subkeys[n] for n in ("ada", "bob", "carl", "joan")} and ahead == [ids["poisoner"]]
    kept, _, _ = swarm_epoch.bounded_progress(metadata, names, "ada", 7, frozenset(), frozenset())
    assert set(kept) == {subkeys[n] for n in ("ada", "bob", "carl")}
    robust.take_flags()


def test_the_server_s_checkpoint_peer_is_bounded_by_the_witness_s_record_not_by_a_lone_forger():
    """With the forger's the only volunteer record (hivemind publishes none for an out-of-sync peer), the other
    accounts' median is the forger's epoch; the server's checkpoint peer holds records against the witness's."""
    from hivemind.optim.progress_tracker import LocalTrainingProgress
    from hivemind.utils.crypto import RSAPrivateKey
    from hivemind.utils.timed_storage import ValueWithExpiration

    keys = {name: RSAPrivateKey() for name in ("witness", "keeper", "mallory")}
    ids = {name: swarm_access.peer_id_for_public_key(k.get_public_key().to_bytes()) for name, k in keys.items()}
    epochs = {"witness": 0, "keeper": 0, "mallory": 40}
    metadata = {
        b"[owner:" + keys[name].get_public_key().to_bytes() + b"]": ValueWithExpiration(
            LocalTrainingProgress(
                peer_id=b"x", epoch=epoch, samples_accumulated=0, samples_per_second=0.0, time=0.0, client_mode=False
            ).dict(),
            0.0,
        )
        for name, epoch in epochs.items()
    }
    server = swarm_access.SERVER_PEER_USERNAME
    names = {ids["witness"]: server, ids["keeper"]: server, ids["mallory"]: "mallory"}
    kept, bound, ahead = swarm_epoch.bounded_progress(metadata, names, server, 0, own_peer=ids["keeper"])
    assert bound == 1 and ahead == [ids["mallory"]] and len(kept) == 2
    # without saying which peer it is, a server peer has no hub to follow: the forger's epoch is the bound
    _, bound, ahead = swarm_epoch.bounded_progress(metadata, names, server, 0)
    assert bound == 41 and ahead == []


def test_a_state_with_non_finite_values_or_a_jump_in_norm_is_refused():
    own = [torch.ones(10), torch.ones(5)]
    assert state_guard.check_state([torch.ones(10) * 2, torch.ones(5), torch.zeros(3)], own) is None
    assert "non-finite" in state_guard.check_state([torch.ones(10), torch.full((5,), float("inf"))], own)
    assert "norm" in state_guard.check_state([torch.ones(10) * 100, torch.ones(5) * 100], own)
    assert state_guard.check_state([torch.ones(10) * 100, torch.ones(5) * 100], None) is None  # the server's peer


def test_the_organizer_picks_the_aggregation_and_workers_get_it(client, db):
    make_user(db, "olga")
    auth = api_token(client, "olga")
    body = {"slug": "robust-digits", "title": "Robust digits", "task": "digits", "aggregation": "centered-clip"}
    created = client.post("/api/experiments", json=body, headers=auth)
    assert created.status_code == 201, created.text
    assert created.json()["aggregation"] == "centered-clip"
    bad = client.patch("/api/experiments/robust-digits", json={"aggregation": "median"}, headers=auth)
    assert bad.status_code == 422 and "aggregation" in bad.text
    changed = client.patch("/api/experiments/robust-digits", json={"aggregation": "mean"}, headers=auth)
    assert changed.status_code == 200 and changed.json()["aggregation"] == "mean"
    assert client.get("/api/experiments/robust-digits", headers=auth).json()["aggregation"] == "mean"


def test_a_noise_sender_whose_standing_fell_just_under_zero_is_flagged_as_noise_not_as_against_the_swarm():
    """A noise sender's standing sits near zero, and on either side of it by chance (its agreement's small bias comes
    from the round: the honest parts' spread, its share of the weight). Its flag says noise, "unrelated", on both
    sides; "against the swarm's" is kept for a standing under zero by the flag's evidence (in CI, a run of the swarm
    test named its noise sender a sign-flipper in each of the three honest reducers). Here noise leaning a tenth of
    its norm against the gradient: a standing of about -0.01, 8 senders of 30 parts each."""
    standings = []
    for seed in range(8):
        robust.STANDING = aggregation.Standing()
        robust.take_flags()
        generator = torch.Generator().manual_seed(seed)
        for _ in range(30):
            parts = noisy_round(generator, noise=1.0)
            bad = torch.randn(2000, generator=generator) - 0.1  # the gradient is ones / sqrt(2000): leaning away
            parts[3] = bad * parts[3].norm() / bad.norm()
            reduce(parts, [1.0] * 4, "centered-clip")
        standings.append(robust.STANDING.score["peer-3"])
        flags = robust.take_flags()
        assert set(flags) == {"peer-3"} and set(flags["peer-3"]) == {robust.UNRELATED_REASON}, (seed, flags)
    assert sum(s < 0 for s in standings) >= 4 and all(abs(s) < 0.05 for s in standings), standings
