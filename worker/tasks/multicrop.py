"""SwAV's multi-crop augmentation (Caron et al., 2020) as batched tensor operations on the worker's device: random
resized crops, flips, colour jitter with hue, greyscale, and the normalisation every crop and evaluated image gets.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

GLOBAL_SCALE, LOCAL_SCALE = (0.35, 1.0), (0.1, 0.35)  # the share of the image a crop covers
COLOUR_JITTER, GREY = 0.8, 0.2  # how often a crop's colours are jittered, and made grey
JITTER = (0.2, 1.8)  # the range of a jittered crop's brightness, contrast and saturation factors (SwAV's 0.8)
HUE = 0.4 * math.pi  # the most a jittered crop's hue turns, radians (a fifth of the circle, as SwAV's 0.2)
GREY_JITTER = (0.6, 1.4)  # brightness and contrast factors of a crop when the task's colour is grey
LUMA = (0.299, 0.587, 0.114)


def random_crops(
    images: torch.Tensor,
    count: int,
    size: int,
    scale: tuple[float, float],
    generator: torch.Generator,
    grey: bool = False,
) -> list[torch.Tensor]:
    """``count`` augmented crops of every image (float, 0..1, shape (N, 3, H, W)): a random area share within
    ``scale`` and aspect ratio within 3/4..4/3, resized to ``size`` pixels, flipped half the time, colour-jittered
    (hue turned by up to ``HUE``, brightness, contrast and saturation scaled within ``JITTER``; ``COLOUR_JITTER``
    of the crops) and made grey (``GREY`` of them), then normalised. With ``grey`` every crop is grey, its
    brightness and contrast scaled within ``GREY_JITTER`` and its hue left alone."""
    import torch
    import torch.nn.functional as F

    n, device = images.shape[0], images.device

    def uniform(low: float, high: float) -> torch.Tensor:
        return (torch.rand(n, generator=generator) * (high - low) + low).to(device)

    crops = []
    for _ in range(count):
        area = uniform(*scale)
        ratio = torch.exp(uniform(math.log(3 / 4), math.log(4 / 3)))
        width, height = (area * ratio).sqrt().clamp(max=1.0), (area / ratio).sqrt().clamp(max=1.0)
        flip = torch.where(uniform(0.0, 1.0) < 0.5, -1.0, 1.0)
        theta = torch.zeros(n, 2, 3, device=device)
        theta[:, 0, 0], theta[:, 1, 1] = width * flip, height
        theta[:, 0, 2], theta[:, 1, 2] = uniform(-1, 1) * (1 - width), uniform(-1, 1) * (1 - height)
        grid = F.affine_grid(theta, [n, 3, size, size], align_corners=False)
        crop = F.grid_sample(images, grid, mode="bilinear", padding_mode="reflection", align_corners=False)
        if grey:
            crop = luminance(crop) * uniform(*GREY_JITTER).view(n, 1, 1, 1)
            mean = crop.mean(dim=(1, 2, 3), keepdim=True)
            crop = ((crop - mean) * uniform(*GREY_JITTER).view(n, 1, 1, 1) + mean).clamp(0.0, 1.0)
            crops.append(normalise(crop.expand(n, 3, size, size)))
            continue
        jitter = (uniform(0.0, 1.0) < COLOUR_JITTER).view(n, 1, 1, 1)
        jittered = hue_rotate(crop, uniform(-HUE, HUE)) * uniform(*JITTER).view(n, 1, 1, 1)
        mean = jittered.mean(dim=(1, 2, 3), keepdim=True)
        jittered = (jittered - mean) * uniform(*JITTER).view(n, 1, 1, 1) + mean
        grey_ = jittered.mean(dim=1, keepdim=True)
        jittered = grey_ + (jittered - grey_) * uniform(*JITTER).view(n, 1, 1, 1)
        crop = torch.where(jitter, jittered, crop).clamp(0.0, 1.0)
        crop = torch.where((uniform(0.0, 1.0) < GREY).view(n, 1, 1, 1), luminance(crop), crop)
        crops.append(normalise(crop.expand(n, 3, size, size)))
    return crops


def hue_rotate(images: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Each image's colours turned by its angle (radians) about the grey axis of the RGB cube: its hue changes,
    its brightness does not."""
    import torch

    axis = torch.full((3,), 3**-0.5, device=images.device)
    cross = torch.tensor([[0.0, -1.0, 1.0], [1.0, 0.0, -1.0], [-1.0, 1.0, 0.0]], device=images.device) * 3**-0.5
    cos, sin = angles.cos().view(-1, 1, 1), angles.sin().view(-1, 1, 1)
    rotation = cos * torch.eye(3, device=images.device) + sin * cross + (1 - cos) * torch.outer(axis, axis)
    return torch.einsum("nij,njhw->nihw", rotation, images)


def luminance(images: torch.Tensor) -> torch.Tensor:
    """Each image's grey (Rec. 601 luma), one channel: what a shape drawn in two colours of different brightness
    keeps when its colours are dropped."""
    weights = images.new_tensor(LUMA).view(1, 3, 1, 1)
    return (images * weights).sum(dim=1, keepdim=True)


def normalise(images: torch.Tensor) -> torch.Tensor:
    return (images - 0.5) / 0.25
