"""Metric reporting over a websocket: a small loop, not a framework.

The training loop calls :meth:`Reporter.report`, which never blocks: messages go into a bounded, ordered
buffer (the oldest are dropped, and counted, when it is full). A daemon thread runs an asyncio loop that
connects with ``async for ws in connect(...)`` (websockets reconnects by itself, with jittered exponential
backoff, after network errors), sends the buffer in order and drops a message only once the server has
acknowledged it with ``Ack{seq}``; after a reconnect everything unacknowledged is sent again, in order.

The server may answer ``Control{status, message, removed}``: when ``status`` is not ``running``, or the
volunteer was removed, the reporter
exposes it as :attr:`Reporter.control` and the training loop stops. A handshake refused with HTTP
401/403/404 (or another client error) is fatal: it is exposed as :attr:`Reporter.fatal`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
import time
from collections import deque
from typing import Any

from pydantic import ValidationError
from websockets.asyncio.client import ClientConnection, connect
from websockets.client import backoff
from websockets.client import process_exception as default_process_exception
from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI

from swarmhub.common.protocol import Ack, Control, ExperimentStatus, JoinResponse, MetricReport
from swarmhub.worker.client import ExitCode, WorkerError, report_url, token_rejected
from swarmhub.worker.join.spool import Spool

logger = logging.getLogger(__name__)

DEFAULT_BUFFER = 10_000
# The longest wait between two attempts to reach the server, before jitter: after a failed connection (websockets'
# exponential backoff) and after connections that ended without an acknowledgement (this module's own).
MAX_BACKOFF_SECONDS = 30.0
# The server closes a socket that sends more than 50 messages a second: a backlog re-sent after an outage
# goes out at this pace (training itself reports about once every 2 s).
MAX_SENDS_PER_SECOND = 20


def _process_exception(exc: Exception) -> Exception | None:
    """websockets' retry policy, plus: rate limiting and request timeouts (429, 408) are worth retrying."""
    if isinstance(exc, InvalidStatus) and exc.response.status_code in (408, 429):
        return None
    return default_process_exception(exc)


def _denial_detail(exc: InvalidStatus) -> str:
    try:
        detail = json.loads(exc.response.body or b"{}").get("detail", "")
    except (ValueError, AttributeError):
        return ""
    return detail if isinstance(detail, str) else ""


def _fatal_from(exc: BaseException, url: str) -> WorkerError:
    if isinstance(exc, InvalidStatus):
        status = exc.response.status_code
        detail = _denial_detail(exc)
        why = f" ({detail})" if detail else ""
        if status == 401:
            return token_rejected()
        if status == 403:
            return WorkerError(
                f"The server refused this worker's reports{why}: run `swarmhub join` again", ExitCode.AUTH
            )
        if status == 404:
            return WorkerError(
                f"The experiment is no longer on the server{why}: run `swarmhub experiments` to list them",
                ExitCode.NOT_FOUND,
            )
        return WorkerError(
            f"The server refused metric reports (HTTP {status}{why}): run `swarmhub join` again later",
            ExitCode.UNREACHABLE,
        )
    if isinstance(exc, InvalidURI):
        return WorkerError(f"Bad report URL {url!r}: check --server or SWARMHUB_SERVER", ExitCode.USAGE)
    return WorkerError(f"Metric reporting failed ({type(exc).__name__}: {exc})", ExitCode.UNREACHABLE)


