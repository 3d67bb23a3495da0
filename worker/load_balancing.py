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
round takes about V / b. Every peer of a group computes the split on its own from the same inputs, so every peer
must use the same function: :func:`install` puts it in place of hivemind's in this process (and in the averager
processes it forks), and ``train`` calls it before it builds the optimizer. Peers of swarmhub versions with a
different split cannot average together; the swarm's access tokens already admit only swarmhub workers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Every peer that can reduce gets at least this fraction of the vector (at most an even split).
MIN_SHARE = 0.01
# hivemind cuts each tensor into parts of at most ``part_size_bytes`` (512 KiB by default) and gives every part
# whole to the peer whose share holds most of it, so the split a group computes is only as fine as its parts. A
# 1.2 MiB vector is 5 parts at the default size: a share of 1 % gets nothing, and of four equal shares one got
# nothing and another 15 % (bench/heterogeneous_network.md). :func:`part_size_bytes` cuts a vector into at least
# PARTS_PER_VECTOR parts (the 1 % floor is 2.5 of them), at most hivemind's 512 KiB and at least MIN_PART_BYTES
# each: a message per part costs a little, so the parts stay as large as the split allows.
PARTS_PER_VECTOR = 256
MAX_PART_BYTES = 2**19
MIN_PART_BYTES = 4096


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
    """Make hivemind's averagers (created after this call, here and in forked processes) use :func:`balanced_parts`."""
    import hivemind.averaging.averager as averager

    if averager.load_balance_peers is not balanced_parts:
        averager.load_balance_peers = balanced_parts


def part_size_bytes(values: int, bytes_per_value: int = 4) -> int:
    """The part size of a swarm's averaging rounds for a vector of ``values`` (fp32: 4 bytes each). Every peer of a
    group must cut the vector the same way (a reducer expects the parts' shapes its own cut gives): it is a function
    of the model, which every peer of a swarm builds from the same config."""
    return max(MIN_PART_BYTES, min(MAX_PART_BYTES, values * bytes_per_value // PARTS_PER_VECTOR))


def averager_options(values: int, bandwidth: float | None) -> dict[str, Any]:
    """Options for both of a peer's averagers (gradients and state): the swarm's part size, and the measured
    bandwidth (Mbit/s) that the split gives faster peers more to reduce by; no bandwidth, an even split."""
    options: dict[str, Any] = {"part_size_bytes": part_size_bytes(values)}
    if bandwidth is not None:
        options["bandwidth"] = bandwidth
    return options
