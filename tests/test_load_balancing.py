"""The split of the vector to reduce: hivemind's bandwidth-aware split, with no reachable peer left at zero."""

from __future__ import annotations

import pytest
import torch

from swarmhub.worker.swarm import load_balancing
from swarmhub.worker.swarm.load_balancing import MIN_SHARE, balanced_parts

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


def parts_by_peer(bandwidths: list[float | None], container: type | None = None) -> list[list[int]]:
    """The sizes of the parts each peer of a group reduces, as every peer of a round computes them (``container``:
    hivemind's own when None)."""
    from hivemind.averaging.partition import TensorPartContainer

    tensors = [torch.zeros(shape) for shape in DIGITS_WIDEST]
    made = (container or TensorPartContainer)(tensors, balanced_parts(VECTOR, bandwidths))
    return [[part.numel() for part, _ in parts] for parts in made._input_parts_by_peer]


@pytest.mark.parametrize("bandwidths", [MEASURED, [None, None, None, None], [100.0, 1.0], [7.0], [0.0, 5.0, 5.0]])
def test_each_peer_reduces_exactly_its_share(bandwidths: list[float | None]) -> None:
    from hivemind.averaging.partition import DEFAULT_PART_SIZE_BYTES

    shares = balanced_parts(VECTOR, bandwidths)
    cut = parts_by_peer(bandwidths, load_balancing.make_container_class())
    assert [sum(sizes) for sizes in cut] == list(shares)
    assert all(size <= DEFAULT_PART_SIZE_BYTES // 4 for sizes in cut for size in sizes)
    # at most one part more per peer and per tensor than hivemind's cut of the same vector
    assert sum(map(len, cut)) <= sum(map(len, parts_by_peer(bandwidths))) + len(bandwidths) + len(DIGITS_WIDEST)


def test_hivemind_s_whole_parts_leave_reachable_peers_without_a_share() -> None:
    """What the cut fixes: 5 parts of at most 512 KiB, each handed whole to one peer."""
    coarse = [sum(sizes) for sizes in parts_by_peer(MEASURED)]
    assert coarse[1] == coarse[2] == 0  # the slow peers' 1 % shares get nothing
    even = [sum(sizes) for sizes in parts_by_peer([None, None, None, None])]
    assert 0 in even and max(even) > VECTOR * 0.4  # four "equal" shares


def test_the_cut_puts_the_averaged_tensors_back_together() -> None:
    """Through hivemind's own reassembly: every part comes back as its sender's own (return_deltas=False), and
    the tensors that come out are the tensors that went in, a tensor split between peers included."""
    import asyncio

    tensors = [torch.randn(shape) for shape in DIGITS_WIDEST + [(0,), (3,)]]
    size = sum(t.numel() for t in tensors)
    container = load_balancing.make_container_class()(tensors, balanced_parts(size, MEASURED), return_deltas=False)
    for peer, parts in enumerate(container._input_parts_by_peer):
        for index, (part, _) in enumerate(parts):
            container.register_processed_part(peer, index, part.clone())

    async def collect() -> list[torch.Tensor]:
        return [tensor async for tensor in container.iterate_output_tensors()]

    out = asyncio.run(collect())
    assert len(out) == len(tensors)
    assert all(torch.equal(a, b) for a, b in zip(out, tensors, strict=True))


@pytest.mark.swarm
def test_the_gradient_averager_gets_the_measured_bandwidth() -> None:
    """hivemind 1.1.12 gives ``averager_opts`` to the state averager only; the gradient rounds carry the traffic."""
    import hivemind

    from swarmhub.worker.training.optimizer import SwarmOptimizer

    dht = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    model = torch.nn.Linear(64, 10)
    opt = None
    try:
        opt = SwarmOptimizer(
            dht=dht,
            run_id="bandwidth-test",
            params=model.parameters(),
            optimizer=torch.optim.SGD,
            batch_size_per_step=8,
            target_batch_size=64,
            matchmaking_time=0.5,
            averaging_timeout=5.0,
            averager_opts={"bandwidth": 9.5},
            verbose=False,
        )
        assert opt.grad_averager.bandwidth == opt.state_averager.bandwidth == 9.5
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
