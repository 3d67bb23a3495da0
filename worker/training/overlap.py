"""How much communication a peer overlaps with computation: an experiment's ``overlap`` setting as
hivemind.Optimizer's delayed-update options, and the choice a peer makes for its machine under ``auto``."""

from __future__ import annotations

from typing import Any

import torch

from swarmhub.common.protocol import Overlap

# Under ``auto``, a CPU peer averages in the background when one round's all-reduce at its measured bandwidth would
# take at least this long. Measured (docs/benchmarks/swarm-efficiency.md): over loopback (a 1.2 MiB vector, ~10 ms)
# delayed-averaging was 0.966 of none for a worker with a core to spare, and slower for two workers sharing 2 cores;
# on 10 Mbit/s links (the same vector, ~1 s a round) two workers sharing 2 cores trained 1.39 (1.35..1.60)
# times as fast with it.
BACKGROUND_ROUND_SECONDS = 0.25


def round_seconds(parameters: int, bandwidth: float | None) -> float | None:
    """About how long one all-reduce of ``parameters`` fp32 gradients takes at ``bandwidth`` Mbit/s (the slower
    direction: a peer sends and receives about its whole vector); None when the bandwidth is unknown."""
    if bandwidth is None or bandwidth <= 0:
        return None
    return parameters * 32 / (bandwidth * 1e6)


def choose_overlap(
    overlap: Overlap,
    device: torch.device,
    *,
    parameters: int = 0,
    bandwidth: float | None = None,
    auxiliary: bool = False,
) -> Overlap:
    """The overlap this peer trains with. ``auto``: ``delayed-averaging`` on a CUDA device, where the device computes
    and the CPU is free for hivemind's background averaging and offloaded optimizer step (hivemind's ALBERT setup;
    not measured here yet), and on a CPU whose link makes a round of the model's gradients last at least
    ``BACKGROUND_ROUND_SECONDS`` (``bandwidth``: join's measured Mbit/s); ``none`` on a CPU with a fast or unmeasured
    link, where delayed-averaging measured no faster and its step uses gradients one step stale. Any other setting
    is the experiment's, as it is. An auxiliary peer computes nothing to overlap: ``none`` under ``auto``."""
    if overlap != Overlap.auto:
        return overlap
    if auxiliary:
        return Overlap.none
    if device.type == "cuda":
        return Overlap.delayed_averaging
    seconds = round_seconds(parameters, bandwidth)
    return Overlap.delayed_averaging if seconds is not None and seconds >= BACKGROUND_ROUND_SECONDS else Overlap.none


def overlap_options(overlap: Overlap) -> dict[str, Any]:
    """hivemind.Optimizer's delayed-update options for an experiment's ``overlap`` setting."""
    if overlap == Overlap.delayed_averaging:
        return {"offload_optimizer": True, "delay_optimizer_step": True, "delay_grad_averaging": True}
    if overlap == Overlap.delayed_step:
        return {"offload_optimizer": True, "delay_optimizer_step": True}
    return {}
