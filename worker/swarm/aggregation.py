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
# A sender's standing under centered-clip (:class:`Standing`, the exponential mean of its parts' agreement with the
# others' center, STANDING_DECAY per part). While the median standing is at least STANDING_AGREEMENT (the parts
# share a direction clearly), a sender seen in STANDING_EARLY_PARTS parts whose standing is under zero has no say,
# and one seen in STANDING_MIN_PARTS parts whose standing is under STANDING_DISSENT times the median. Below it (parts
# mostly noise, where an honest standing drifts far by chance: in a simulated swarm of peers of 4 samples a round, a
# quarter of honest parts were screened out by the relative bound), only one seen in STANDING_MIN_PARTS parts whose
# standing is under zero.
STANDING_EARLY_PARTS = 4
STANDING_MIN_PARTS = 8
STANDING_DISSENT = 0.5
STANDING_DECAY = 0.05
STANDING_AGREEMENT = 0.3
# Within one part, before any standing is made: a sender whose part's agreement is at or under -STANDING_CLEAR_PART
# while the part's median agreement is at least STANDING_CLEAR_PART has no say in that part. When the others share
# a direction that clearly, an honest part (the same gradient with its own batch's noise) does not point against
# it; a sign-flipped part does, from its first round. Noise parts sit near zero and are left to the standing.
STANDING_CLEAR_PART = 0.5
# A sender left out of a part is flagged (evidence shown to the organizer) when its standing is under the bound it
# was held to (zero, or STANDING_DISSENT times the median) by at least this many standard errors of its own
# agreements (:meth:`Standing.evidence`): a mean under the bound on a few parts is an honest peer's chance where the
# parts are mostly noise (an honest volunteer was flagged so on a busy machine), and a sign-flipper's or a noise
# sender's agreements sit below it part after part.
STANDING_FLAG_T = 3.0
# The spread of agreements assumed before a sender's own is measured, weighed as this many parts: with a few parts
# a sample spread can be near zero by chance. In a simulation of 1,000 honest senders (agreements 0.1 +- 0.4 a
# part) over 60 parts, 1 was flagged by chance with it (10 with a prior of 0.3, about half of those whose standing
# dipped under zero without it), and a sign-flipper (-0.3 +- 0.3) was flagged after 12 parts (median; 21 at most
# in 9 of 10).
STANDING_PRIOR_SPREAD = 0.5
STANDING_PRIOR_PARTS = 4
STANDING_MAX_SENDERS = 4096  # a reducer remembers this many senders at most (the ones seen longest ago go first)
# A downloaded state whose parameters' norm is over this multiple of the peer's own is refused (unless it comes
# from the server's own peer), and a state round's part this far from the median part's norm is left out
# (:func:`state_parts`): training moves a model's norm by a few times at most, an attack by orders.
STATE_NORM_JUMP = 10.0
# A state round under ``centered-clip`` (:func:`combine`): with three parts or more in bounds, each coordinate's
# median. An attacker's parameters of an honest norm, which the norm bound cannot tell apart, otherwise count with
# their weight in every peer's parameters at every epoch: in tests/test_byzantine_swarm.py's swarm a peer whose own
# optimizer was stepping on its gradients x-1000 held the three honest peers' loss near 2.07 from 2.3 over 30
# epochs. Honest peers in step hold identical parameters, and two a step apart from two others get the midpoint,
# as from the mean (a medoid would take one pair's side whole: :func:`state_parts`).
ROBUST_STATE = "state-median"


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
    return clip_with_radius(parts, weights, iterations)[0]