class Reporter:
    """Sends :class:`MetricReport` messages to ``url`` in the background; see the module docstring.

    ``start()`` launches the thread; ``close(timeout)`` flushes what it can, then stops it.
    """

    def __init__(
        self,
        url: str,
        token: str,
        *,
        max_buffer: int = DEFAULT_BUFFER,
        open_timeout: float = 10.0,
        spool: Spool | None = None,
        max_backoff: float = MAX_BACKOFF_SECONDS,
    ):
        self.url = url
        self._headers = {"Authorization": f"Bearer {token}"}
        self._open_timeout = open_timeout
        self._max_backoff = max_backoff  # the longest wait between two connection attempts (before jitter)
        self._lock = threading.Lock()
        self._buffer: deque[tuple[int, str]] = deque(maxlen=max_buffer)  # (seq, json), unacked, in order
        self._dropped = 0
        self._control: Control | None = None
        self._fatal: WorkerError | None = None
        self._connected = False
        self._acked = False  # whether the server acknowledged anything on the current connection
        self._last_ack_at: float | None = None  # wall-clock time of the last Ack, for `swarmhub service status`
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=self._thread_main, name="swarmhub-reporter", daemon=True)
        self._started = threading.Event()
        self._spool = spool
        if spool is not None:  # what an earlier session of this worker run left unacknowledged goes first
            self._buffer.extend(spool.unacked())

    @classmethod
    def for_join(cls, server_url: str, token: str, join: JoinResponse, **kwargs: Any) -> Reporter:
        return cls(report_url(server_url, join), token, **kwargs)

    # -- training-loop side (any thread, never blocks) -------------------------------------------------

    def start(self) -> Reporter:
        self._thread.start()
        self._started.wait(5)
        return self

    def report(self, msg: MetricReport) -> None:
        data = msg.model_dump_json()
        if self._spool is not None:
            self._spool.append(msg.seq, data)  # on disk before it is sent
        with self._lock:
            if len(self._buffer) == self._buffer.maxlen:
                self._dropped += 1  # deque(maxlen) drops the oldest on append
            self._buffer.append((msg.seq, data))
        self._notify()

    @property
    def control(self) -> Control | None:
        """The server's last ``Control`` that stops the worker (not ``running``, or removed), if any."""
        return self._control

    @property
    def fatal(self) -> WorkerError | None:
        """Set when reporting cannot go on (token rejected, worker unknown): the worker must stop."""
        return self._fatal

    @property
    def _removed(self) -> bool:
        return self._control is not None and self._control.removed

    @property
    def dropped(self) -> int:
        return self._dropped

    @property
    def pending(self) -> int:
        """Messages not yet acknowledged by the server."""
        with self._lock:
            return len(self._buffer)

    @property
    def last_ack_at(self) -> float | None:
        """When the server last acknowledged a report (``time.time()``), or None before the first Ack."""
        return self._last_ack_at

    @property
    def connected(self) -> bool:
        return self._connected

    def close(self, timeout: float = 5.0) -> bool:
        """Flush within ``timeout`` seconds, then stop the thread. True when every message was acked.

        A removed volunteer's reports are refused, so there is nothing to flush: it stops at once."""
        if self._removed:
            timeout = 0.0
        if self._thread.is_alive() and self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._begin_close)
            except RuntimeError:  # the loop already ended
                pass
            self._thread.join(timeout)
            if self._thread.is_alive() and self._task is not None:
                try:
                    self._loop.call_soon_threadsafe(self._task.cancel)
                except RuntimeError:
                    pass
                self._thread.join(2.0)
        if self._spool is not None:
            self._spool.close(done=self.pending == 0)
        return self.pending == 0

    def __enter__(self) -> Reporter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _notify(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is None or wake is None:
            return
        try:
            loop.call_soon_threadsafe(wake.set)
        except RuntimeError:  # loop closed: the reporter is stopped, the message stays in the buffer
            pass

    # -- reporter thread -------------------------------------------------------------------------------

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception as exc:  # never let the thread die silently
            logger.exception("reporter stopped")
            self._fatal = self._fatal or _fatal_from(exc, self.url)

    def _begin_close(self) -> None:
        self._closing = True
        if self._wake is not None:
            self._wake.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._task = asyncio.current_task()  # type: ignore[assignment]
        self._started.set()
        try:
            await self._run()
        except asyncio.CancelledError:
            pass

    async def _run(self) -> None:
        drops = 0  # consecutive connections that ended without an ack: their own jittered backoff
        try:
            async for ws in connect(
                self.url,
                additional_headers=self._headers,
                open_timeout=self._open_timeout,
                process_exception=_process_exception,
                max_size=2**20,
                reconnect_delays=lambda: backoff(max_delay=self._max_backoff),
            ):
                self._connected = True
                self._acked = False
                try:
                    if await self._serve(ws):
                        return
                except ConnectionClosed as exc:
                    logger.info("report connection closed: %s", exc)
                finally:
                    self._connected = False
                if self._closing or self._removed:
                    return  # a removed volunteer's reports are refused: reconnecting would only delay the exit
                # A connection the server acknowledged on was healthy: the backoff starts over, so that a worker
                # whose network drops now and then reconnects within seconds however long it has run.
                drops = 1 if self._acked else drops + 1
                await asyncio.sleep(min(2.0**drops, self._max_backoff) * random.uniform(0.5, 1.5))
        except (InvalidStatus, InvalidURI) as exc:
            logger.warning("metric reporting stopped: %s", exc)
            self._fatal = _fatal_from(exc, self.url)

    async def _serve(self, ws: ClientConnection) -> bool:
        """Send everything unacked, then new messages as they come. True once closed after a full flush."""
        assert self._wake is not None  # noqa: S101
        receiver = asyncio.create_task(self._receive(ws))
        last_sent = -1
        loop = asyncio.get_running_loop()
        window_start, window_sends = loop.time(), 0
        try:
            while True:
                self._wake.clear()  # before reading the buffer, so no report() can slip between the two
                with self._lock:
                    unsent = [(seq, data) for seq, data in self._buffer if seq > last_sent]
                    empty = not self._buffer
                for seq, data in unsent:
                    if window_sends >= MAX_SENDS_PER_SECOND:
                        await asyncio.sleep(max(window_start + 1.0 - loop.time(), 0.0))
                    if loop.time() - window_start >= 1.0:
                        window_start, window_sends = loop.time(), 0
                    await ws.send(data)
                    window_sends += 1
                    last_sent = seq
                if self._closing and empty:
                    await ws.close()
                    return True
                if receiver.done():
                    receiver.result()  # raises ConnectionClosed (or the receiver's error)
                    raise ConnectionClosed(None, None)
                waiter = asyncio.create_task(self._wake.wait())
                await asyncio.wait({receiver, waiter}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
        finally:
            receiver.cancel()

    async def _receive(self, ws: ClientConnection) -> None:
        async for raw in ws:
            try:
                message = json.loads(raw)
                kind = message.get("type") if isinstance(message, dict) else None
                if kind == "ack":
                    self._on_ack(Ack.model_validate(message))
                elif kind == "control":
                    self._on_control(Control.model_validate(message))
                # anything else: a newer server's message this worker does not know; ignore it
            except (ValueError, ValidationError):
                logger.debug("ignoring a server message that does not parse: %.200r", raw)

    def _on_ack(self, ack: Ack) -> None:
        # Acks are cumulative: the server handles one connection's messages in order.
        self._acked = True
        self._last_ack_at = time.time()
        with self._lock:
            while self._buffer and self._buffer[0][0] <= ack.seq:
                self._buffer.popleft()
        if self._spool is not None:
            self._spool.ack(ack.seq)
        if self._wake is not None:
            self._wake.set()

    def _on_control(self, control: Control) -> None:
        if control.status != ExperimentStatus.running or control.removed:
            self._control = control
