"""Websockets: workers' metric reports in, live dashboard updates out.

The report socket authenticates *before* accepting (bearer token + the worker run that the join
created for this user and experiment), bounds and validates every message, hands it to the process's
report writer (``ingestion.py``: batched transactions) and acknowledges each report by its ``seq`` once
it is committed, so the worker can re-send what was lost.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from swarmhub.worker.protocol import MAX_REPORT_BYTES, Ack, MetricReport

from .. import accounts, experiments, ingestion
from ..errors import AppError, Forbidden
from ..models import WorkerRun, utcnow
from ..observability import count_websocket
from ..snapshots import dashboard_snapshot

router = APIRouter(lifespan=ingestion.writer_lifespan)
logger = logging.getLogger("swarmhub.ws")
POLICY_VIOLATION = 1008
MAX_MESSAGES_PER_SECOND = 50  # far above what a worker sends (about one message every 2 s)


async def _deny(websocket: WebSocket, status: int, detail: str) -> None:
    """Refuse the handshake with a real HTTP status, so clients can tell 401 from 404."""
    body = json.dumps({"detail": detail}).encode()
    await websocket.send_denial_response(Response(body, status_code=status, media_type="application/json"))


def _authorize(app: Any, token: str | None, slug: str, worker_id: str) -> tuple[str, str] | AppError:
    with app.state.sessionmaker.begin() as session:
        try:
            user, _ = accounts.user_for_token(session, token)
            experiment = experiments.get_visible(session, slug, user)
        except AppError as exc:
            return exc
        worker = session.get(WorkerRun, worker_id) if "\x00" not in worker_id else None  # PostgreSQL refuses NUL
        if worker is None or worker.user_id != user.id or worker.experiment_id != experiment.id:
            return Forbidden("unknown worker_id for this user and experiment: join again")
        return worker.id, experiment.slug


async def _store(app: Any, worker_id: str, report: MetricReport) -> ingestion.Outcome:
    writer = getattr(app.state, "reports", None)
    if writer is None:  # an app used without its lifespan (no writer task): store this one report alone
        outcomes = await run_in_threadpool(ingestion.store, app.state.sessionmaker, [(worker_id, report, utcnow())])
        return outcomes[0]
    return await writer.submit(worker_id, report)


@router.websocket("/ws/experiments/{slug}/report")
async def report(websocket: WebSocket, slug: str, worker_id: str = "") -> None:
    app = websocket.app
    header = websocket.headers.get("authorization", "")
    token = header[7:].strip() if header.lower().startswith("bearer ") else None
    outcome = await run_in_threadpool(_authorize, app, token, slug, worker_id[:64])
    if isinstance(outcome, AppError):
        await _deny(websocket, outcome.status_code, outcome.message)
        return
    worker_id, slug = outcome
    await websocket.accept()
    window_start, count = asyncio.get_running_loop().time(), 0
    count_websocket(app, "report", 1)
    try:
        while True:
            text = await websocket.receive_text()
            now = asyncio.get_running_loop().time()
            if now - window_start >= 1:
                window_start, count = now, 0
            count += 1
            if count > MAX_MESSAGES_PER_SECOND:
                await websocket.close(POLICY_VIOLATION, "too many messages")
                return
            if len(text.encode()) > MAX_REPORT_BYTES:
                await websocket.close(POLICY_VIOLATION, f"message larger than {MAX_REPORT_BYTES} bytes")
                return
            try:
                message = MetricReport.model_validate_json(text)
            except ValidationError as exc:
                first = exc.errors()[0]
                field = ".".join(str(p) for p in first["loc"]) or "message"
                await websocket.close(POLICY_VIOLATION, f"invalid report: {field}: {first['msg']}"[:120])
                return
            control, stored = await _store(app, worker_id, message)  # returns once the report is committed
            app.state.metrics.ingested.labels("stored" if stored else "duplicate").inc()
            if control is not None and control.removed:  # nothing more is stored from a removed volunteer
                await websocket.send_text(control.model_dump_json())
                await websocket.close(POLICY_VIOLATION, "removed by the organizer")
                return
            app.state.live.mark(slug)
            await websocket.send_text(Ack(seq=message.seq).model_dump_json())
            if control is not None:
                await websocket.send_text(control.model_dump_json())
    except WebSocketDisconnect:
        pass
    finally:
        count_websocket(app, "report", -1)


def _snapshot(app: Any, slug: str) -> str | None:
    """The experiment's dashboard snapshot as JSON text: encoded once, sent as is to every viewer."""
    with app.state.sessionmaker.begin() as session:
        try:
            experiment = experiments.get_visible(session, slug, None)
        except AppError:
            return None
        data = dashboard_snapshot(session, experiment, app)
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


@router.websocket("/ws/experiments/{slug}/live")
async def live(websocket: WebSocket, slug: str) -> None:
    """Public: a snapshot on connect, then one whenever the experiment's numbers change."""
    app = websocket.app
    first = await run_in_threadpool(_snapshot, app, slug)
    if first is None:
        await _deny(websocket, 404, f"no experiment {slug!r}")
        return
    await websocket.accept()
    queue = app.state.live.subscribe(slug)
    count_websocket(app, "live", 1)
    # Viewers send nothing: any message, or the close, ends the subscription.
    receiver = asyncio.ensure_future(websocket.receive_text())
    try:
        await websocket.send_text(first)
        while True:
            getter = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait({receiver, getter}, return_when=asyncio.FIRST_COMPLETED)
            if receiver in done:
                getter.cancel()
                break
            await websocket.send_text(getter.result())
    except (WebSocketDisconnect, RuntimeError):
        pass
    finally:
        count_websocket(app, "live", -1)
        app.state.live.unsubscribe(slug, queue)
        receiver.cancel()
        if receiver.done() and not receiver.cancelled():
            receiver.exception()  # retrieved, so asyncio does not log the viewer's disconnect as an error


async def live_snapshot(app: Any, slug: str) -> str | None:
    return await run_in_threadpool(_snapshot, app, slug)
