"""How much communication a peer overlaps with computation: an experiment's ``overlap`` setting as
hivemind.Optimizer's delayed-update options, and the choice a peer makes for its machine under ``auto``."""

from __future__ import annotations

import os
from typing import Any

import torch

from .protocol import Overlap


def choose_overlap(
    overlap: Overlap,
    device: torch.device,
    *,
    threads: int | None = None,
    cpus: int | None = None,
    busy: float | None = None,
) -> Overlap:
    """The overlap this peer trains with. ``auto``: ``delayed-averaging`` when training leaves room for hivemind's
    background averaging and offloaded optimizer step (a CUDA device computes, the CPU is free; or the machine has
    at least one core beyond the training threads and what other processes keep busy: ``busy``, the one-minute
    load average), ``none`` on a busy CPU, where the background work would only take cores from training
    (measured: docs/benchmarks.md, section 1). Any other setting is the experiment's, as it is."""
    if overlap != Overlap.auto:
        return overlap
    if device.type == "cuda":
        return Overlap.delayed_averaging
    threads = torch.get_num_threads() if threads is None else threads
    cpus = (os.cpu_count() or 1) if cpus is None else cpus
    busy = os.getloadavg()[0] if busy is None else busy
    return Overlap.delayed_averaging if cpus - threads - busy >= 1 else Overlap.none


def overlap_options(overlap: Overlap) -> dict[str, Any]:
    """hivemind.Optimizer's delayed-update options for an experiment's ``overlap`` setting."""
    if overlap == Overlap.delayed_averaging:
        return {"offload_optimizer": True, "delay_optimizer_step": True, "delay_grad_averaging": True}
    if overlap == Overlap.delayed_step:
        return {"offload_optimizer": True, "delay_optimizer_step": True}
    return {}
