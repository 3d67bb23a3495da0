"""LARS (You et al., 2017, "Large Batch Training of Convolutional Networks"): SGD with momentum whose step for
each weight tensor is scaled by the ratio of the tensor's norm to its gradient's, as SwAV trains with.

As in SwAV's reference code, biases and normalisation weights (tensors of one dimension) take neither weight decay
nor the layer-wise scale. Every piece of state is a tensor (hivemind averages and sends the optimizer's state).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch


class Lars(torch.optim.Optimizer):
    """For each tensor ``w`` of two or more dimensions with gradient ``g``::

        d = g + weight_decay * w
        d = d * trust_coefficient * ||w|| / ||d||        (unchanged where either norm is 0)
        buffer = momentum * buffer + d                    w = w - lr * buffer

    and for one-dimensional tensors ``d = g``.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 0.1,
        momentum: float = 0.9,
        weight_decay: float = 1e-6,
        trust_coefficient: float = 0.001,
    ):
        if not lr >= 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"Invalid momentum: {momentum}")
        if not weight_decay >= 0.0:
            raise ValueError(f"Invalid weight_decay: {weight_decay}")
        if not trust_coefficient > 0.0:
            raise ValueError(f"Invalid trust_coefficient: {trust_coefficient}")
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "weight_decay": weight_decay,
            "trust_coefficient": trust_coefficient,
        }
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                direction = param.grad.clone()
                if param.ndim > 1:
                    if group["weight_decay"] != 0:
                        direction.add_(param, alpha=group["weight_decay"])
                    weight_norm = torch.linalg.vector_norm(param)
                    direction_norm = torch.linalg.vector_norm(direction)
                    scale = torch.where(
                        (weight_norm > 0) & (direction_norm > 0),
                        group["trust_coefficient"] * weight_norm / direction_norm,
                        torch.ones_like(weight_norm),
                    )
                    direction.mul_(scale)
                state = self.state[param]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                buffer = state["momentum_buffer"]
                buffer.mul_(group["momentum"]).add_(direction)
                param.sub_(buffer, alpha=group["lr"])
        return loss
