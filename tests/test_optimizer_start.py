"""A swarm's optimizer takes the same steps as plain Adam from the first one (hivemind's start counts one step)."""

from __future__ import annotations

import copy
from functools import partial

import pytest
import torch

from swarmhub.worker.training.peer import restart_step_count

pytestmark = pytest.mark.swarm


def _train_three_steps(restart: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Three global steps of a swarm of one (hivemind.Optimizer) beside plain torch Adam on the same batches."""
    import hivemind

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    reference = copy.deepcopy(model)
    dht = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    opt = hivemind.Optimizer(
        dht=dht,
        run_id=f"adam-start-{restart}",
        params=model.parameters(),
        optimizer=partial(torch.optim.Adam, lr=0.1),
        batch_size_per_step=8,
        target_batch_size=8,  # every step ends an epoch: one optimizer step per batch
        matchmaking_time=0.5,
        averaging_timeout=5.0,
        verbose=False,
    )
    try:
        if restart:
            restart_step_count(opt)
        adam = torch.optim.Adam(reference.parameters(), lr=0.1)
        for _ in range(3):
            x = torch.randn(8, 4)
            for m in (model, reference):
                m.zero_grad()
                m(x).pow(2).mean().backward()
            opt.step()
            adam.step()
        assert opt.local_epoch == 3
        return [p.detach().clone() for p in model.parameters()], [p.detach().clone() for p in reference.parameters()]
    finally:
        opt.shutdown()
        dht.shutdown()


def test_the_swarms_updates_equal_plain_adams() -> None:
    swarm, plain = _train_three_steps(restart=True)
    for a, b in zip(swarm, plain):
        torch.testing.assert_close(a, b)


def test_without_the_restart_hivemind_is_a_step_behind_plain_adam() -> None:
    """What the restart fixes: with hivemind's own start, Adam's bias correction shrinks the first updates."""
    swarm, plain = _train_three_steps(restart=False)
    assert any(not torch.allclose(a, b, atol=1e-4) for a, b in zip(swarm, plain))
