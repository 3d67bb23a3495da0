"""overlap "auto": each peer picks its own overlap from the machine it trains on."""

from __future__ import annotations

import torch

from swarmhub.worker.overlap import choose_overlap, overlap_options
from swarmhub.worker.protocol import Overlap

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_a_cuda_peer_averages_in_the_background():
    # the device computes; the CPU is free for hivemind's averaging and the offloaded optimizer step
    assert choose_overlap(Overlap.auto, CUDA) == Overlap.delayed_averaging


def test_a_cpu_peer_averages_before_it_steps():
    # measured on a CPU: no faster with a core to spare, slower without one (docs/benchmarks.md, section 1)
    assert choose_overlap(Overlap.auto, CPU) == Overlap.none


def test_a_setting_other_than_auto_is_the_experiments():
    for overlap in (Overlap.none, Overlap.delayed_step, Overlap.delayed_averaging):
        assert choose_overlap(overlap, CUDA) == overlap
        assert choose_overlap(overlap, CPU) == overlap
    assert overlap_options(Overlap.delayed_averaging)["delay_grad_averaging"] is True
    assert overlap_options(Overlap.none) == {}
