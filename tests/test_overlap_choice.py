"""overlap "auto": each peer picks its own overlap from the machine it trains on."""

from __future__ import annotations

import torch

from swarmhub.worker.overlap import choose_overlap, overlap_options
from swarmhub.worker.protocol import Overlap

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_a_cuda_peer_averages_in_the_background():
    # the device computes; the CPU is free for hivemind's averaging and the offloaded optimizer step
    assert choose_overlap(Overlap.auto, CUDA, threads=8, cpus=8, busy=8.0) == Overlap.delayed_averaging


def test_a_cpu_peer_averages_in_the_background_only_with_a_spare_core():
    assert choose_overlap(Overlap.auto, CPU, threads=4, cpus=8, busy=0.2) == Overlap.delayed_averaging
    # every core trains, or other processes keep the rest busy: background work would take cores from training
    assert choose_overlap(Overlap.auto, CPU, threads=8, cpus=8, busy=0.0) == Overlap.none
    assert choose_overlap(Overlap.auto, CPU, threads=1, cpus=2, busy=0.5) == Overlap.none
    assert choose_overlap(Overlap.auto, CPU, threads=1, cpus=4, busy=2.5) == Overlap.none


def test_a_setting_other_than_auto_is_the_experiments():
    for overlap in (Overlap.none, Overlap.delayed_step, Overlap.delayed_averaging):
        assert choose_overlap(overlap, CUDA, threads=1, cpus=64, busy=0.0) == overlap
        assert choose_overlap(overlap, CPU, threads=64, cpus=64, busy=64.0) == overlap
    assert overlap_options(Overlap.delayed_averaging)["delay_grad_averaging"] is True
    assert overlap_options(Overlap.none) == {}
