"""How a reducer combines the parts of one slice (``robust.GuardedPartReducer`` calls :func:`combine`): non-finite
parts tested cheaply, claimed weights capped, CenteredClip for gradients under ``centered-clip``, and the bounded
mean of a state round. Pure tensor functions: no hivemind, no process state."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import torch

AGGREGATIONS = ("mean", "centered-clip")
# An honest peer's weight is the samples it accumulated: peers of one round differ by their speed, and a claim
# far above the round's median is counted at this multiple of it. Honest fast peers lose a little weight (the
# average is still one of unbiased gradients, with a little more variance); a forger's huge claim loses all of it.
WEIGHT_MEDIAN_FACTOR = 2.0
# A sender that claims over this many target batches (or steps' batches, where one step's is larger) in one round is
# flagged (its weight is capped either way): an honest peer's claim is what it accumulated in one epoch, the target
# batch and one step's samples at most.
WEIGHT_FLAG_FACTOR = 4.0
CLIP_ITERATIONS = 10
# Under centered-clip a part farther than this multiple of the clipping radius from the medoid is left out of the
# slice's result altogether. Clipped, it would still pull the center by a whole radius at every iteration, and the
# radius is an honest part's noise, which at a volunteer's batch is larger than the gradient itself (the result's
# cosine with the true gradient halved in bench/byzantine.py's setting). An honest part is this far out only
# with about a hundredth of the others' samples, and its weight is then about a hundredth of theirs.
CLIP_OUTLIER_FACTOR = 10.0
# A downloaded state whose parameters' norm is over this multiple of the peer's own is refused (unless it comes
# from the server's own peer), and a state round's part this far from the median part's norm is left out
# (:func:`state_parts`): training moves a model's norm by a few times at most, an attack by orders.
STATE_NORM_JUMP = 10.0


def finite(tensor: torch.Tensor) -> bool:
    """Whether every value is finite, read from the sum: one pass, several times cheaper than ``torch.isfinite``
    (a NaN or an infinity makes the sum NaN or infinite; values so large that the sum overflows count as not
    finite too, and no gradient is that large)."""
    return math.isfinite(float(tensor.sum(dtype=torch.float64))) if tensor.numel() else True


def capped_weights(weights: Sequence[float], max_weight: float = math.inf) -> list[float]:
    """Each claim capped at ``max_weight`` and, with three claims or more, at WEIGHT_MEDIAN_FACTOR x their
    median; a claim that is not a finite positive number counts as zero."""
    clean = [w if math.isfinite(w) and w > 0 else 0.0 for w in weights]
    clean = [min(w, max_weight) for w in clean]
    positive = [w for w in clean if w > 0]
    if len(positive) >= 3:
        cap = WEIGHT_MEDIAN_FACTOR * statistics.median(positive)
        clean = [min(w, cap) for w in clean]
    return clean


def centered_clip(parts: torch.Tensor, weights: torch.Tensor, iterations: int = CLIP_ITERATIONS) -> torch.Tensor:
    """CenteredClip of ``parts`` (one row per sender) with ``weights``: start at the medoid (the row closest to all
    others: with most rows honest, an honest row), then repeatedly move the center by the weighted mean of each
    row's offset clipped to radius ``tau``, the median of the rows' distances from the start. With most rows honest
    the radius is an honest row's spread, so a row of any size moves the center at most its weight's share of it.
    A row farther than ``CLIP_OUTLIER_FACTOR`` radii from the start is left out first: it has no say at all.
    (The medoid needs the rows' pairwise distances, one matrix product; a coordinate-wise median sorts every
    column and cost several times more on hivemind's parts.)

    Two rows have no majority and no medoid (either is as central as the other): each row is scaled down to the
    smaller row's norm before the weighted mean, so a row of any size moves the result by at most its weight's
    share of an honest row's norm (a sign-flipped honest-sized row still cancels its share)."""
    if parts.shape[0] == 1:
        return parts[0].clone()
    if parts.shape[0] == 2:
        norms = parts.norm(dim=1)
        scale = (norms.min() / norms.clamp_min(1e-12)).clamp(max=1.0)
        return (parts * (scale * weights / weights.sum()).unsqueeze(1)).sum(dim=0)
    distances = torch.cdist(parts.unsqueeze(0), parts.unsqueeze(0)).squeeze(0)
    center = parts[int(distances.sum(dim=1).argmin())].clone()
    tau = (parts - center).norm(dim=1).median()
    if not torch.isfinite(tau) or tau <= 0:
        return center
    near = (parts - center).norm(dim=1) <= CLIP_OUTLIER_FACTOR * tau
    parts, weights = parts[near], weights[near]
    total = weights.sum()
    for _ in range(iterations):
        offsets = parts - center
        norms = offsets.norm(dim=1).clamp_min(1e-12)
        scale = (tau / norms).clamp(max=1.0)
        step = (offsets * (scale * weights / total).unsqueeze(1)).sum(dim=0)
        center = center + step
        if step.norm() <= 1e-6 * tau:
            break
    return center


def state_parts(parts: Sequence[torch.Tensor], weights: Sequence[float]) -> list[float]:
    """The weights of a state round's parts (parameters, not gradients), each set to zero when the part's norm is
    over STATE_NORM_JUMP times the reference norm or under its 1/STATE_NORM_JUMP: the median norm with three parts
    or more, the smaller one with two. Honest peers' parameters differ by a few steps at most, so their norms are
    within a percent of each other; a part scaled by an attacker is left out.

    A state round is not a gradient round: peers that are in step hold *identical* parameters, so a robust
    estimate around the medoid (CenteredClip) takes the side of whichever peers happen to be identical, often those
    that missed the last step, and undoes the others' step (docs/benchmarks.md section 5). The weighted mean of the
    parts within bounds keeps hivemind's behaviour for honest peers."""
    norms = [float(p.float().norm()) for p in parts]
    live = [n for n, w in zip(norms, weights, strict=True) if w > 0]
    if not live:
        return list(weights)
    reference = statistics.median_low(live) if len(live) >= 3 else min(live)
    return [
        w if reference / STATE_NORM_JUMP <= n <= reference * STATE_NORM_JUMP or reference == 0 == n else 0.0
        for n, w in zip(norms, weights, strict=True)
    ]


def combine(parts: Sequence[torch.Tensor], weights: Sequence[float], aggregation: str) -> torch.Tensor:
    """One slice's result from the senders' ``parts`` and (already capped) ``weights``. ``aggregation`` is the
    experiment's (``mean`` or ``centered-clip``) for a gradient round, ``state`` for a state round (parameters:
    the weighted mean of the parts whose norm is in bounds, :func:`state_parts`)."""
    if aggregation == "state":
        weights = state_parts(parts, weights)
        aggregation = "mean"
    kept = [(p, w) for p, w in zip(parts, weights, strict=True) if w > 0]
    if not kept:  # nothing trustworthy in this slice: it averages to zero (no update from it)
        return torch.zeros_like(parts[0]) if parts else torch.zeros(0)
    if aggregation == "centered-clip":
        stacked = torch.stack([p.reshape(-1).float() for p, _ in kept])
        result = centered_clip(stacked, torch.tensor([w for _, w in kept], dtype=stacked.dtype))
        return result.reshape(parts[0].shape).to(parts[0].dtype)
    total = sum(w for _, w in kept)
    result = torch.zeros_like(parts[0], dtype=torch.float32)
    for part, w in kept:  # in place, one pass per part, as hivemind's reducer sums
        result.add_(part, alpha=w / total)
    return result.to(parts[0].dtype)
