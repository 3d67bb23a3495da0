"""Websockets: workers' metric reports in, live dashboard updates out.

The report socket authenticates *before* accepting (bearer token + the worker run that the join
created for this user and experiment), checks the token again every ``login_recheck_seconds`` while it is open
(a revoked or expired login closes it: the worker's reconnect then gets 401, and it stops), bounds and validates
every message, hands it to the process's
report writer (``ingestion.py``: batched transactions) while it reads on (at most MAX_IN_FLIGHT), and
acknowledges the reports in order, cumulatively, by ``seq`` once they are committed, so the worker can re-send
what was lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from swarmhub.common.protocol import MAX_REPORT_BYTES, Ack, MetricReport
from swarmhub.server import experiments
from swarmhub.server.accounts import users as accounts
from swarmhub.server.core.errors import AppError, Forbidden
from swarmhub.server.http.observability import count_websocket
from swarmhub.server.live.snapshots import dashboard_snapshot
from swarmhub.server.metrics import ingestion
from swarmhub.server.models import WorkerRun, utcnow
from swarmhub.server.services import services

router = APIRouter(lifespan=ingestion.writer_lifespan)
logger = logging.getLogger("swarmhub.ws")
POLICY_VIOLATION = 1008
MAX_MESSAGES_PER_SECOND = 50  # on average; far above what a worker sends (about one message every 2 s)
MAX_BURST = 250  # messages read at once: a reporter's backlog (20/s) that waited about 15 s for a stalled database
MAX_IN_FLIGHT = 64  # reports read from one socket and not yet acknowledged
INTERNAL_ERROR = 1011
TRY_AGAIN_LATER = 1013


async def _deny(websocket: WebSocket, status: int, detail: str) -> None:
    """Refuse the handshake with a real HTTP status, so clients can tell 401 from 404."""
    body = json.dumps({"detail": detail}).encode()
    await websocket.send_denial_response(Response(body, status_code=status, media_type="application/json"))


def _authorize(app: Any, token: str | None, slug: str, worker_id: str) -> tuple[str, str] | AppError:
    with services(app).sessionmaker.begin() as session:
        try:
            user, _ = accounts.user_for_token(session, token)
            experiment = experiments.get_visible(session, slug, user)
        except AppError as exc:
            return exc
        worker = session.get(WorkerRun, worker_id) if "\x00" not in worker_id else None  # PostgreSQL refuses NUL
        if worker is None or worker.user_id != user.id or worker.experiment_id != experiment.id:
            return Forbidden("unknown worker_id for this user and experiment: join again")
        return worker.id, experiment.slug


async def _enqueue(app: Any, worker_id: str, report: MetricReport) -> asyncio.Future[ingestion.Outcome]:
    """Hand a report to the process's writer; the future is set once it is committed."""
    writer = services(app).reports
    if writer is not None:
        return await writer.enqueue(worker_id, report)
    # An app used without its lifespan (no writer task): store this one report alone, before the next is read
    future: asyncio.Future[ingestion.Outcome] = asyncio.get_running_loop().create_future()
    try:
        outcomes = await run_in_threadpool(ingestion.store, services(app).sessionmaker, [(worker_id, report, utcnow())])
        future.set_result(outcomes[0])
    except Exception as exc:  # the acknowledging side raises it
        future.set_exception(exc)
    return future