def clip_with_radius(
    parts: torch.Tensor, weights: torch.Tensor, iterations: int = CLIP_ITERATIONS
) -> tuple[torch.Tensor, float]:
    """:func:`centered_clip`'s center and its clipping radius (``inf`` where there is none: one or two rows)."""
    if parts.shape[0] == 1:
        return parts[0].clone(), math.inf
    if parts.shape[0] == 2:
        norms = parts.norm(dim=1)
        scale = (norms.min() / norms.clamp_min(1e-12)).clamp(max=1.0)
        return (parts * (scale * weights / weights.sum()).unsqueeze(1)).sum(dim=0), math.inf
    distances = torch.cdist(parts.unsqueeze(0), parts.unsqueeze(0)).squeeze(0)
    center = parts[int(distances.sum(dim=1).argmin())].clone()
    tau = (parts - center).norm(dim=1).median()
    if not torch.isfinite(tau) or tau <= 0:
        return center, 0.0
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
    return center, float(tau)


def agreement(parts: torch.Tensor, weights: torch.Tensor, center: torch.Tensor, tau: float) -> list[float]:
    """Each row's cosine with ``center`` less the row's own pull on it (its offset from the center clipped to
    ``tau``, at its weight's share): how far a sender's part points the way the others' robust center does. An
    honest part's is positive whenever the round's parts share a gradient, however noisy; a sign-flipped part's is
    negative and a noise part's about zero."""
    offsets = parts - center
    norms = offsets.norm(dim=1, keepdim=True).clamp_min(1e-12)
    clipped = offsets * (tau / norms).clamp(max=1.0) if math.isfinite(tau) else offsets
    share = (weights / weights.sum().clamp_min(1e-12)).unsqueeze(1)
    others = center.unsqueeze(0) - share * clipped
    cosines = torch.nn.functional.cosine_similarity(parts, others, dim=1)
    return [float(c) if math.isfinite(float(c)) else 0.0 for c in cosines]


