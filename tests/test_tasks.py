"""Task plugins: the registry, parameter validation, and that the built-in task actually learns."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from swarmhub.worker.client import ExitCode, WorkerError
from swarmhub.worker.tasks import Task, UnknownTask, available_tasks, get_task
from swarmhub.worker.tasks.digits import DigitsParams, DigitsTask


def test_registry_finds_digits() -> None:
    assert "digits" in available_tasks()
    assert get_task("digits") is DigitsTask
    assert issubclass(DigitsTask, Task)


def test_unknown_task_lists_the_installed_ones() -> None:
    with pytest.raises(UnknownTask, match=r"unknown task 'no-such-task'; installed tasks: .*digits"):
        get_task("no-such-task")


def test_a_worker_without_the_task_says_what_to_install() -> None:
    from swarmhub.worker.training.peer import load_task

    with pytest.raises(WorkerError) as missing:
        load_task("no-such-task", {})
    assert missing.value.exit_code == ExitCode.NOT_FOUND
    assert "installed tasks: albert-mlm, digits" in missing.value.message and "pip install" in missing.value.message
    with pytest.raises(WorkerError, match=r"batch_size: Input should be greater than or equal to 1"):
        load_task("digits", {"batch_size": 0})
    assert isinstance(load_task("digits", {"batch_size": 8}), DigitsTask)


def test_digits_params_defaults_and_bounds() -> None:
    assert DigitsParams() == DigitsParams(hidden_size=64, batch_size=32)
    assert DigitsTask({"batch_size": 8}).batch_size == 8
    for bad in ({"batch_size": 0}, {"batch_size": 1798}, {"hidden_size": 3}, {"hidden_size": 4097}):
        with pytest.raises(ValidationError):
            DigitsParams.model_validate(bad)
    with pytest.raises(ValidationError, match="extra"):
        DigitsTask({"hiden_size": 64})  # a typo is an error, not a silently ignored setting


def test_batches_are_endless_and_seeded() -> None:
    task = DigitsTask({"batch_size": 100})
    first = [labels for _, labels in zip(range(20), (b[1] for b in task.batches(seed=1)), strict=False)]
    assert len(first) == 20  # more than one pass over the 1797 samples
    again = next(task.batches(seed=1))[1]
    other = next(task.batches(seed=2))[1]
    assert torch.equal(first[0], again)
    assert not torch.equal(first[0], other)


def test_every_peer_of_a_run_starts_from_the_same_model() -> None:
    """Peers that join a run together build identical initial weights (seeded from the run ID), another run's
    differ, and the caller's random state is left as it was."""
    from swarmhub.worker.training.peer import initial_model

    task = DigitsTask({"hidden_size": 32})
    torch.manual_seed(7)
    expected_next = torch.rand(3)
    torch.manual_seed(7)
    first, again, other = (initial_model(task, run) for run in ("run-a", "run-a", "run-b"))
    assert torch.equal(torch.rand(3), expected_next)
    weights = (model.state_dict().values() for model in (first, again, other))
    pairs = list(zip(*weights, strict=True))
    assert all(torch.equal(a, b) for a, b, _ in pairs)
    assert not all(torch.equal(a, c) for a, _, c in pairs)


def test_a_few_sgd_steps_lower_the_loss() -> None:
    torch.manual_seed(0)
    task = DigitsTask({"batch_size": 64, "hidden_size": 32})
    model = task.build_model()
    device = torch.device("cpu")
    eval_batches = [batch for batch, _ in zip(task.batches(seed=123), range(5), strict=False)]

    def eval_loss() -> float:
        with torch.no_grad():
            return sum(float(task.loss(model, batch, device)) for batch in eval_batches) / len(eval_batches)

    before = eval_loss()
    optimizer = torch.optim.SGD(task.parameter_groups(model), lr=0.5)
    for batch, _ in zip(task.batches(seed=0), range(30), strict=False):
        optimizer.zero_grad()
        task.loss(model, batch, device).backward()
        optimizer.step()
    after = eval_loss()
    assert after < 0.6 * before, (before, after)
