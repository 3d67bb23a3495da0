"""After a rollback the learning-rate schedule runs at ``epoch - schedule_offset``, and the offset travels with the
swarm's state: a peer that downloads the state takes the rate of the restored checkpoint's step, not of the epoch.

Two real hivemind peers in this process (``SwarmOptimizer``, as workers run it): one holds a state at epoch 30 with
an offset of 20; the other joins and downloads it. The same download takes a volunteer's parameters and epoch but
not its optimizer statistics or settings."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from swarmhub.worker.training.optimizer import SwarmOptimizer

pytestmark = pytest.mark.swarm


def schedule(step: int) -> float:
    return 1.0 / (1 + step)  # every step its own rate


def make_peer(dht, run_id: str, model: torch.nn.Module, optimizer=partial(torch.optim.SGD, lr=0.5)) -> SwarmOptimizer:  # noqa: ANN001, B008
    return SwarmOptimizer(
        dht=dht,
        run_id=run_id,
        params=model.parameters(),
        optimizer=optimizer,
        scheduler=partial(torch.optim.lr_scheduler.LambdaLR, lr_lambda=schedule),
        batch_size_per_step=8,
        target_batch_size=64,
        matchmaking_time=0.5,
        averaging_timeout=5.0,
        verbose=False,
    )


def rate(opt: SwarmOptimizer) -> float:
    return opt.state_averager.optimizer.param_groups[0]["lr"]


@pytest.mark.parametrize(("served", "taken"), [(20, 20), (-3, 0), (31, 0), ("20", 0)])
def test_a_downloaded_state_brings_its_schedule_offset(served, taken):
    import hivemind

    first = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    second = hivemind.DHT(
        host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=[str(a) for a in first.get_visible_maddrs()], start=True
    )
    run_id = f"schedule-{taken}-{abs(hash(str(served)))}"
    holder = joiner = None
    try:
        holder = make_peer(first, run_id, torch.nn.Linear(4, 2))
        averager = holder.state_averager
        averager.local_epoch = 30
        assert averager.take_schedule_offset(20)
        assert averager.schedule_step == 10
        assert rate(holder) == pytest.approx(0.5 * schedule(10))
        averager.schedule_offset = served  # what this peer serves to newcomers, valid or not
        averager.state_sharing_priority = 30

        joiner = make_peer(second, run_id, torch.nn.Linear(4, 2))
        assert rate(joiner) == pytest.approx(0.5 * schedule(0))
        for _ in range(10):  # the holder's priority reaches the DHT within a moment
            joiner.state_averager.load_state_from_peers(timeout=10)
            if joiner.local_epoch == 30:
                break
        assert joiner.local_epoch == 30
        assert joiner.state_averager.schedule_offset == taken
        assert rate(joiner) == pytest.approx(0.5 * schedule(30 - taken))
    finally:
        for opt in (holder, joiner):
            if opt is not None:
                opt.shutdown()
        second.shutdown()
        first.shutdown()


def test_plain_hivemind_peers_and_swarmhub_peers_download_each_others_state():
    """The state is served under hivemind's own RPC names: a peer of another swarmhub version (or hivemind's
    own optimizer) downloads a swarmhub peer's state, and the other way round."""
    import hivemind

    first = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    second = hivemind.DHT(
        host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=[str(a) for a in first.get_visible_maddrs()], start=True
    )
    run_id = f"wire-{abs(hash(first.peer_id.to_base58()))}"
    ours = plain = None
    try:
        ours = make_peer(first, run_id, torch.nn.Linear(4, 2))
        ours.state_averager.local_epoch = 12
        ours.state_averager.state_sharing_priority = 12
        plain = hivemind.Optimizer(
            dht=second,
            run_id=run_id,
            params=torch.nn.Linear(4, 2).parameters(),
            optimizer=partial(torch.optim.SGD, lr=0.5),
            scheduler=partial(torch.optim.lr_scheduler.LambdaLR, lr_lambda=schedule),
            batch_size_per_step=8,
            target_batch_size=64,
            matchmaking_time=0.5,
            averaging_timeout=5.0,
            verbose=False,
        )
        for _ in range(10):  # the holder's priority reaches the DHT within a moment
            plain.state_averager.load_state_from_peers(timeout=10)
            if plain.local_epoch == 12:
                break
        assert plain.local_epoch == 12  # hivemind's peer took swarmhub's state
        plain.state_averager.local_epoch = 40
        plain.state_averager.state_sharing_priority = 40
        for _ in range(10):
            ours.state_averager.load_state_from_peers(timeout=10)
            if ours.local_epoch == 40:
                break
        assert ours.local_epoch == 40  # and swarmhub's took hivemind's
    finally:
        for opt in (ours, plain):
            if opt is not None:
                opt.shutdown()
        second.shutdown()
        first.shutdown()


def test_a_volunteer_s_state_brings_its_parameters_not_its_optimizer_statistics_or_settings():
    """A holder's state with Adam's second moments x1e12 (a peer that stepped on its gradients x-1000 holds x1e6)
    and a learning rate of 1e6 in its settings: the joiner takes the parameters and the epoch, keeps its own
    statistics (those of a fresh optimizer) and settings, and its rate is its own schedule's at the epoch taken."""
    import hivemind

    first = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    second = hivemind.DHT(
        host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=[str(a) for a in first.get_visible_maddrs()], start=True
    )
    run_id = f"statistics-{abs(hash(first.peer_id.to_base58()))}"
    holder = joiner = None

    def adam_peer(dht) -> SwarmOptimizer:  # noqa: ANN001
        return make_peer(dht, run_id, torch.nn.Linear(4, 2), partial(torch.optim.Adam, lr=0.5))

    try:
        holder = adam_peer(first)
        averager = holder.state_averager
        with torch.no_grad():
            for group in averager.optimizer.param_groups:
                group["lr"] = 1e6
                for param in group["params"]:
                    param.fill_(0.25)
                    averager.optimizer.state[param]["exp_avg_sq"].fill_(1e12)
        averager.local_epoch = 12
        averager.state_sharing_priority = 12

        joiner = adam_peer(second)
        optimizer = joiner.state_averager.optimizer
        own = {k: v.clone() for k, v in optimizer.state[optimizer.param_groups[0]["params"][0]].items()}
        for _ in range(10):  # the holder's priority reaches the DHT within a moment
            joiner.state_averager.load_state_from_peers(timeout=10)
            if joiner.local_epoch == 12:
                break
        assert joiner.local_epoch == 12
        params = [p for group in optimizer.param_groups for p in group["params"]]
        assert all(torch.equal(p, torch.full_like(p, 0.25)) for p in params)  # the parameters were taken
        for param in params:
            assert float(optimizer.state[param]["exp_avg_sq"].max()) < 1.0  # not the holder's
        first_param = optimizer.state[optimizer.param_groups[0]["params"][0]]
        assert all(torch.equal(first_param[k], v) for k, v in own.items())  # its own, as they were
        assert rate(joiner) == pytest.approx(0.5 * schedule(12))  # its own schedule at the epoch taken, not 1e6
    finally:
        for opt in (holder, joiner):
            if opt is not None:
                opt.shutdown()
        second.shutdown()
        first.shutdown()
