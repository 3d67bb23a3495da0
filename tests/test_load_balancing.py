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
