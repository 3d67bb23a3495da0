"""The split of the vector to reduce: hivemind's bandwidth-aware split, with no reachable peer left at zero."""

from __future__ import annotations

import pytest
import torch

from swarmhub.worker import load_balancing
from swarmhub.worker.load_balancing import MIN_SHARE, balanced_parts

from .swarm_processes import loopback_dhts

VECTOR = 307_210  # the digits MLP at its widest


def test_a_slow_reachable_peer_still_reduces_a_part() -> None:
    from hivemind.averaging.load_balancing import load_balance_peers

    # what join measured in bench/heterogeneous_network.py: fast, slow, slow, a client-mode peer, an auxiliary peer
    bandwidths = [95.4, 9.5, 9.4, 0.0, 97.0]
    assert 0 in load_balance_peers(VECTOR, bandwidths)[1:3]  # hivemind alone leaves a slow peer nothing
    parts = balanced_parts(VECTOR, bandwidths)
    assert sum(parts) == VECTOR
    assert parts[3] == 0  # client mode reduces nothing
    for slow in (1, 2):
        assert parts[slow] >= int(VECTOR * MIN_SHARE)
        assert parts[slow] < VECTOR // 10  # a floor, not an even split: the fast peers keep most of it
    assert parts[0] > VECTOR // 3 and parts[4] > VECTOR // 3
    assert balanced_parts(VECTOR, bandwidths) == parts  # every peer of the group computes the same split


@pytest.mark.parametrize(
    "bandwidths", [[None, None, None, 0.0], [10.0, 10.0, 10.0], [100.0, 1.0], [0.0, 5.0], [7.0], [50.0, 0.0, 0.0]]
)
def test_splits_hivemind_already_gives_every_reducer_are_unchanged(bandwidths: list[float | None]) -> None:
    from hivemind.averaging.load_balancing import load_balance_peers

    assert balanced_parts(VECTOR, bandwidths) == load_balance_peers(VECTOR, bandwidths)


def test_a_tiny_vector_is_split_without_losing_an_element() -> None:
    parts = balanced_parts(7, [1000.0, 1.0, 1.0, 0.0])
    assert sum(parts) == 7 and parts[3] == 0 and min(parts[:3]) >= 1


DIGITS_WIDEST = [(4096, 64), (4096,), (10, 4096), (10,)]  # the tensors of VECTOR
MEASURED = [92.0, 9.6, 9.6, 0.0, 94.5]  # join's measurements in bench/heterogeneous_network.py


def parts_by_peer(shapes: list[tuple[int, ...]], bandwidths: list[float], part_size: int) -> list[int]:
    """How many values of the vector each peer of the group reduces: hivemind's cut of the tensors into parts,
    each part given whole to one peer (what every peer of a round computes)."""
    from hivemind.averaging.partition import TensorPartContainer

    size = sum(torch.Size(shape).numel() for shape in shapes)
    container = TensorPartContainer(
        [torch.zeros(shape) for shape in shapes], balanced_parts(size, bandwidths), part_size_bytes=part_size
    )
    return [sum(part.numel() for part, _ in parts) for parts in container._input_parts_by_peer]


def test_the_swarm_s_part_size_keeps_the_split_a_group_computes() -> None:
    shares = balanced_parts(VECTOR, MEASURED)
    reduced = parts_by_peer(DIGITS_WIDEST, MEASURED, load_balancing.part_size_bytes(VECTOR))
    assert sum(reduced) == VECTOR and reduced[3] == 0
    for peer in (0, 1, 2, 4):
        assert reduced[peer] > 0  # every reachable peer reduces, the slow ones too
        assert abs(reduced[peer] - shares[peer]) <= 2 * VECTOR / load_balancing.PARTS_PER_VECTOR
    # hivemind's 512 KiB parts: the vector is 5 parts, and the slow peers' shares get none of them
    coarse = parts_by_peer(DIGITS_WIDEST, MEASURED, 2**19)
    assert coarse[1] == coarse[2] == 0
    # and with no bandwidth at all, four equal shares came out as 43 %, 0, 43 % and 15 %
    even = parts_by_peer(DIGITS_WIDEST, [None, None, None, None], 2**19)  # type: ignore[list-item]
    assert 0 in even
    fine = parts_by_peer(DIGITS_WIDEST, [None, None, None, None], load_balancing.part_size_bytes(VECTOR))  # type: ignore[list-item]
    assert all(abs(n - VECTOR / 4) <= VECTOR / load_balancing.PARTS_PER_VECTOR for n in fine)


@pytest.mark.parametrize("values", [10, 19_210, VECTOR, 11_000_000, 300_000_000])
def test_the_part_size_is_bounded_and_depends_on_the_vector_only(values: int) -> None:
    size = load_balancing.part_size_bytes(values)
    assert load_balancing.MIN_PART_BYTES <= size <= 2**19
    if load_balancing.MIN_PART_BYTES < size < 2**19:
        assert values * 4 // size == load_balancing.PARTS_PER_VECTOR
    assert load_balancing.averager_options(values, None) == {"part_size_bytes": size}
    assert load_balancing.averager_options(values, 12.5) == {"part_size_bytes": size, "bandwidth": 12.5}


@pytest.mark.swarm
def test_the_gradient_averager_gets_the_bandwidth_and_the_part_size() -> None:
    """hivemind 1.1.12 gives ``averager_opts`` to the state averager only; the gradient rounds carry the traffic."""
    import hivemind

    from swarmhub.worker.swarm_optimizer import SwarmOptimizer

    dht = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    model = torch.nn.Linear(64, 10)
    options = load_balancing.averager_options(sum(p.numel() for p in model.parameters()), 9.5)
    opt = None
    try:
        opt = SwarmOptimizer(
            dht=dht,
            run_id="part-size-test",
            params=model.parameters(),
            optimizer=torch.optim.SGD,
            batch_size_per_step=8,
            target_batch_size=64,
            matchmaking_time=0.5,
            averaging_timeout=5.0,
            averager_opts=options,
            verbose=False,
        )
        for averager in (opt.grad_averager, opt.state_averager):
            assert averager.bandwidth == 9.5
            assert averager.allreduce_kwargs["part_size_bytes"] == options["part_size_bytes"]
    finally:
        if opt is not None:
            opt.shutdown()
        dht.shutdown()


@pytest.mark.swarm
def test_averagers_with_very_different_bandwidths_average_exactly() -> None:
    """Three real averagers on loopback (hivemind forks each one after ``install``): one fast, two 100x slower.
    Every peer computes the floored split on its own; if they disagreed, the all-reduce would fail."""
    import hivemind

    load_balancing.install()
    import hivemind.averaging.averager as averager_module

    assert averager_module.load_balance_peers is balanced_parts
    with loopback_dhts(3) as dhts:
        vectors = [torch.full((10_000,), float(i)) for i in range(3)]
        averagers = [
            hivemind.averaging.DecentralizedAverager(
                [vector],
                dht,
                prefix="balance-test",
                target_group_size=3,
                min_group_size=3,
                min_matchmaking_time=2.0,
                request_timeout=1.0,
                bandwidth=bandwidth,
                start=True,
            )
            for vector, dht, bandwidth in zip(vectors, dhts, [100.0, 1.0, 1.0])
        ]
        try:
            controls = [a.step(wait=False, timeout=30) for a in averagers]
            groups = [control.result(timeout=60) for control in controls]
            assert all(group is not None and len(group) == 3 for group in groups)
            for a in averagers:
                with a.get_tensors() as tensors:
                    assert torch.allclose(tensors[0], torch.full((10_000,), 1.0))
        finally:
            for a in averagers:
                a.shutdown()
