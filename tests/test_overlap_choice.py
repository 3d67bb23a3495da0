"""overlap "auto": each peer picks its own overlap from the machine it trains on."""

from __future__ import annotations

import pytest
import torch

from swarmhub.common.protocol import Overlap
from swarmhub.worker.training.overlap import choose_overlap, overlap_options, round_seconds

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_a_cuda_peer_averages_in_the_background():
    # the device computes; the CPU is free for hivemind's averaging and the offloaded optimizer step
    assert choose_overlap(Overlap.auto, CUDA) == Overlap.delayed_averaging


def test_a_cpu_peer_averages_in_the_background_only_where_its_link_makes_rounds_long():
    digits = 307_210  # digits' widest MLP: 1.2 MiB of fp32 gradients
    # over a fast link a round is short: background averaging measured no faster (docs/benchmarks/swarm-efficiency.md)
    assert choose_overlap(Overlap.auto, CPU, parameters=digits, bandwidth=1_000.0) == Overlap.none
    # at 10 Mbit/s a round of the same vector takes about a second: measured faster in the background
    assert round_seconds(digits, 10.0) == pytest.approx(0.98, abs=0.01)
    assert choose_overlap(Overlap.auto, CPU, parameters=digits, bandwidth=10.0) == Overlap.delayed_averaging
    # a large model makes rounds long on a good home link too (ALBERT-large: 18M parameters, 100 Mbit/s: ~6 s)
    assert choose_overlap(Overlap.auto, CPU, parameters=18_000_000, bandwidth=100.0) == Overlap.delayed_averaging
    # a link nobody measured (no pre-flight): the measured-safe choice
    assert choose_overlap(Overlap.auto, CPU, parameters=18_000_000, bandwidth=None) == Overlap.none
    assert round_seconds(digits, None) is None
    # an auxiliary peer computes nothing that averaging could overlap
    assert choose_overlap(Overlap.auto, CPU, parameters=digits, bandwidth=10.0, auxiliary=True) == Overlap.none
    assert choose_overlap(Overlap.auto, CUDA, auxiliary=True) == Overlap.none


def test_a_setting_other_than_auto_is_the_experiments():
    for overlap in (Overlap.none, Overlap.delayed_step, Overlap.delayed_averaging):
        assert choose_overlap(overlap, CUDA) == overlap
        assert choose_overlap(overlap, CPU) == overlap
    assert overlap_options(Overlap.delayed_averaging)["delay_grad_averaging"] is True
    assert overlap_options(Overlap.none) == {}
