"""A volunteer joins a running experiment: the use case behind ``POST /api/experiments/{slug}/join``.

In order: the experiment must take this volunteer (``membership.check_joinable``), the peer key must be one the
volunteer may use here (``admission.check_peer_key``: RSA of 2048 bits or more, not another volunteer's, within
``max_peers_per_volunteer``), then the swarm's bootstrap peer must be listening (whichever server process holds
the swarm's lease runs it). Only then is anything written: the key admitted with its swarm token, and the worker
run that its reports will go to, stored under the peer ID derived from that key, never one the worker claims.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy.orm import Session

from swarmhub.common.protocol import MIN_WORKER_VERSION, SWARM_PROTOCOL, JoinRequest, JoinResponse
from swarmhub.server.core.errors import Unavailable, UpgradeRequired
from swarmhub.server.experiments.admission import check_peer_key, experiment_public_key, swarm_token
from swarmhub.server.experiments.lifecycle import needs_corpus, run_id
from swarmhub.server.experiments.membership import check_joinable, start_worker_run
from swarmhub.server.experiments.schemas import to_config
from swarmhub.server.models import Experiment, User
from swarmhub.server.swarm import leases


def join(
    session: Session,
    experiment: Experiment,
    user: User,
    request: JoinRequest,
    *,
    device: str,
    swarm_enabled: bool,
    token_minutes: float,
    bootstrap_addresses: Callable[[str], list[str]],
) -> JoinResponse:
    """The worker's configuration and a swarm token for its peer key. ``bootstrap_addresses(run_id)`` waits (a
    few seconds at most) for the addresses the swarm's bootstrap peer listens on, [] when it is not up yet (a 503
    with Retry-After: nothing is written then)."""
    check_joinable(session, experiment, user)
    check_worker_version(request.client_version)
    key = check_peer_key(session, experiment, user, request.peer_public_key)  # before any waiting
    if not swarm_enabled:
        raise Unavailable("this server runs no swarm peers (SWARMHUB_SWARM_ENABLED=false)")
    run = run_id(experiment)
    # No transaction is held while waiting: authentication may have written (a token's last use), and on SQLite
    # an open write would lock every other request's writes (a sign-up failed so) for up to 10 s.
    session.commit()
    maddrs = bootstrap_addresses(run)
    if not maddrs:
        raise Unavailable("the experiment's swarm is starting: try again shortly", headers={"Retry-After": "3"})
    token = swarm_token(  # admits the key: this request's first write
        session, experiment, user, request.peer_public_key, timedelta(minutes=token_minutes)
    )
    worker = start_worker_run(
        session,
        experiment,
        user,
        device,
        peer_id=key.peer_id,
        precision=request.precision.value if request.precision else None,
        client_mode=request.client_mode,
        role=request.role.value if request.role else None,
        bandwidth_mbps=request.bandwidth_mbps,
    )
    return JoinResponse(
        experiment=to_config(experiment),
        run_id=run,
        initial_peers=maddrs,
        worker_id=worker.id,
        username=user.username,
        report_path=f"/ws/experiments/{experiment.slug}/report",
        swarm_token=token,
        token_path=f"/api/experiments/{experiment.slug}/swarm-token",
        experiment_public_key=experiment_public_key(experiment),
        server_time=time.time(),
        data_path=f"/api/experiments/{experiment.slug}/data" if needs_corpus(experiment) else None,
        swarm_protocol=SWARM_PROTOCOL,
        witness_peers=witness_peers(session, run),
    )


def witness_peers(session: Session, run_id: str) -> list[str]:
    """The peer IDs of the server's witnesses that are in the swarm now, as the lease holder last published."""
    lease = leases.current(session, run_id)
    found = []
    for item in (lease.server_peers or []) if lease is not None else []:
        if isinstance(item, dict) and item.get("kind") == "witness" and item.get("in_swarm"):
            peer_id = item.get("peer_id")
            if isinstance(peer_id, str) and 0 < len(peer_id) <= 64:
                found.append(peer_id)
    return found


def _version(text: str) -> tuple[int, ...] | None:
    """The release numbers of a version string ("0.2.0", "0.2.0rc1" -> (0, 2, 0)); None if it starts with none."""
    found = re.match(r"\d+(?:\.\d+)*", text.strip())
    return tuple(int(number) for number in found.group().split(".")) if found else None


_MIN_VERSION = tuple(int(number) for number in MIN_WORKER_VERSION.split("."))


def check_worker_version(client_version: str) -> None:
    """Refuse (426) a swarmhub worker too old to speak the swarm's protocol: its peer could not talk to any other.
    A client that names no version (a script of the API's own) is not a worker of ours, and is let through."""
    _refuse_if_too_old(client_version, "join", "client_version")


def _refuse_if_too_old(client_version: str, what: str, field: str) -> None:
    version = _version(client_version)
    if version is not None and version < _MIN_VERSION:
        raise UpgradeRequired(
            f"swarmhub {client_version} cannot {what} this swarm (its peers need {MIN_WORKER_VERSION} or later): "
            "upgrade with `swarmhub upgrade` (it installs the worker this hub serves, GET /api/worker), "
            "then join again",
            field=field,
        )


WORKER_AGENT = "swarmhub-worker/"  # the User-Agent every `swarmhub` command sends: swarmhub-worker/VERSION


def check_running_worker(user_agent: str | None) -> None:
    """Refuse (426) a swarmhub worker too old for the swarm what it asks while it trains (its swarm-token renewals and
    deny-list polls): one that joined before the hub was upgraded to a newer protocol would otherwise stay in the
    swarm, and every round it joined would fail for its whole group. These requests name no version of their own;
    every worker's client has sent it in its User-Agent (``swarmhub-worker/VERSION``) since 0.1.0. A client that
    sends another (a script of the API's own) is let through, as at join."""
    if not user_agent or not user_agent.startswith(WORKER_AGENT):
        return
    _refuse_if_too_old(user_agent[len(WORKER_AGENT) :].split(" ", 1)[0][:32], "stay in", "User-Agent")