@router.websocket("/ws/experiments/{slug}/report")
async def report(websocket: WebSocket, slug: str, worker_id: str = "") -> None:
    """A worker's reports, in order. Reading and acknowledging run side by side: the socket reads the next
    report while earlier ones wait for their transaction (at most MAX_IN_FLIGHT; then it stops reading), and
    acknowledges each, in order, once it is committed."""
    app = websocket.app
    header = websocket.headers.get("authorization", "")
    token = header[7:].strip() if header.lower().startswith("bearer ") else None
    outcome = await run_in_threadpool(_authorize, app, token, slug, worker_id[:64])
    if isinstance(outcome, AppError):
        await _deny(websocket, outcome.status_code, outcome.message)
        return
    worker_id, slug = outcome
    await websocket.accept()
    count_websocket(app, "report", 1)
    in_flight = _InFlight(MAX_IN_FLIGHT)
    reader = asyncio.ensure_future(_read_reports(websocket, app, worker_id, in_flight))
    acker = asyncio.ensure_future(_acknowledge(websocket, app, slug, in_flight))
    login = asyncio.ensure_future(_recheck_login(websocket, app, token))
    tasks = (reader, acker, login)
    try:
        # Any ends the socket: the worker hung up or broke a rule (reports already queued are still stored,
        # unacknowledged: the worker re-sends them and they count once), the volunteer was removed, or the login
        # was revoked.
        await asyncio.wait(set(tasks), return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if not task.done():
                task.cancel()
        for task in tasks:
            try:
                await task
            except ingestion.NotStored:
                raise
            except (asyncio.CancelledError, WebSocketDisconnect, RuntimeError):
                pass  # cancelled above, or the worker went away while this side was sending
    except ingestion.NotStored as exc:  # the writer logged why
        with contextlib.suppress(Exception):
            await websocket.close(INTERNAL_ERROR, f"{exc}: re-send it")
    except Exception:
        logger.exception("a report socket of worker run %s failed", worker_id)
        with contextlib.suppress(Exception):
            await websocket.close(INTERNAL_ERROR, "the server could not store a report: re-send it")
    finally:
        count_websocket(app, "report", -1)


def _login_valid(app: Any, token: str | None) -> bool:
    with services(app).sessionmaker.begin() as session:
        try:
            accounts.user_for_token(session, token)
        except AppError:
            return False
    return True


async def _recheck_login(websocket: WebSocket, app: Any, token: str | None) -> None:
    """Close the socket once its login is no longer valid (revoked, say after a leak, or expired): what was
    authorized at the handshake is asked again every ``login_recheck_seconds``."""
    every = services(app).settings.login_recheck_seconds
    while True:
        await asyncio.sleep(every)
        try:
            valid = await run_in_threadpool(_login_valid, app, token)
        except Exception as exc:  # the database is unavailable for now: the next check asks again
            logger.warning("could not check a report socket's login: %r", exc)
            continue
        if not valid:
            await websocket.close(POLICY_VIOLATION, "this login was revoked or expired: run `swarmhub login` again")
            return


async def _read_reports(websocket: WebSocket, app: Any, worker_id: str, in_flight: _InFlight) -> None:
    """Read, bound and validate reports and queue each for storing, until the worker hangs up or breaks a
    rule (then the socket is closed with the reason)."""
    loop = asyncio.get_running_loop()
    # A token bucket: MAX_MESSAGES_PER_SECOND on average, with room for MAX_BURST at once, so that what a worker
    # sent at a fair pace while this socket was not reading (its reports waiting for a slow database) does not
    # count as a flood when it is read in one go.
    tokens, filled_at = float(MAX_BURST), loop.time()
    while True:
        await in_flight.reserve()  # at most MAX_IN_FLIGHT read and not yet acknowledged: then stop reading
        try:
            text = await websocket.receive_text()
        except WebSocketDisconnect:
            return
        now = loop.time()
        tokens = min(float(MAX_BURST), tokens + (now - filled_at) * MAX_MESSAGES_PER_SECOND)
        filled_at = now
        if tokens < 1:
            await websocket.close(POLICY_VIOLATION, "too many messages")
            return
        tokens -= 1
        if len(text) > MAX_REPORT_BYTES or len(text.encode()) > MAX_REPORT_BYTES:
            await websocket.close(POLICY_VIOLATION, f"message larger than {MAX_REPORT_BYTES} bytes")
            return
        try:
            message = MetricReport.model_validate_json(text)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or "message"
            await websocket.close(POLICY_VIOLATION, f"invalid report: {field}: {first['msg']}"[:120])
            return
        in_flight.put(message.seq, await _enqueue(app, worker_id, message))


async def _acknowledge(websocket: WebSocket, app: Any, slug: str, in_flight: _InFlight) -> None:
    """Acknowledge the queued reports, in order, once committed; stop a removed volunteer's socket. Acks are
    cumulative (an ack of seq N answers every report of this socket up to N), so the reports of one socket
    that one transaction stored get one ack."""
    counted = {
        True: services(app).metrics.ingested.labels("stored"),
        False: services(app).metrics.ingested.labels("duplicate"),
    }
    while True:
        seq, future = await in_flight.first()
        outcome = await future  # raises what storing raised: the socket is closed and the worker re-sends
        last_control = None
        while True:
            in_flight.pop()
            control, stored = outcome
            counted[stored].inc()
            if control is not None and control.removed:  # nothing more is stored from a removed volunteer
                await websocket.send_text(control.model_dump_json())
                await websocket.close(POLICY_VIOLATION, "removed by the organizer")
                return
            last_control = control or last_control
            if not in_flight.items or not in_flight.items[0][1].done():
                break
            seq, future = in_flight.items[0]
            outcome = future.result()
        services(app).live.mark(slug)
        await websocket.send_text(Ack(seq=seq).model_dump_json())
        if last_control is not None:
            await websocket.send_text(last_control.model_dump_json())


class _InFlight:
    """One socket's reports between reading and acknowledging, in order: at most ``limit`` (``reserve`` waits
    for room before the socket reads the next one)."""

    def __init__(self, limit: int):
        self.items: deque[tuple[int, asyncio.Future[ingestion.Outcome]]] = deque()
        self._limit = limit
        self._room = asyncio.Event()  # set on every pop: reserve waits on it while the socket is full
        self._ready = asyncio.Event()

    async def reserve(self) -> None:
        """Wait for room for one more report (taken by the next ``put``)."""
        while len(self.items) >= self._limit:
            self._room.clear()
            await self._room.wait()

    def put(self, seq: int, future: asyncio.Future[ingestion.Outcome]) -> None:
        self.items.append((seq, future))
        self._ready.set()

    async def first(self) -> tuple[int, asyncio.Future[ingestion.Outcome]]:
        while not self.items:
            self._ready.clear()
            await self._ready.wait()
        return self.items[0]

    def pop(self) -> None:
        self.items.popleft()
        self._room.set()


def _snapshot(app: Any, slug: str) -> str | None:
    """The experiment's dashboard snapshot as JSON text: encoded once, sent as is to every viewer."""
    with services(app).sessionmaker.begin() as session:
        try:
            experiment = experiments.get_visible(session, slug, None)
        except AppError:
            return None
        data = dashboard_snapshot(session, experiment, app)
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


@router.websocket("/ws/experiments/{slug}/live")
async def live(websocket: WebSocket, slug: str) -> None:
    """Public: a snapshot on connect, then one whenever the experiment's numbers change. Over the caps of
    :class:`LiveSeats` the socket is closed at once with 1013 (try again later) and a reason."""
    app = websocket.app
    address = websocket.client.host if websocket.client else "unknown"
    refused = services(app).live_seats.take(address, slug)
    if refused is not None:
        await websocket.accept()
        await websocket.close(TRY_AGAIN_LATER, refused)
        return
    try:
        await _watch(websocket, app, slug)
    finally:
        services(app).live_seats.give_back(address, slug)


async def _watch(websocket: WebSocket, app: Any, slug: str) -> None:
    first = await run_in_threadpool(_snapshot, app, slug)
    if first is None:
        await _deny(websocket, 404, f"no experiment {slug!r}")
        return
    await websocket.accept()
    queue = services(app).live.subscribe(slug)
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
        services(app).live.unsubscribe(slug, queue)
        receiver.cancel()
        if receiver.done() and not receiver.cancelled():
            receiver.exception()  # retrieved, so asyncio does not log the viewer's disconnect as an error


async def live_snapshot(app: Any, slug: str) -> str | None:
    return await run_in_threadpool(_snapshot, app, slug)