class Standing:
    """Each sender's standing in one reducer's rounds under ``centered-clip``: the running mean of its parts'
    :func:`agreement` (an exponential mean, ``STANDING_DECAY`` per part). In one round a sign-flipped or noise part
    of an honest norm sits inside the honest parts' spread, where clipping cannot tell it apart; over rounds its
    agreement stays near zero or below while every honest sender's stays positive. A sender whose standing falls
    under the bound of :meth:`screen` has no say in the part."""

    def __init__(self) -> None:
        self.score: dict[str, float] = {}
        self.square: dict[str, float] = {}  # the same exponential mean of the agreements' squares
        self.seen: dict[str, int] = {}
        self.left_out: list[str] = []  # the senders the latest :func:`combine` screened out
        self.held_to: dict[str, float] = {}  # the standing each of them fell short of (0.0 for one part's evidence)

    def observe(self, senders: Sequence[str], cosines: Sequence[float], weights: Sequence[float]) -> None:
        """Each sender's agreement in one part, scaled by sqrt(median weight / its weight) (between 1/2 and 4):
        where parts are mostly noise an honest part's agreement grows with the square root of its samples, and a
        slow honest peer is not to stand below a fast one for sending fewer."""
        typical = statistics.median(weights)
        for sender, cosine, weight in zip(senders, cosines, weights, strict=True):
            cosine *= min(max(math.sqrt(typical / weight), 0.5), 4.0) if weight > 0 else 1.0
            seen = self.seen.get(sender, 0)
            decay = max(STANDING_DECAY, 1.0 / (seen + 1))  # a plain mean until there are enough parts
            self.score[sender] = self.score.get(sender, 0.0) * (1 - decay) + cosine * decay
            self.square[sender] = self.square.get(sender, 0.0) * (1 - decay) + cosine * cosine * decay
            self.seen.pop(sender, None)
            self.seen[sender] = seen + 1  # most recently seen last
            if len(self.seen) > STANDING_MAX_SENDERS:  # forget the sender seen longest ago
                oldest = next(iter(self.seen))
                del self.seen[oldest], self.score[oldest], self.square[oldest]

    def evidence(self, sender: str, bound: float = 0.0) -> float:
        """How many standard errors the sender's standing is above ``bound`` (negative: below): its exponential mean
        over the spread of the agreements it is made of, with as many parts as that mean weighs (its part count, at
        most (2 - decay) / decay). The spread is its sample spread pooled with ``STANDING_PRIOR_SPREAD`` weighed as
        ``STANDING_PRIOR_PARTS`` parts. 0.0 for a sender not seen."""
        seen = self.seen.get(sender, 0)
        if seen == 0:
            return 0.0
        score = self.score[sender]
        parts = min(float(seen), (2 - STANDING_DECAY) / STANDING_DECAY)
        variance = max(self.square[sender] - score * score, 0.0) * seen / max(seen - 1, 1)
        prior = STANDING_PRIOR_PARTS * STANDING_PRIOR_SPREAD**2
        spread = math.sqrt((parts * variance + prior) / (parts + STANDING_PRIOR_PARTS))
        return (score - bound) / (spread / math.sqrt(parts))

    def screen(self, senders: Sequence[str], weights: Sequence[float], cosines: Sequence[float]) -> list[float]:
        """``weights`` with a zero for each sender that stands apart from the median standing of this part's senders
        seen in ``STANDING_EARLY_PARTS`` parts or more, while that median is positive:

        - seen in ``STANDING_MIN_PARTS`` parts: a standing under ``STANDING_DISSENT`` times the median when the median
          is at least ``STANDING_AGREEMENT`` (a clear shared direction), under zero otherwise;
        - seen in ``STANDING_EARLY_PARTS`` parts, with the median at least ``STANDING_AGREEMENT``: under zero (pointing
          against a clear shared direction after a few parts is no honest peer's chance);

        and, from this part's ``cosines`` (:func:`agreement`), for each sender whose part points against a direction
        the part's senders clearly share (``STANDING_CLEAR_PART``), however few parts it was seen in.

        Unchanged unless the senders left keep more than half of the weight."""
        seen = [self.seen.get(s, 0) if w > 0 else 0 for s, w in zip(senders, weights, strict=True)]
        live = [c for c, w in zip(cosines, weights, strict=True) if w > 0]
        clear_now = len(live) >= 3 and statistics.median(live) >= STANDING_CLEAR_PART
        against = [clear_now and w > 0 and c <= -STANDING_CLEAR_PART for c, w in zip(cosines, weights, strict=True)]
        early = [s for s, n in zip(senders, seen, strict=True) if n >= STANDING_EARLY_PARTS]
        typical = statistics.median(self.score[s] for s in early) if len(early) >= 3 else 0.0
        clear = typical >= STANDING_AGREEMENT

        def bound(n: int) -> float:
            if typical <= 0:  # too few senders with a standing, or no direction they agree on
                return -math.inf
            if n >= STANDING_MIN_PARTS:
                return STANDING_DISSENT * typical if clear else 0.0
            return 0.0 if clear and n >= STANDING_EARLY_PARTS else -math.inf

        out = [
            0.0 if now or self.score.get(s, 0.0) < bound(n) else w
            for s, w, n, now in zip(senders, weights, seen, against, strict=True)
        ]
        if sum(out) * 2 <= sum(weights):
            self.held_to = {}
            return list(weights)
        held = zip(senders, weights, seen, out, strict=True)
        self.held_to = {s: max(bound(n), 0.0) for s, w, n, kept in held if w > 0 and not kept}
        return out


