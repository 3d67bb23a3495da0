"""LAMB: one step against the paper's formulas, the trust ratio, learning, and a state that hivemind can carry."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch

from swarmhub.common.protocol import OptimizerName, TrainingSettings
from swarmhub.worker.training.lamb import Lamb


def test_one_step_matches_the_formulas_by_hand() -> None:
    weight = torch.tensor([3.0, -4.0])  # ||w|| = 5
    grad = torch.tensor([0.5, 2.0])
    param = torch.nn.Parameter(weight.clone())
    param.grad = grad.clone()
    lr, (beta1, beta2), eps, decay = 0.1, (0.9, 0.99), 1e-6, 0.01
    Lamb([param], lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=decay).step()

    m = (1 - beta1) * grad
    v = (1 - beta2) * grad * grad
    update = (m / (1 - beta1)) / ((v / (1 - beta2)).sqrt() + eps) + decay * weight
    # first step: m_hat / sqrt(v_hat) is sign(g), so update = (1, 1) + 0.01 * w = (1.03, 0.96)
    assert torch.allclose(update, torch.tensor([1.03, 0.96]), atol=1e-5)
    ratio = 5.0 / math.hypot(1.03, 0.96)
    expected = weight - lr * ratio * update
    assert torch.allclose(param.detach(), expected, atol=1e-6)


def test_two_steps_use_bias_corrected_moments() -> None:
    param = torch.nn.Parameter(torch.tensor([1.0, 2.0, 2.0]))  # ||w|| = 3
    grads = [torch.tensor([1.0, -1.0, 0.5]), torch.tensor([-2.0, 0.5, 1.0])]
    opt = Lamb([param], lr=0.05, betas=(0.8, 0.9), eps=1e-3)
    w = param.detach().clone()
    m = torch.zeros(3)
    v = torch.zeros(3)
    for t, grad in enumerate(grads, start=1):
        param.grad = grad
        opt.step()
        m = 0.8 * m + 0.2 * grad
        v = 0.9 * v + 0.1 * grad * grad
        update = (m / (1 - 0.8**t)) / ((v / (1 - 0.9**t)).sqrt() + 1e-3)
        w = w - 0.05 * (w.norm() / update.norm()) * update
    assert torch.allclose(param.detach(), w, atol=1e-6)


def test_trust_ratio_is_one_for_zero_weights_and_clamps_large_ones() -> None:
    zero = torch.nn.Parameter(torch.zeros(4))
    zero.grad = torch.tensor([1.0, -1.0, 2.0, -2.0])
    Lamb([zero], lr=0.1, eps=0.0).step()
    # ratio 1: a plain Adam step of lr * sign(g) on the first step
    assert torch.allclose(zero.detach(), torch.tensor([-0.1, 0.1, -0.1, 0.1]))

    big = torch.nn.Parameter(torch.tensor([300.0, 400.0]))  # ||w|| = 500, clamped to 10
    big.grad = torch.tensor([1.0, 1.0])
    Lamb([big], lr=0.1, eps=0.0).step()
    step = torch.tensor([300.0, 400.0]) - big.detach()
    assert step.norm().item() == pytest.approx(0.1 * 10.0, rel=1e-4)

    unclamped = torch.nn.Parameter(torch.tensor([300.0, 400.0]))
    unclamped.grad = torch.tensor([1.0, 1.0])
    Lamb([unclamped], lr=0.1, eps=0.0, clamp_value=None).step()
    assert (torch.tensor([300.0, 400.0]) - unclamped.detach()).norm().item() == pytest.approx(0.1 * 500.0, rel=1e-4)


def test_a_zero_gradient_leaves_the_weights_as_they_are() -> None:
    """hivemind initialises the optimizer's state with one step on zero gradients (no weight decay here)."""
    param = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    param.grad = torch.zeros(2)
    opt = Lamb([param], lr=0.1)
    opt.step()
    assert torch.equal(param.detach(), torch.tensor([1.0, -2.0]))
    assert torch.is_tensor(opt.state[param]["step"]) and float(opt.state[param]["step"]) == 1.0


