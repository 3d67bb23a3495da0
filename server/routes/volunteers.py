"""JSON about volunteers: a volunteer's profile, and the open statistics export of every visible volunteer
(``/api/stats/volunteers.json`` and ``.csv``), which anyone may fetch, cache and mirror."""

from __future__ import annotations

import gzip
import hashlib
import threading
import time
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request, Response
from sqlalchemy.orm import Session

from .. import volunteers
from ..deps import DB
from ..errors import documented

router = APIRouter(prefix="/api", tags=["volunteers"])

CACHE_CONTROL = "public, max-age=300"
_EXPORT_HEADERS: dict[str, Any] = {
    "ETag": {"description": "Changes with the content; send it back as If-None-Match for a 304"},
    "Cache-Control": {"description": CACHE_CONTROL},
}
_NOT_MODIFIED: dict[int | str, dict[str, Any]] = {
    304: {"description": "Not modified: the If-None-Match ETag is current"}
}


@router.get("/users/{username}", response_model=volunteers.VolunteerProfile, responses=documented(404))
def user_profile(username: str, session: DB) -> volunteers.VolunteerProfile:
    """A volunteer's public profile: the experiments they helped, with their verified samples and share of each,
    time online, device classes, and their verified samples over time. 404 for a name no one has and for a hidden
    profile alike."""
    return volunteers.profile(session, username)


@dataclass(frozen=True)
class Body:
    content: bytes
    gzipped: bytes
    etag: str  # of the content, quoted; the gzipped body's is this with "-gzip" inside the quotes
    media_type: str

    @staticmethod
    def of(content: bytes, media_type: str) -> Body:
        digest = hashlib.sha256(content).hexdigest()[:32]
        return Body(content, gzip.compress(content, mtime=0), f'"{digest}"', media_type)


class StatsExport:
    """The export's bodies (JSON and CSV, made from one read so that they agree), regenerated at most every
    ``seconds`` seconds. The copy is per server process: processes behind one balancer may serve copies up to
    ``seconds`` apart, each with its own ETag."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._lock = threading.Lock()  # one regeneration at a time; the others wait for it and serve its result
        self._made: float | None = None
        self._bodies: dict[str, Body] = {}

    def get(self, session: Session, kind: str) -> Body:
        with self._lock:
            now = time.monotonic()
            if self._made is None or now - self._made >= self.seconds:
                data = volunteers.stats(session)
                self._bodies = {
                    "json": Body.of(data.model_dump_json().encode(), "application/json"),
                    "csv": Body.of(volunteers.stats_csv(data).encode(), "text/csv; charset=utf-8"),
                }
                self._made = now
            return self._bodies[kind]


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether the client takes gzip (RFC 9110 section 12.5.3: named, or "*", with a q-value above 0)."""
    for part in accept_encoding.lower().split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip() in ("gzip", "x-gzip", "*"):
            q = params.strip()
            try:
                return not q.startswith("q=") or float(q[2:]) > 0
            except ValueError:
                return False
    return False


def _serve(request: Request, body: Body) -> Response:
    gzipped = accepts_gzip(request.headers.get("accept-encoding", ""))
    etag = body.etag[:-1] + '-gzip"' if gzipped else body.etag
    headers = {"Cache-Control": CACHE_CONTROL, "ETag": etag, "Vary": "Accept-Encoding"}
    asked = {tag.strip().removeprefix("W/") for tag in request.headers.get("if-none-match", "").split(",")}
    if asked & {etag, body.etag, "*"}:  # either coding of the same content is current
        return Response(status_code=304, headers=headers)
    if gzipped:
        headers["Content-Encoding"] = "gzip"
        return Response(body.gzipped, media_type=body.media_type, headers=headers)
    return Response(body.content, media_type=body.media_type, headers=headers)


@router.get(
    "/stats/volunteers.json",
    response_class=Response,
    responses={
        200: {"model": volunteers.VolunteerStats, "description": "Every visible volunteer", "headers": _EXPORT_HEADERS},
        **_NOT_MODIFIED,
    },
)
def volunteer_stats_json(request: Request, session: DB) -> Response:
    """Every volunteer with a visible profile: username, verified samples, experiments helped. Gzipped when the
    client accepts it; regenerated at most every few minutes (per server process)."""
    return _serve(request, request.app.state.volunteer_stats.get(session, "json"))


@router.get(
    "/stats/volunteers.csv",
    response_class=Response,
    responses={
        200: {
            "content": {"text/csv": {"schema": {"type": "string"}}},
            "description": "The same rows as the JSON, as CSV: username,verified_samples,experiments",
            "headers": _EXPORT_HEADERS,
        },
        **_NOT_MODIFIED,
    },
)
def volunteer_stats_csv(request: Request, session: DB) -> Response:
    """The JSON export's rows as CSV (RFC 4180, a header row first)."""
    return _serve(request, request.app.state.volunteer_stats.get(session, "csv"))
