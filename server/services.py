"""What one server process is made of, typed: ``create_app`` builds one :class:`Services` and keeps it on the app;
routes, websockets, middleware and tests reach it as ``services(app)`` (``services(request.app)``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # types only: this module is imported by the routes, which the modules below import
    from sqlalchemy.engine import Engine
    from sqlalchemy.orm import Session, sessionmaker

    from swarmhub.server.community.exports import Dump
    from swarmhub.server.community.overview import HubCache
    from swarmhub.server.core.settings import Settings
    from swarmhub.server.http.observability import Metrics
    from swarmhub.server.http.ratelimit import Limiter
    from swarmhub.server.http.worker_package import WorkerPackages
    from swarmhub.server.live.channels import LiveHub, LiveSeats
    from swarmhub.server.metrics.ingestion import ReportWriter
    from swarmhub.server.swarm.coordinator import SwarmCoordinator
    from swarmhub.server.swarm.host import SwarmHost
    from swarmhub.server.swarm.leases import AddressWatch


@dataclass(eq=False)
class Services:
    settings: Settings
    engine: Engine
    sessionmaker: sessionmaker[Session]
    swarm: SwarmHost  # this process's peer processes
    coordinator: SwarmCoordinator  # leases, reconcile, and what the peers report
    ratelimiter: Limiter
    live: LiveHub  # live dashboard pushes
    live_seats: LiveSeats  # live sockets per address and per experiment
    metrics: Metrics  # Prometheus
    volunteer_stats: Dump  # the open statistics exports, kept per process
    team_stats: Dump
    hub: HubCache  # the front page's figures
    addresses: AddressWatch  # bootstrap addresses that joins wait for
    worker_package: WorkerPackages  # the worker wheel volunteers install from this hub
    reports: ReportWriter | None = None  # the websocket report writer, while the server runs (its lifespan)


def services(app: Any) -> Services:
    """The app's services (``app`` is the FastAPI application, or a request's or websocket's ``.app``)."""
    found: Services = app.state.services
    return found
