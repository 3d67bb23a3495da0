"""A labelled image set drawn on the spot, for the ``swav`` task's demo and tests (nothing is downloaded).

Eight kinds of picture (:data:`CLASSES`): five shapes (circle, ring, square, triangle, cross) and three textures
(stripes, checker, dots), each at a random place, size and angle, in two random colours that differ in colour and
in brightness (so the shape shows in grey too), with pixel noise. What tells the kinds apart is the outline or the
pattern, never the colour, the size or the place, so a backbone that has learnt nothing sorts them far worse than
one that has: the gap the ``swav`` task's k-nearest-neighbour accuracy measures. The same ``(count, seed)`` always
gives the same images; labels are balanced. NumPy only: the server draws them for the built-in image source
without torch.
"""

from __future__ import annotations

from functools import cache

import numpy as np

CLASSES = ("circle", "ring", "square", "triangle", "cross", "stripes", "checker", "dots")
IMAGE_SIZE = 32
MIN_CONTRAST = 0.35  # the least mean per-channel distance between the two colours of an image
MIN_LUMA_CONTRAST = 0.25  # and the least difference of their brightness (Rec. 601 luma): the shape shows in grey
LUMA = np.array([0.299, 0.587, 0.114])
NOISE = 0.06  # the pixel noise's standard deviation, on a 0..1 scale


def labels(count: int, seed: int) -> np.ndarray:
    """The labels of ``draw(count, seed)`` (indices into :data:`CLASSES`), without drawing the images."""
    return np.random.default_rng(seed).permutation(np.arange(count) % len(CLASSES)).astype(np.int64)


def _mask(label: int, x: np.ndarray, y: np.ndarray, period: float) -> np.ndarray:
    r = np.hypot(x, y)
    if label == 0:
        return r < 1.0
    if label == 1:
        return (r < 1.0) & (r > 0.55)
    if label == 2:
        return (np.abs(x) < 0.8) & (np.abs(y) < 0.8)
    if label == 3:  # an equilateral triangle in the unit circle
        return (y <= 0.5) & (y >= -1.0 + np.sqrt(3.0) * np.abs(x))
    if label == 4:
        return ((np.abs(x) < 0.3) & (np.abs(y) < 1.0)) | ((np.abs(y) < 0.3) & (np.abs(x) < 1.0))
    patch = r < 1.6  # textures fill a larger round patch
    if label == 5:
        return patch & (np.sin(np.pi * x / period) > 0)
    if label == 6:
        return patch & (np.sin(np.pi * x / period) * np.sin(np.pi * y / period) > 0)
    fx, fy = np.mod(x / period, 1.0) - 0.5, np.mod(y / period, 1.0) - 0.5
    return patch & (fx * fx + fy * fy < 0.09)


@cache
def draw(count: int, seed: int, size: int = IMAGE_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """``count`` images as uint8 of shape (count, 3, size, size), and their labels (int64, shape (count,))."""
    kinds = labels(count, seed)
    rng = np.random.default_rng((seed, count, size))
    ys, xs = (np.mgrid[0:size, 0:size].astype(np.float32) + 0.5) / size
    images = np.empty((count, 3, size, size), np.uint8)
    for i, label in enumerate(kinds):
        cx, cy = rng.uniform(0.3, 0.7, 2)
        radius = rng.uniform(0.2, 0.34)
        angle = rng.uniform(0.0, np.pi)
        c, s = np.cos(angle), np.sin(angle)
        x = ((xs - cx) * c + (ys - cy) * s) / radius
        y = (-(xs - cx) * s + (ys - cy) * c) / radius
        mask = _mask(int(label), x, y, period=rng.uniform(0.3, 0.5))
        background = rng.uniform(0.0, 1.0, 3)
        foreground = rng.uniform(0.0, 1.0, 3)
        while (
            np.abs(foreground - background).mean() < MIN_CONTRAST
            or abs(float((foreground - background) @ LUMA)) < MIN_LUMA_CONTRAST
        ):
            foreground = rng.uniform(0.0, 1.0, 3)
        picture = np.where(mask[None], foreground[:, None, None], background[:, None, None])
        picture = picture + rng.normal(0.0, NOISE, picture.shape)
        images[i] = np.clip(picture * 255.0 + 0.5, 0, 255).astype(np.uint8)
    images.setflags(write=False)
    kinds.setflags(write=False)
    return images, kinds
