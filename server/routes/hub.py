"""The hub's open figures: ``GET /api/hub`` (what the front page shows, and polls), the statistics export
``GET /api/stats/experiments.json`` and ``.csv`` (cacheable by anyone: an ETag, ``Cache-Control: public``, gzip
when the client accepts it), the site's icon at ``/favicon.ico``, and the worker this hub serves volunteers
(``GET /api/worker``, ``/download/swarmhub-X.Y.Z-py3-none-any.whl``). Nothing here depends on who asks."""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, Response

from swarmhub.common.protocol import WorkerInstall
from swarmhub.server.community import exports
from swarmhub.server.community import overview as hub
from swarmhub.server.core.errors import NotFound, Unavailable
from swarmhub.server.http.deps import DB
from swarmhub.server.http.worker_package import install_info
from swarmhub.server.live.snapshots import base_url
from swarmhub.server.services import services

router = APIRouter(tags=["hub"])


@router.get("/api/hub", response_model=hub.HubPublic, responses={304: {"description": "Not modified (ETag)"}})
def hub_figures(request: Request, session: DB) -> Response:
    """Every public experiment's collaboration as it stands, and the hub's totals (what the front page shows). At
    most a couple of seconds old; encoded once per rebuild, with an ETag (304 when it did not change) and gzip
    when accepted. ``Cache-Control: no-cache``: a client asks again each time, and the ETag keeps that cheap."""
    return exports.serve(request, services(request.app).hub.hub_body(session), cache_control="no-cache")


@router.get("/api/stats/experiments.json", response_model=list[hub.ExperimentStats], responses=exports.RESPONSES)
def stats_json(request: Request, session: DB) -> Response:
    """One row per public experiment. Rebuilt at most every ``SWARMHUB_STATS_CACHE_SECONDS`` per server
    process; gzipped when the client accepts it."""
    return exports.serve(request, services(request.app).hub.export(session).json)


@router.get(
    "/api/stats/experiments.csv",
    response_class=Response,
    responses=exports.csv_responses("a header line, then one line per public experiment"),
)
def stats_csv(request: Request, session: DB) -> Response:
    """The same rows as ``experiments.json``, as CSV (RFC 4180, UTF-8, a header line). A text cell that a
    spreadsheet would run as a formula (it starts with ``=``, ``+``, ``-``, ``@``) is prefixed with ``'``."""
    return exports.serve(request, services(request.app).hub.export(session).csv)


@cache
def _favicon() -> bytes:
    return (files("swarmhub.web") / "static" / "favicon.ico").read_bytes()


@router.get("/favicon.ico", include_in_schema=False)
def favicon() -> Response:
    """Browsers and feed readers ask for it whatever the page links; pages link ``/static/favicon.svg``."""
    return Response(_favicon(), media_type="image/x-icon", headers={"Cache-Control": "public, max-age=86400"})


def worker_install(request: Request) -> WorkerInstall:
    return install_info(services(request.app).worker_package, base_url(request, services(request.app).settings))


@router.get("/api/worker", response_model=WorkerInstall)
def worker(request: Request) -> WorkerInstall:
    """The worker this hub serves volunteers: its wheel, the wheel's SHA-256 and the pip command pinned to both."""
    return worker_install(request)


@router.get(
    "/download/{filename}",
    response_class=FileResponse,
    responses={
        200: {"content": {"application/octet-stream": {}}},
        404: {
            "description": "Not this hub's worker (an HTML page, as every path outside /api)",
            "content": {"text/html": {}},
        },
        503: {"description": "Still being prepared: try again in a minute", "content": {"text/html": {}}},
    },
)
def download(filename: str, request: Request) -> Response:
    """The worker's wheel (``GET /api/worker`` names it). 503 while the server still prepares it."""
    packages = services(request.app).worker_package
    package = packages.current()
    if package is None:
        if packages.problem is None:
            raise Unavailable("the worker package is being prepared: try again in a minute")
        raise NotFound(f"this hub serves no worker package: {packages.problem}")
    if filename != package.filename:
        raise NotFound(f"no such file: this hub serves {package.filename}")
    return FileResponse(
        package.path,
        media_type="application/octet-stream",
        filename=package.filename,
        headers={"Cache-Control": "public, max-age=3600"},
    )
