"""How much communication a peer overlaps with computation: an experiment's ``overlap`` setting as
hivemind.Optimizer's delayed-update options, and the choice a peer makes for its machine under ``auto``."""

from __future__ import annotations

from typing import Any

import torch

from .protocol import Overlap


def choose_overlap(overlap: Overlap, device: torch.device) -> Overlap:
    """The overlap this peer trains with. ``auto``: ``delayed-averaging`` on a CUDA device, where the device computes
    and the CPU is free for hivemind's background averaging and offloaded optimizer step (hivemind's ALBERT setup;
    not measured here yet), ``none`` on a CPU. On a CPU, delayed-averaging measured no faster with a core to spare
    (a worker with one training thread on 2 cores: 0.966 of none, docs/benchmarks.md, section 1) and slower without
    one (two workers sharing 2 cores), while its step uses gradients one step stale. Any other setting is the
    experiment's, as it is."""
    if overlap != Overlap.auto:
        return overlap
    return Overlap.delayed_averaging if device.type == "cuda" else Overlap.none


def overlap_options(overlap: Overlap) -> dict[str, Any]:
    """hivemind.Optimizer's delayed-update options for an experiment's ``overlap`` setting."""
    if overlap == Overlap.delayed_averaging:
        return {"offload_optimizer": True, "delay_optimizer_step": True, "delay_grad_averaging": True}
    if overlap == Overlap.delayed_step:
        return {"offload_optimizer": True, "delay_optimizer_step": True}
    return {}
