"""``create_app(settings)``: the FastAPI application, its lifespan and its error renderer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
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
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import (
    body_limit,
    contributions,
    experiments,
    exports,
    leases,
    observability,
    proxies,
    rollback,
    training_data,
    witnessed,
)
from . import teams as team_service
from . import volunteers as volunteer_service
from .db import make_engine, make_sessionmaker, migrate
from .deps import LoginRequired
from .errors import AppError
from .hub import HubCache
from .live import LiveHub
from .models import Corpus, Experiment, utcnow
from .ratelimit import make_limiter
from .routes import api, data, hub, pages, probe, teams, volunteers, ws
from .settings import Settings
from .swarm import SwarmHost
from .swarm import events as peer_events
from .views import render_error

logger = logging.getLogger("swarmhub.server")
RECONCILE_SECONDS = 5.0


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
    settings = settings or Settings()
    engine = make_engine(settings.database_url)
    swarm = SwarmHost(
        settings.data_dir,
        settings.swarm_host,
        enabled=settings.swarm_enabled,
        token_minutes=settings.swarm_token_minutes,
        ports=settings.swarm_port_range,
        announce_host=settings.swarm_announce_host,
    )
    live = LiveHub(settings.live_interval_seconds, settings.redis_url, settings.redis_channel)
    wake = asyncio.Event()
    app: FastAPI  # made below; the closures here run once it exists

    instance = uuid.uuid4().hex  # this process, as the holder of swarm leases

    def leased_run_ids() -> dict[str, tuple[str, list[str], dict[str, Any] | None, dict[str, Any] | None]]:
        """The running experiments whose swarm this process hosts: it renews or takes their leases."""
        with app.state.sessionmaker.begin() as session:
            running = {experiments.run_id(e): e for e in experiments.running(session)}
            held = {run_id for run_id in running if leases.acquire(session, run_id, instance)}
            leases.release(session, [run_id for run_id in swarm.hosted() if run_id not in running], instance)
            return {
                run_id: (
                    e.signing_key,
                    experiments.banned_usernames(session, e),
                    experiments.to_config(e).model_dump(mode="json") if e.aux_peer else None,
                    keeper_config(session, e),
                )
                for run_id, e in running.items()
                if run_id in held
            }

    def keeper_config(session: Session, experiment: Experiment) -> dict[str, Any] | None:
        """What the checkpoint peer needs, for a task that keeps checkpoints."""
        if not experiments.keeps_checkpoints(experiment):
            return None
        corpus = session.get(Corpus, experiment.id)
        return {
            "experiment": experiments.to_config(experiment).model_dump(mode="json"),
            "corpus": str(training_data.corpus_folder(settings, corpus)) if corpus is not None else None,
            "interval_seconds": experiment.checkpoint_minutes * 60,
            "restore": rollback.restore_order(experiment),  # written to the peer's restore file at every reconcile
        }

    def record_checkpoint(run_id: str, event: peer_events.Checkpoint) -> None:
        """The checkpoint peer saved the swarm's model: list it (and prune the oldest files)."""
        with app.state.sessionmaker.begin() as session:
            experiment = experiments.by_run_id(session, run_id)
            if experiment is None:
                return
            training_data.record_checkpoint(
                session, settings, experiment, event.epoch, event.eval_loss, event.folder, event.restored_from
            )
            slug = experiment.slug
        loop = app.state.loop
        if loop is not None:
            loop.call_soon_threadsafe(live.mark, slug)

    def publish_hosted() -> None:
        """Tell the other processes (and joins anywhere) where this process's bootstrap peers listen."""
        with app.state.sessionmaker.begin() as session:
            for run_id in swarm.hosted():
                # Not before the checkpoint peer is in: the first volunteer would otherwise start from scratch.
                maddrs = swarm.maddrs(run_id) if not swarm.keeper_pending(run_id) else []
                if maddrs:
                    leases.publish(session, run_id, instance, maddrs, swarm.swarm_peers(run_id))

    def record_progress(run_id: str, event: peer_events.Progress) -> None:
        """The monitor peer read the swarm's signed progress records and what the server's witness published: add
        them to the ledger (and remove a volunteer whose flags reached the organizer's limit)."""
        contributors = contributions.parse(event.contributors)
        rounds = witnessed.parse_rounds(event.rounds)
        flags = witnessed.parse_flags(event.flags)
        if not contributors and not rounds and not flags:
            return
        with app.state.sessionmaker.begin() as session:
            experiment = experiments.by_run_id(session, run_id)
            if experiment is None:
                return
            now = utcnow()
            if contributors:
                contributions.record(session, experiment, contributors, now)
            witnessed.record_rounds(session, experiment, rounds, now)
            removed = witnessed.record_flags(session, experiment, flags, now)
            slug = experiment.slug
        if removed:
            app.state.reconcile_soon()  # the swarm's deny-list, at once
        loop = app.state.loop
        if loop is not None:
            loop.call_soon_threadsafe(live.mark, slug)

    swarm.on_progress = record_progress
    swarm.on_checkpoint = record_checkpoint
    swarm.on_ready = lambda run_id: app.state.reconcile_soon()  # publish its addresses without waiting

    async def reconcile_forever() -> None:
        while True:
            try:
                if swarm.enabled:
                    ids = await run_in_threadpool(leased_run_ids)
                    await run_in_threadpool(swarm.reconcile, ids)
                    await run_in_threadpool(publish_hosted)
            except Exception:
                logger.exception("swarm reconcile failed")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(wake.wait(), RECONCILE_SECONDS)
            wake.clear()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(migrate, engine)
        loop = asyncio.get_running_loop()
        app.state.loop = loop
        app.state.reconcile_soon = lambda: loop.call_soon_threadsafe(wake.set)
        tasks = [
            asyncio.create_task(reconcile_forever()),
            asyncio.create_task(live.run(lambda slug: ws.live_snapshot(app, slug))),
        ]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            hosted = swarm.hosted()
            await run_in_threadpool(swarm.close)
            with contextlib.suppress(Exception):  # hand the swarms over at once rather than at lease expiry

                def release() -> None:
                    with app.state.sessionmaker.begin() as session:
                        leases.release(session, hosted, instance)

                await run_in_threadpool(release)
            engine.dispose()

    app = FastAPI(title="swarmhub", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessionmaker = make_sessionmaker(engine)
    app.state.swarm = swarm
    app.state.instance = instance
    app.state.ratelimiter = make_limiter(settings)
    app.state.live = live
    # the open statistics exports, kept per process
    app.state.volunteer_stats = exports.Dump(settings.stats_cache_seconds, volunteer_service.stats_bodies)
    app.state.team_stats = exports.Dump(settings.stats_cache_seconds, team_service.stats_bodies)
    app.state.hub = HubCache(settings.active_window_seconds, settings.stats_cache_seconds)
    app.state.reconcile_soon = lambda: None  # replaced once the event loop runs
    app.state.loop = None
    _install_error_handlers(app)
    app.add_middleware(body_limit.BodyLimit, settings=settings)  # inside the metrics: 413s are counted
    app.add_middleware(proxies.TrustedProxies, networks=proxies.parse_networks(settings.trusted_proxies))
    observability.install(app, settings.metrics_token or None)

    web = Path(str(files("swarmhub.web")))
    app.mount("/static", StaticFiles(directory=web / "static"), name="static")
    vendor = web / "node_modules" / "uplot" / "dist"
    if vendor.is_dir():
        app.mount("/vendor/uplot", StaticFiles(directory=vendor), name="uplot")
    else:
        logger.warning("uPlot is not installed (run `make setup` or `npm ci --prefix web`): charts are off")
    app.include_router(api.router)
    app.include_router(data.router)
    app.include_router(probe.router)
    app.include_router(volunteers.router)
    app.include_router(teams.router)
    app.include_router(hub.router)
    app.include_router(ws.router)
    app.include_router(pages.router)

    @app.get("/healthz", tags=["ops"])
    def healthz() -> dict[str, str]:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        return {"status": "ok"}

    return app