def test_it_fits_a_linear_regression() -> None:
    # Several outputs: a one-element tensor cannot change sign under LAMB (its step is lr * |w| along the update),
    # a property of the algorithm, so a single scalar bias could not reach a target of the other sign.
    torch.manual_seed(0)
    features = torch.randn(256, 8)
    target = features @ torch.randn(8, 4) + torch.randn(4)
    model = torch.nn.Linear(8, 4)
    opt = Lamb(model.parameters(), lr=0.05)
    steps = 200
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1 - step / steps)

    def loss() -> torch.Tensor:
        return torch.nn.functional.mse_loss(model(features), target)

    before = loss().item()
    for _ in range(steps):
        opt.zero_grad()
        loss().backward()
        opt.step()
        schedule.step()
    assert loss().item() < 1e-3 * before, (before, loss().item())


def _trained(seed: int = 0) -> tuple[torch.nn.Module, Lamb, torch.Tensor]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    groups = [
        {"params": [model[0].weight, model[2].weight], "weight_decay": 0.01},
        {"params": [model[0].bias, model[2].bias], "weight_decay": 0.0},
    ]
    opt = Lamb(groups, lr=0.01)
    data = torch.randn(32, 4)
    for _ in range(5):
        opt.zero_grad()
        model(data).pow(2).mean().backward()
        opt.step()
    return model, opt, data


def _next_step(model: torch.nn.Module, opt: Lamb, data: torch.Tensor) -> list[torch.Tensor]:
    opt.zero_grad()
    model(data).pow(2).mean().backward()
    opt.step()
    return [p.detach().clone() for p in model.parameters()]


def test_state_dict_round_trip_gives_identical_next_steps() -> None:
    model, opt, data = _trained()
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buffer)

    other, other_opt, _ = _trained(seed=1)  # different weights and statistics, then overwritten
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    other.load_state_dict(saved["model"])
    other_opt.load_state_dict(saved["opt"])

    ours, theirs = _next_step(model, opt, data), _next_step(other, other_opt, data)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)
    assert [g["weight_decay"] for g in other_opt.param_groups] == [0.01, 0.0]


def test_state_is_tensors_with_a_tensor_step() -> None:
    _, opt, _ = _trained()
    for state in opt.state.values():
        assert set(state) == {"step", "exp_avg", "exp_avg_sq"}
        assert torch.is_tensor(state["step"]) and state["step"].dtype == torch.float32
        assert float(state["step"]) == 5.0
    state = copy.deepcopy(opt.state_dict())
    state["state"][0]["step"] = 5  # as an older torch might have saved it
    opt.load_state_dict(state)
    assert torch.is_tensor(opt.state[opt.param_groups[0]["params"][0]]["step"])


def test_hivemind_state_averager_drives_it() -> None:
    """hivemind's own helpers: the zero-gradient initial step, and the dump/load used to send state to peers."""
    from hivemind.optim.state_averager import dump_optimizer_state, initialize_optimizer_state_, load_optimizer_state

    model, opt, data = _trained()
    initialize_optimizer_state_(opt)
    metadata, tensors = dump_optimizer_state(opt)
    assert all(torch.is_tensor(t) for t in tensors)
    copied, copied_opt, _ = _trained(seed=2)
    initialize_optimizer_state_(copied_opt)
    copied.load_state_dict(model.state_dict())
    load_optimizer_state(copied_opt, metadata, [t.clone() for t in tensors])
    for a, b in zip(_next_step(model, opt, data), _next_step(copied, copied_opt, data), strict=True):
        assert torch.equal(a, b)


def test_the_worker_trains_with_lamb() -> None:
    from swarmhub.worker.training.peer import optimizer_factory

    settings = TrainingSettings.model_validate({"optimizer": "lamb", "learning_rate": 0.002})
    assert settings.optimizer is OptimizerName.lamb
    opt = optimizer_factory(settings)([torch.nn.Parameter(torch.ones(2))])
    assert isinstance(opt, Lamb) and opt.param_groups[0]["lr"] == pytest.approx(0.002)
