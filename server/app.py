"""``create_app(settings)``: the FastAPI application, its lifespan and its error renderer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from importlib.resources import files
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from swarmhub import __version__
from swarmhub.server import teams as team_service
from swarmhub.server.community import exports
from swarmhub.server.community import volunteers as volunteer_service
from swarmhub.server.community.overview import HubCache
from swarmhub.server.core import proxies, security
from swarmhub.server.core.db import make_engine, make_sessionmaker, migrate
from swarmhub.server.core.errors import AppError
from swarmhub.server.core.settings import Settings
from swarmhub.server.http import body_limit, observability
from swarmhub.server.http.deps import LoginRequired
from swarmhub.server.http.ratelimit import make_limiter
from swarmhub.server.http.views import render_error
from swarmhub.server.http.worker_package import WorkerPackages
from swarmhub.server.live.channels import LiveHub, LiveSeats
from swarmhub.server.routes import api, data, hub, pages, probe, tasks, teams, volunteers, ws
from swarmhub.server.services import Services
from swarmhub.server.swarm.coordinator import SwarmCoordinator
from swarmhub.server.swarm.host import SwarmHost
from swarmhub.server.swarm.leases import AddressWatch

logger = logging.getLogger("swarmhub.server")


def _wants_json(request: Request) -> bool:
    return request.url.path.startswith("/api") or request.url.path in ("/healthz",)


def _validation_errors(exc: RequestValidationError) -> list[dict[str, object]]:
    # pydantic puts the raised exception object in ctx; keep only JSON-safe fields
    return [
        {
            "loc": list(err.get("loc", ())),
            "msg": str(err.get("msg", "")).removeprefix("Value error, "),
            "type": err.get("type", ""),
        }
        for err in exc.errors()
    ]


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(AppError)
    async def app_error(request: Request, exc: AppError) -> Response:
        if isinstance(exc, LoginRequired) and not _wants_json(request):
            return RedirectResponse(f"/login?next={exc.next_path}", status_code=303)
        if _wants_json(request):
            return JSONResponse(exc.body(), status_code=exc.status_code, headers=exc.headers)
        return render_error(request, exc.status_code, exc.message)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        if _wants_json(request):
            return JSONResponse({"detail": jsonable_encoder(_validation_errors(exc))}, status_code=422)
        return render_error(request, 422, "; ".join(str(e["msg"]) for e in _validation_errors(exc)))

    @app.exception_handler(ValidationError)
    async def service_validation_error(request: Request, exc: ValidationError) -> Response:
        """A service validated merged data (an edit): the same 422 as a body that fails validation."""
        return await validation_error(
            request, RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in exc.errors()])
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if _wants_json(request):
            return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)
        return render_error(request, exc.status_code, str(exc.detail))


def create_app(settings: Settings | None = None) -> FastAPI:
    """The composition root: every service of one server process, built once and kept as ``services(app)``."""
    settings = settings or Settings()
    security.use_password_hashing(settings.password_hashing)
    engine = make_engine(settings.database_url)
    sessions = make_sessionmaker(engine)
    swarm = SwarmHost(
        settings.data_dir,
        settings.swarm_host,
        enabled=settings.swarm_enabled,
        token_minutes=settings.swarm_token_minutes,
        ports=settings.swarm_port_range,
        announce_host=settings.swarm_announce_host,
    )
    live = LiveHub(settings.live_interval_seconds, settings.redis_url, settings.redis_channel)
    coordinator = SwarmCoordinator(settings, sessions, swarm, live)
    packages = WorkerPackages(settings.worker_wheel_dir)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(migrate, engine)
        packages.start()  # found or built in the background: the pages show the install command once it is ready
        tasks = [
            asyncio.create_task(coordinator.run()),
            asyncio.create_task(live.run(lambda slug: ws.live_snapshot(app, slug))),
        ]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await coordinator.close()
            engine.dispose()

    app = FastAPI(title="swarmhub", version=__version__, lifespan=lifespan)
    _install_error_handlers(app)
    app.add_middleware(body_limit.BodyLimit, settings=settings)  # inside the metrics: 413s are counted
    app.add_middleware(proxies.TrustedProxies, networks=proxies.parse_networks(settings.trusted_proxies))
    metrics = observability.install(app, settings.metrics_token or None, swarm)
    app.state.services = Services(
        settings=settings,
        engine=engine,
        sessionmaker=sessions,
        swarm=swarm,
        coordinator=coordinator,
        ratelimiter=make_limiter(settings),
        live=live,
        live_seats=LiveSeats(settings.live_max_per_address, settings.live_max_per_experiment),
        metrics=metrics,
        volunteer_stats=exports.Dump(settings.stats_cache_seconds, volunteer_service.stats_bodies),
        team_stats=exports.Dump(settings.stats_cache_seconds, team_service.stats_bodies),
        hub=HubCache(settings.active_window_seconds, settings.stats_cache_seconds),
        addresses=AddressWatch(sessions),
        worker_package=packages,
    )

    web = Path(str(files("swarmhub.web")))
    app.mount("/static", StaticFiles(directory=web / "static"), name="static")
    vendor = web / "node_modules" / "uplot" / "dist"
    if vendor.is_dir():
        app.mount("/vendor/uplot", StaticFiles(directory=vendor), name="uplot")
    else:
        logger.warning("uPlot is not installed (run `make setup` or `npm ci --prefix web`): charts are off")
    app.include_router(api.router)
    app.include_router(tasks.router)
    app.include_router(data.router)
    app.include_router(probe.router)
    app.include_router(volunteers.router)
    app.include_router(teams.router)
    app.include_router(hub.router)
    app.include_router(ws.router)
    app.include_router(pages.router)

    @app.get("/healthz", tags=["ops"])
    def healthz(request: Request, detail: bool = False) -> dict[str, Any]:
        """``ok`` when the database answers. ``?detail=1`` adds, for operators, the state of the peer processes this
        server process runs for each experiment (``swarm.supervision.PeerState``); ``degraded`` names each one that is
        not running (the answer stays 200: the web side is healthy, and a restart of the process would not help).
        The detail needs the metrics token where one is set, as ``/metrics`` does."""
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        if not detail:
            return {"status": "ok"}
        observability.check_metrics_token(request, settings.metrics_token or None)
        hosted = swarm.supervisor.all_states().items()
        peers = {run_id: [s.model_dump(mode="json") for s in states] for run_id, states in hosted}
        down = [f"{run_id}/{s['kind']}" for run_id, states in peers.items() for s in states if s["state"] != "running"]
        return {"status": "degraded" if down else "ok", "not_running": down, "server_peers": peers}

    return app
