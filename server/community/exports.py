"""The open statistics exports' common parts (``/api/stats/...``): CSV that spreadsheets cannot run, bodies
encoded once (plain and gzipped, each with its ETag), a per-process copy rebuilt at most so often, and the
response that serves one of them to a client (gzip when it accepts it, 304 for a current ``If-None-Match``)."""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import Request, Response
from sqlalchemy.orm import Session

MAX_AGE = 300  # what the responses tell caches
CACHE_CONTROL = f"public, max-age={MAX_AGE}"
JSON = "application/json"
CSV = "text/csv; charset=utf-8"

# OpenAPI: what every export route answers besides its body
RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "headers": {
            "ETag": {"description": "Changes with the content; send it back as If-None-Match for a 304"},
            "Cache-Control": {"description": CACHE_CONTROL},
        }
    },
    304: {"description": "Not modified: the If-None-Match ETag is current"},
}


def csv_responses(description: str) -> dict[int | str, dict[str, Any]]:
    """``RESPONSES`` for a CSV route whose body is ``description``."""
    ok = {**RESPONSES[200], "content": {"text/csv": {"schema": {"type": "string"}}}, "description": description}
    return {**RESPONSES, 200: ok}


# Spreadsheets run a cell that starts with one of these as a formula (OWASP "CSV injection")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value


def csv_text(fields: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """RFC 4180 CSV: a header line of ``fields``, then ``rows``; a text cell a spreadsheet would run as a formula
    is prefixed with ``'``."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(fields)
    for row in rows:
        writer.writerow([_cell(value) for value in row])
    return out.getvalue()


@dataclass(frozen=True)
class Encoded:
    """One body, plain and gzipped, each with its ETag."""

    body: bytes
    gzipped: bytes
    etag: str
    gzip_etag: str
    media_type: str

    @classmethod
    def of(cls, body: bytes, media_type: str) -> Encoded:
        digest = hashlib.sha256(body).hexdigest()[:32]
        # mtime=0: the same body always compresses to the same bytes, in every process
        return cls(body, gzip.compress(body, mtime=0), f'"{digest}"', f'"{digest}-gzip"', media_type)


class Kept:
    """A value rebuilt at most once per ``max_age`` seconds, in this process. Once there is one, a caller never
    waits for a rebuild: the first caller past ``max_age`` rebuilds it while the others are served the copy it
    replaces (so a burst of requests, each holding a server thread, does not queue behind one slow rebuild). Only
    the very first build is waited for. Processes behind one balancer may hold copies up to ``max_age`` apart,
    each with its own ETag."""

    def __init__(self, max_age: float):
        self.max_age = max_age
        self._lock = threading.Lock()
        self._value: Any = None
        self._built_at = 0.0

    def get(self, build: Callable[[], Any]) -> Any:
        value = self._value
        if value is not None and time.monotonic() - self._built_at < self.max_age:
            return value
        if value is None:
            self._lock.acquire()  # nothing to serve yet: wait for the one build
        elif not self._lock.acquire(blocking=False):
            return value  # another caller is rebuilding it: the previous copy meanwhile
        try:
            if self._value is None or time.monotonic() - self._built_at >= self.max_age:
                self._value = build()
                self._built_at = time.monotonic()
            return self._value
        finally:
            self._lock.release()


class Dump:
    """An export's two bodies, JSON and CSV, made by ``build(session)`` from one read so that they agree; rebuilt
    at most every ``seconds`` seconds in this process (``SWARMHUB_STATS_CACHE_SECONDS``)."""

    def __init__(self, seconds: float, build: Callable[[Session], tuple[bytes, str]]):
        self._kept = Kept(seconds)
        self._build = build

    def get(self, session: Session, kind: str) -> Encoded:
        """The body of ``kind``: ``json`` or ``csv``."""

        def build() -> dict[str, Encoded]:
            as_json, as_csv = self._build(session)
            return {"json": Encoded.of(as_json, JSON), "csv": Encoded.of(as_csv.encode(), CSV)}

        bodies: dict[str, Encoded] = self._kept.get(build)
        return bodies[kind]


def accepts_gzip(header: str) -> bool:
    """Whether an Accept-Encoding header accepts gzip (RFC 9110 section 12.5.3: ``q=0`` refuses a coding)."""
    weights: dict[str, float] = {}
    for part in header.split(","):
        coding, _, params = part.partition(";")
        weight = 1.0
        for param in params.split(";"):
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    weight = float(value)
                except ValueError:
                    weight = 0.0
        weights[coding.strip().lower()] = weight
    return weights.get("gzip", weights.get("x-gzip", weights.get("*", 0.0))) > 0


def serve(request: Request, encoded: Encoded, cache_control: str = CACHE_CONTROL) -> Response:
    """``encoded`` as the client takes it: gzipped where accepted, and a 304 when ``If-None-Match`` names the tag
    of the representation it would get (the plain and the gzipped body are two, each with its own tag)."""
    gzipped = accepts_gzip(request.headers.get("accept-encoding", ""))
    etag = encoded.gzip_etag if gzipped else encoded.etag  # each representation has its own tag
    headers = {"Cache-Control": cache_control, "ETag": etag, "Vary": "Accept-Encoding"}
    asked = {tag.strip().removeprefix("W/") for tag in request.headers.get("if-none-match", "").split(",")}
    if asked & {etag, "*"}:
        return Response(status_code=304, headers=headers)
    if gzipped:
        return Response(encoded.gzipped, media_type=encoded.media_type, headers={**headers, "Content-Encoding": "gzip"})
    return Response(encoded.body, media_type=encoded.media_type, headers=headers)
