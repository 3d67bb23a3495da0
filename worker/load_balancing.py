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
    """Make hivemind's averagers (created after this call, here and in forked processes) use :func:`balanced_parts`."""
    import hivemind.averaging.averager as averager

    if averager.load_balance_peers is not balanced_parts:
        averager.load_balance_peers = balanced_parts
