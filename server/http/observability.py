"""Prometheus metrics at ``GET /metrics``: requests, websocket connections, ingested metric messages and the
swarm peers of every running experiment. Each app has its own registry (tests run several apps at once).

Set ``SWARMHUB_METRICS_TOKEN`` to require ``Authorization: Bearer <token>`` for the scrape.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from swarmhub.server.core.errors import NotAuthenticated
from swarmhub.server.services import services

if TYPE_CHECKING:
    from swarmhub.server.swarm.host import SwarmHost


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "swarmhub_http_requests",
            "HTTP requests served, by method, route template and status",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "swarmhub_http_request_seconds",
            "HTTP request latency, by route template",
            ["route"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.websockets = Gauge(
            "swarmhub_websocket_connections",
            "Open websocket connections, by channel (report: workers, live: dashboards)",
            ["channel"],
            registry=self.registry,
        )
        self.ingested = Counter(
            "swarmhub_metric_messages_ingested",
            "Metric messages from workers, by outcome (stored, duplicate)",
            ["outcome"],
            registry=self.registry,
        )


class _SwarmCollector(Collector):
    """Peers each experiment's monitor sees in its swarm, and the state of the server's own peer processes, read
    when scraped."""

    def __init__(self, swarm: SwarmHost):
        self.swarm = swarm

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "swarmhub_swarm_peers",
            "Peers in each running experiment's swarm, as its monitor peer sees them",
            labels=["run_id"],
        )
        for run_id, peers in self.swarm.peer_counts().items():
            family.add_metric([run_id], peers)
        yield family
        up = GaugeMetricFamily(
            "swarmhub_server_peer_up",
            "1 while the server's peer process (kind: monitor, witness, checkpoints; index: which witness) of a run is "
            "running, 0 while it waits to be restarted",
            labels=["run_id", "kind", "index"],
        )
        restarts = GaugeMetricFamily(
            "swarmhub_server_peer_restarts",
            "How many times the server's peer process of a run was started again",
            labels=["run_id", "kind", "index"],
        )
        for run_id, states in self.swarm.supervisor.all_states().items():
            for state in states:
                labels = [run_id, state.kind, str(state.index)]
                up.add_metric(labels, 1.0 if state.state == "running" else 0.0)
                restarts.add_metric(labels, float(state.restarts))
        yield up
        yield restarts


class RequestMetrics:
    """ASGI middleware: counts HTTP requests by the route template (never the raw path: bounded labels)."""

    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = {"code": 500}
        started = time.perf_counter()

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or ("static" if scope["path"].startswith("/static") else "other")
            self.metrics.requests.labels(scope["method"], template, str(status["code"])).inc()
            self.metrics.latency.labels(template).observe(time.perf_counter() - started)


def check_metrics_token(request: Request, token: str | None) -> None:
    """What operators' endpoints (``/metrics``, ``/healthz?detail=1``) ask for where the operator set a token."""
    if token:
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), token.encode()):
            raise NotAuthenticated("this server's metrics need its metrics token")


def install(app: FastAPI, token: str | None, swarm: SwarmHost) -> Metrics:
    """The request counters and ``GET /metrics`` (behind ``token`` when one is set); returns the registry's
    metrics, kept in the app's services."""
    metrics = Metrics()
    metrics.registry.register(_SwarmCollector(swarm))
    app.add_middleware(RequestMetrics, metrics=metrics)
    app.add_middleware(SecurityHeaders)

    @app.get("/metrics", tags=["ops"], include_in_schema=False)
    def prometheus(request: Request) -> Response:
        check_metrics_token(request, token)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return metrics


def count_websocket(app: Any, channel: str, delta: int) -> None:
    services(app).metrics.websockets.labels(channel).inc(delta)


CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self' ws: wss:; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),  # no inline script or style: pages load only our own files
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
]


class SecurityHeaders:
    """ASGI middleware: a Content-Security-Policy without inline scripts, and the usual hardening headers."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                message["headers"] = [
                    *message.get("headers", []),
                    *[(name, value) for name, value in SECURITY_HEADERS if name not in present],
                ]
            await send(message)

        await self.app(scope, receive, send_wrapper)
