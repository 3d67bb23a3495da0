"""How an averaging group splits the vector to reduce: hivemind's bandwidth-aware split, with no reachable peer
left at zero.

hivemind 1.1.12 gives each peer of a group a part of the vector to reduce, in proportion to a linear program over
the peers' bandwidths (``hivemind.averaging.load_balancing.load_balance_peers``). The program models a peer's time
as upload plus download over one bandwidth, so a peer much slower than the others gets *nothing* to reduce: its
time is already the longest, whatever its share. But hivemind's all-reduce treats a zero share like a client-mode
peer (``AllReduceRunner.should_delay_results``): it sends its whole vector first and only then receives the
average, one direction after the other, so on a full-duplex link its round takes 2 V / b where an even split takes
1.5 V / b (``bench/heterogeneous_network.md`` measured it: measured bandwidths made rounds 0.70x as fast as no
bandwidth at all).

:func:`balanced_parts` keeps hivemind's split and then gives every peer that can reduce (bandwidth not 0) at least
``MIN_SHARE`` of the vector, taken from the largest parts. A slow peer then sends and receives at once and its
round takes about V / b. The vector is then cut where each share ends (:func:`make_container_class`): hivemind
hands out whole parts of up to 512 KiB, which left a 1 % share nothing. Every peer of a group computes the split
and the cut on its own from the same inputs, so every peer must use the same functions: :func:`install` puts them in
place of hivemind's in this process (and in the averager processes it forks), and ``train`` calls it before it
builds the optimizer. Peers of swarmhub versions with a different split or cut cannot average together (swarm
protocol 3, ``protocol.SWARM_PROTOCOL``); the swarm's access tokens already admit only swarmhub workers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Every peer that can reduce gets at least this fraction of the vector (at most an even split).
MIN_SHARE = 0.01


def balanced_parts(vector_size: int, bandwidths: Sequence[float | None], min_size: int = 0) -> tuple[int, ...]:
    """hivemind's split of ``vector_size`` elements over the peers, with a floor for every peer that can reduce.

    ``bandwidths`` as hivemind passes them: 0 for a client-mode peer (reduces nothing), None for a peer that gave
    no bandwidth. Deterministic: the same inputs give the same parts on every peer.
    """
    from hivemind.averaging.load_balancing import load_balance_peers

    parts = list(load_balance_peers(vector_size, bandwidths, min_size))
    reducers = [i for i, bandwidth in enumerate(bandwidths) if bandwidth is None or bandwidth > 0]
    if len(reducers) < 2:
        return tuple(parts)
    floor = min(max(int(vector_size * MIN_SHARE), min_size, 1), vector_size // len(reducers))
    for i in reducers:
        missing = floor - parts[i]
        while missing > 0:
            # take from the largest part (the lowest index among equals), never below the floor
            donor = max(reducers, key=lambda j: (parts[j], -j))
            give = min(missing, parts[donor] - floor)
            if give <= 0:
                break
            parts[donor] -= give
            parts[i] += give
            missing -= give
    return tuple(parts)


def install() -> None:
    """Make hivemind's averagers (created after this call, here and in forked processes) split the vector with
    :func:`balanced_parts` and cut it where each share ends (:func:`make_container_class`)."""
    import hivemind.averaging.allreduce as allreduce
    import hivemind.averaging.averager as averager

    if averager.load_balance_peers is not balanced_parts:
        averager.load_balance_peers = balanced_parts
    if not getattr(allreduce.TensorPartContainer, "__swarmhub__", False):
        container = make_container_class()
        container.__swarmhub__ = True  # type: ignore[attr-defined]
        allreduce.TensorPartContainer = container


def pivots(vector_size: int, peer_fractions: Sequence[float]) -> list[int]:
    """Where each peer's share of the vector ends, as hivemind computes it from the split."""
    import numpy as np

    ends = (np.cumsum(peer_fractions) / np.sum(peer_fractions) * vector_size).astype(np.int64)
    ends[-1] = vector_size
    return [int(end) for end in ends]


def make_container_class() -> type:
    from collections import deque

    from hivemind.averaging.partition import DEFAULT_PART_SIZE_BYTES, TensorPartContainer
    from hivemind.compression import NoCompression

    class SharePartContainer(TensorPartContainer):  # type: ignore[misc, valid-type]
        """hivemind's container, with the vector cut where each peer's share ends.

        hivemind cuts each tensor into parts of ``part_size_bytes`` and hands every part whole to the peer whose
        share holds most of it, so the split is only as fine as the parts: the digits MLP at its widest (1.2 MiB)
        is 5 parts of at most 512 KiB, a share of 1 % gets none of them (that peer then sends its whole vector
        before it receives any of the average), and four equal shares came out as 43 %, 0, 43 % and 15 %
        (bench/heterogeneous_network.md). Here no part crosses the end of a share: each peer reduces exactly its
        share, in parts of at most ``part_size_bytes``, and a group has at most one part more per peer and per
        tensor than hivemind's. Parts stay in the vector's order, which is how hivemind puts the averaged tensors
        back together."""

        def __init__(
            self,
            tensors: Sequence[Any],
            peer_fractions: Sequence[float],
            compression: Any = NoCompression(),  # noqa: B008 - hivemind's own default, never modified
            part_size_bytes: int = DEFAULT_PART_SIZE_BYTES,
            tensor_infos: Any = None,
            **kwargs: Any,
        ):
            super().__init__(tensors, peer_fractions, compression, part_size_bytes, tensor_infos, **kwargs)
            ends = pivots(self.total_size, peer_fractions)
            by_peer: list[deque[Any]] = [deque() for _ in range(self.group_size)]
            parts_by_tensor = []
            offset = peer = 0
            for tensor, info in zip(self.local_tensors, self.tensor_infos, strict=True):
                values_per_part = max(
                    int(part_size_bytes / (tensor.element_size() * compression.estimate_compression_ratio(info))), 1
                )
                flat = tensor.detach().view(-1)
                if flat.numel() == 0:  # one empty part, as hivemind's cut gives it
                    by_peer[peer].append((flat, info.get_part(0, values_per_part)))
                    parts_by_tensor.append(1)
                    continue
                start = count = 0
                while start < flat.numel():
                    while peer < len(ends) - 1 and ends[peer] <= offset + start:
                        peer += 1  # that share ended here (or was empty)
                    end = min(flat.numel(), start + values_per_part, ends[peer] - offset)
                    by_peer[peer].append((flat[start:end], info.get_part(count, values_per_part)))
                    count += 1
                    start = end
                parts_by_tensor.append(count)
                offset += flat.numel()
            self._input_parts_by_peer = by_peer
            self.num_parts_by_tensor = parts_by_tensor
            self.num_parts_by_peer = tuple(len(parts) for parts in by_peer)

    return SharePartContainer
