"""What a task proposes: ``GET /api/tasks/{task}/proposal``, the target batch size and timings that keep a planned
swarm bound by compute (``Task.proposal``). Public: it reads no account's data."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from swarmhub.common.proposal import DEFAULT_PLANNED_PEERS, SettingsProposal
from swarmhub.server.core.errors import NotFound, documented
from swarmhub.worker.tasks import UnknownTask, get_task

router = APIRouter(prefix="/api", tags=["api"], responses=documented(404))

MAX_PLANNED_PEERS = 100_000


@router.get("/tasks/{task}/proposal", response_model=SettingsProposal)
def task_proposal(
    task: str,
    request: Request,
    planned_peers: Annotated[int, Query(ge=1, le=MAX_PLANNED_PEERS)] = DEFAULT_PLANNED_PEERS,
) -> SettingsProposal:
    """The target batch size and timings a task proposes for a swarm of ``planned_peers`` peers as fast as its
    reference peer; the task's parameters are the other query parameters (its defaults where absent)."""
    try:
        task_class = get_task(task)
    except UnknownTask as exc:
        raise NotFound(str(exc), field="task") from None
    params = {k: v for k, v in request.query_params.items() if k != "planned_peers"}
    try:
        proposal = task_class(params).proposal(planned_peers)
    except ValidationError as exc:
        raise RequestValidationError([{**err, "loc": ("query", *err["loc"])} for err in exc.errors()]) from None
    if proposal is None:
        raise NotFound(f"the task {task!r} has no reference rate to size a proposal with", field="task")
    return proposal
