"""Optimizers that torch does not ship: :class:`Lamb`, ALBERT's optimizer in DeDLOC.

hivemind builds the optimizer itself from a factory (``lambda params: Lamb(params, lr=...)``), possibly on an
offloaded copy of the parameters, and averages and sends the optimizer's state between peers: every piece of
state is therefore a tensor, the step count included (as ``torch.optim.Adam`` keeps it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al., 2019, "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes").

    For each parameter tensor ``w`` with gradient ``g`` at step ``t``::

        m = beta1 * m + (1 - beta1) * g            v = beta2 * v + (1 - beta2) * g * g
        update = (m / (1 - beta1**t)) / (sqrt(v / (1 - beta2**t)) + eps) + weight_decay * w
        ratio = min(||w||, clamp_value) / ||update||      (1 where either norm is 0)
        w = w - lr * ratio * update

    Weight decay is decoupled (added to the update, not to the gradient) and set per parameter group, so norms
    and biases can go without it. ``clamp_value=None`` leaves the weight norm unclamped.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        clamp_value: float | None = 10.0,
    ):
        if not lr >= 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid betas: {betas}")
        if not eps >= 0.0:
            raise ValueError(f"Invalid epsilon: {eps}")
        if not weight_decay >= 0.0:
            raise ValueError(f"Invalid weight_decay: {weight_decay}")
        if clamp_value is not None and not clamp_value > 0.0:
            raise ValueError(f"Invalid clamp_value: {clamp_value}")
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "clamp_value": clamp_value}
        super().__init__(params, defaults)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("clamp_value", 10.0)
        for value in self.state.values():  # a state saved with a number for its step count
            if "step" in value and not torch.is_tensor(value["step"]):
                value["step"] = torch.tensor(float(value["step"]), dtype=torch.float32)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad
                if grad.is_sparse:
                    raise RuntimeError("Lamb does not support sparse gradients")
                state = self.state[param]
                if not state:
                    # The step count stays on the CPU, as Adam's does: it is read as a number every step.
                    state["step"] = torch.tensor(0.0, dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                state["step"] += 1
                step = float(state["step"])

                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                denominator = (exp_avg_sq / (1 - beta2**step)).sqrt_().add_(group["eps"])
                update = (exp_avg / (1 - beta1**step)).div_(denominator)
                if group["weight_decay"] != 0:
                    update.add_(param, alpha=group["weight_decay"])

                weight_norm = torch.linalg.vector_norm(param)
                if group["clamp_value"] is not None:
                    weight_norm = weight_norm.clamp(max=group["clamp_value"])
                update_norm = torch.linalg.vector_norm(update)
                # Without .item(): no device synchronisation per parameter on a GPU.
                trust_ratio = torch.where(
                    (weight_norm > 0) & (update_norm > 0), weight_norm / update_norm, torch.ones_like(weight_norm)
                )
                param.sub_(update.mul_(trust_ratio * group["lr"]))
        return loss
