"""The hub's open figures: ``GET /api/hub`` (what the front page shows, and polls), the statistics export
``GET /api/stats/experiments.json`` and ``.csv`` (cacheable by anyone: an ETag, ``Cache-Control: public``, gzip
when the client accepts it), and the site's icon at ``/favicon.ico``. Nothing here depends on who asks."""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from fastapi import APIRouter, Request
from fastapi.responses import Response

from .. import hub
from ..deps import DB

router = APIRouter(tags=["hub"])

STATS_MAX_AGE = 300
STATS_HEADERS = {"Cache-Control": f"public, max-age={STATS_MAX_AGE}", "Vary": "Accept-Encoding"}
STATS_RESPONSES: dict[int | str, dict[str, object]] = {
    200: {
        "headers": {
            "ETag": {"description": "Send it back as If-None-Match: 304 while the export is unchanged"},
            "Cache-Control": {"description": f"public, max-age={STATS_MAX_AGE}"},
        }
    },
    304: {"description": "Not modified: the If-None-Match tag is the export's"},
}


CSV_SCHEMA = {"type": "string", "description": "a header line, then one line per public experiment"}


class CSVResponse(Response):
    media_type = "text/csv"


class EncodedJSON(Response):
    """JSON encoded once, when the export was built."""

    media_type = "application/json"


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


def _matches(if_none_match: str | None, etag: str) -> bool:
    if if_none_match is None:
        return False
    tags = [tag.strip().removeprefix("W/") for tag in if_none_match.split(",")]
    return "*" in tags or etag in tags


def _send(request: Request, encoded: hub.Encoded, response_class: type[Response]) -> Response:
    gzipped = accepts_gzip(request.headers.get("accept-encoding", ""))
    etag = encoded.gzip_etag if gzipped else encoded.etag  # each representation has its own tag
    headers = {**STATS_HEADERS, "ETag": etag}
    if _matches(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers=headers)
    if gzipped:
        return response_class(encoded.gzipped, headers={**headers, "Content-Encoding": "gzip"})
    return response_class(encoded.body, headers=headers)


@router.get("/api/hub", response_model=hub.HubPublic)
def hub_figures(request: Request, session: DB) -> hub.HubPublic:
    """Every public experiment's collaboration as it stands, and the hub's totals (what the front page shows). At
    most a couple of seconds old."""
    cached: hub.HubPublic = request.app.state.hub.hub(session)
    return cached


@router.get("/api/stats/experiments.json", response_model=list[hub.ExperimentStats], responses=STATS_RESPONSES)
def stats_json(request: Request, session: DB) -> Response:
    """One row per public experiment. Rebuilt at most every ``SWARMHUB_STATS_CACHE_SECONDS`` per server
    process; gzipped when the client accepts it."""
    return _send(request, request.app.state.hub.export(session).json, EncodedJSON)


@router.get(
    "/api/stats/experiments.csv",
    response_class=CSVResponse,
    responses={**STATS_RESPONSES, 200: {**STATS_RESPONSES[200], "content": {"text/csv": {"schema": CSV_SCHEMA}}}},
)
def stats_csv(request: Request, session: DB) -> Response:
    """The same rows as ``experiments.json``, as CSV (RFC 4180, UTF-8, a header line). A text cell that a
    spreadsheet would run as a formula (it starts with ``=``, ``+``, ``-``, ``@``) is prefixed with ``'``."""
    return _send(request, request.app.state.hub.export(session).csv, CSVResponse)


@cache
def _favicon() -> bytes:
    return (files("swarmhub.web") / "static" / "favicon.ico").read_bytes()


@router.get("/favicon.ico", include_in_schema=False)
def favicon() -> Response:
    """Browsers and feed readers ask for it whatever the page links; pages link ``/static/favicon.svg``."""
    return Response(_favicon(), media_type="image/x-icon", headers={"Cache-Control": "public, max-age=86400"})
