"""``BodyLimit``: every HTTP request body is bounded before anything reads it.

FastAPI reads a JSON body into memory, and Starlette parses a whole multipart form, before a route's dependencies
run (log-in rate limits, authentication, an upload's own size check): nothing there can refuse a body in time. This
ASGI middleware sits in front of the routes. A body whose Content-Length is over its route's limit is answered 413
at once, unread; one sent without a Content-Length (chunked) is counted as it streams in and answered 413 as soon
as the count passes the limit, nothing of it kept. Websocket and lifespan messages pass untouched.

Limits: ``SWARMHUB_BODY_MAX_MB`` for every route; a corpus upload takes ``SWARMHUB_CORPUS_MAX_MB`` (and the form's
framing), or ``SWARMHUB_CORPUS_IMAGES_MAX_MB`` where its experiment's task trains on images (looked up by the slug in
the path), the upload probe its 8 MiB. They are read from the settings at each request.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from swarmhub.server.core.errors import AppError, TooLarge
from swarmhub.server.core.settings import Settings
from swarmhub.server.corpus import image_data, training_data
from swarmhub.server.corpus import upload as corpus_upload
from swarmhub.server.corpus.training_data import CorpusKind
from swarmhub.server.routes.data import UPLOAD_OVERHEAD
from swarmhub.server.routes.probe import MAX_PROBE_BYTES
from swarmhub.server.services import services

CORPUS_UPLOAD = re.compile(r"(/api)?/experiments/(?P<slug>[^/]+)/corpus")  # the API's PUT and the page's form POST
UPLOAD_PROBE = "/api/probe/upload"


@dataclass(frozen=True)
class Limit:
    """The most bytes a route's request body may have, and the refusal's wording."""

    max_bytes: int
    field: str
    message: Callable[[int | None], str]  # given the body's Content-Length, None when it streams in without one


def limit_for(settings: Settings, method: str, path: str, kind: CorpusKind = "text") -> Limit:
    """The limit of a request's body, by its route (and for a corpus upload, the ``kind`` its experiment takes)."""
    if method in ("POST", "PUT") and CORPUS_UPLOAD.fullmatch(path):
        if kind == "images":
            most, what, setting = image_data.max_bytes(settings), "image archives", "SWARMHUB_CORPUS_IMAGES_MAX_MB"
        else:
            most, what, setting = training_data.max_bytes(settings), "training text", "SWARMHUB_CORPUS_MAX_MB"
        limit = corpus_upload.size_text(most)

        def upload(size: int | None) -> str:  # sizes as the upload route states them (binary units)
            actual = corpus_upload.size_text(size) if size is not None else f"over {limit}"
            return f"the upload is {actual}; this server takes {what} up to {limit} ({setting})"

        return Limit(most + UPLOAD_OVERHEAD, "file", upload)
    if path == UPLOAD_PROBE:
        return Limit(
            MAX_PROBE_BYTES, "body", lambda _: f"an upload probe is at most {corpus_upload.size_text(MAX_PROBE_BYTES)}"
        )
    max_bytes = int(settings.body_max_mb * 2**20)
    return Limit(
        max_bytes, "body", lambda _: f"request body over {corpus_upload.size_text(max_bytes)} (SWARMHUB_BODY_MAX_MB)"
    )


async def _corpus_kind(scope: Scope) -> CorpusKind:
    """For a corpus upload, what its experiment's task trains on (an image archive may be larger than a text)."""
    match = CORPUS_UPLOAD.fullmatch(scope["path"])
    if scope["method"] not in ("POST", "PUT") or match is None or "app" not in scope:
        return "text"
    sessionmaker = services(scope["app"]).sessionmaker

    def look_up() -> CorpusKind:
        with sessionmaker() as session:
            return image_data.kind_of(session, match.group("slug"))

    return await run_in_threadpool(look_up)


class _Over(Exception):
    """Raised into the app when the body it reads passes the limit; the middleware answers 413 instead."""


class BodyLimit:
    """ASGI middleware: 413 for a request body over its route's limit, before any route reads it."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = limit_for(self.settings, scope["method"], scope["path"], await _corpus_kind(scope))
        length = Headers(scope=scope).get("content-length", "")
        if length.isdigit() and int(length) > limit.max_bytes:
            await self._refuse(scope, send, TooLarge(limit.message(int(length)), field=limit.field))
            return

        received = 0
        over = False
        started = False

        async def counted() -> Message:
            nonlocal received, over
            if over:
                raise _Over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit.max_bytes:
                    over = True
                    raise _Over
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            if over and not started:
                return  # the app's answer to a body it could not read (FastAPI makes it a 400): ours replaces it
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except Exception:
            if not over or started:
                raise
        if over and not started:
            await self._refuse(scope, send, TooLarge(limit.message(None), field=limit.field))

    @staticmethod
    async def _refuse(scope: Scope, send: Send, error: TooLarge) -> None:
        """The app's own rendering of the error (JSON under /api, the error page elsewhere), and the connection
        closed: the rest of the body is not read."""
        handler = getattr(scope.get("app"), "exception_handlers", {}).get(AppError)
        response: Response
        if handler is not None:
            response = await handler(Request(scope), error)
        else:
            response = JSONResponse(error.body(), status_code=error.status_code)
        response.headers["connection"] = "close"

        async def nothing() -> Message:
            return {"type": "http.disconnect"}

        await response(scope, nothing, send)