def state_parts(parts: Sequence[torch.Tensor], weights: Sequence[float]) -> list[float]:
    """The weights of a state round's parts (parameters, not gradients), each set to zero when the part's norm is
    over STATE_NORM_JUMP times the reference norm or under its 1/STATE_NORM_JUMP: the median norm with three parts
    or more, the smaller one with two. Honest peers' parameters differ by a few steps at most, so their norms are
    within a percent of each other; a part scaled by an attacker is left out.

    A state round is not a gradient round: peers that are in step hold *identical* parameters, so a robust
    estimate around the medoid (CenteredClip) takes the side of whichever peers happen to be identical, often those
    that missed the last step, and undoes the others' step (docs/benchmarks/byzantine.md). Under ``mean`` the
    round is the weighted mean of the parts within bounds, hivemind's behaviour; under ``centered-clip`` their
    coordinate median (``ROBUST_STATE``), which gives peers a step apart the same midpoint."""
    norms = [float(p.float().norm()) for p in parts]
    live = [n for n, w in zip(norms, weights, strict=True) if w > 0]
    if not live:
        return list(weights)
    reference = statistics.median_low(live) if len(live) >= 3 else min(live)
    return [
        w if reference / STATE_NORM_JUMP <= n <= reference * STATE_NORM_JUMP or reference == 0 == n else 0.0
        for n, w in zip(norms, weights, strict=True)
    ]


def coordinate_median(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """Each coordinate's median over ``parts`` (the mean of the two middle values for an even count)."""
    ordered = torch.stack([p.reshape(-1).float() for p in parts]).sort(dim=0).values
    n = len(parts)
    middle = (ordered[(n - 1) // 2] + ordered[n // 2]) / 2
    return middle.reshape(parts[0].shape).to(parts[0].dtype)


def combine(
    parts: Sequence[torch.Tensor],
    weights: Sequence[float],
    aggregation: str,
    senders: Sequence[str] | None = None,
    standing: Standing | None = None,
) -> torch.Tensor:
    """One slice's result from the senders' ``parts`` and (already capped) ``weights``. ``aggregation`` is the
    experiment's (``mean`` or ``centered-clip``) for a gradient round, ``state`` for a state round under ``mean``
    (parameters: the weighted mean of the parts whose norm is in bounds, :func:`state_parts`) and ``ROBUST_STATE``
    for one under ``centered-clip`` (their coordinate median, with three parts or more in bounds). Under
    ``centered-clip`` with a ``standing`` (and the ``senders``' IDs), each part's agreement is added to its sender's
    standing, and the senders it screens out (``standing.left_out``) are left out of the result."""
    if aggregation in ("state", ROBUST_STATE):
        weights = state_parts(parts, weights)
        in_bounds = [p for p, w in zip(parts, weights, strict=True) if w > 0]
        if aggregation == ROBUST_STATE and len(in_bounds) >= 3:
            return coordinate_median(in_bounds)
        aggregation = "mean"
    kept = [(p, w, s) for p, w, s in zip(parts, weights, senders or [""] * len(parts), strict=True) if w > 0]
    if standing is not None:
        standing.left_out = []
    if not kept:  # nothing trustworthy in this slice: it averages to zero (no update from it)
        return torch.zeros_like(parts[0]) if parts else torch.zeros(0)
    if aggregation == "centered-clip":
        stacked = torch.stack([p.reshape(-1).float() for p, _, _ in kept])
        rows = torch.tensor([w for _, w, _ in kept], dtype=stacked.dtype)
        center, tau = clip_with_radius(stacked, rows)
        if standing is not None and senders is not None and len(kept) >= 3:
            ids = [s for _, _, s in kept]
            cosines = agreement(stacked, rows, center, tau)
            standing.observe(ids, cosines, rows.tolist())
            screened = standing.screen(ids, rows.tolist(), cosines)
            standing.left_out = [s for s, w in zip(ids, screened, strict=True) if w == 0]
            if standing.left_out:
                live = torch.tensor([w > 0 for w in screened])
                center = centered_clip(stacked[live], rows[live])
        return center.reshape(parts[0].shape).to(parts[0].dtype)
    total = sum(w for _, w, _ in kept)
    result = torch.zeros_like(parts[0], dtype=torch.float32)
    for part, w, _ in kept:  # in place, one pass per part, as hivemind's reducer sums
        result.add_(part, alpha=w / total)
    return result.to(parts[0].dtype)
