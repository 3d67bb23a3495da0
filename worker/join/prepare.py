"""What ``swarmhub join SLUG`` does once its options are read: run the checks that decide how this peer joins (open
files, reachability, bandwidth), join the experiment on the server (telling it the peer's precision, role, client
mode and bandwidth, for the organizer's swarm view) and check the clock against its answer, prepare the swarm-token
and deny-list callbacks, the corpus and the reporter (first sending what an earlier session left unsent), then run
the session.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from swarmhub import __version__
from swarmhub.common.protocol import (
    MAX_BANDWIDTH_MBPS,
    SWARM_PROTOCOL,
    ExperimentStatus,
    JoinRequest,
    JoinResponse,
    PeerRole,
    Precision,
    SwarmToken,
)
from swarmhub.worker.client import USER_AGENT, ApiClient, ExitCode, WorkerError, check_clock, not_accepting
from swarmhub.worker.join.session import run_session
from swarmhub.worker.join.spool import Spool, discard, leftovers
from swarmhub.worker.settings import WorkerSettings

logger = logging.getLogger("swarmhub.worker")


def join_and_train(
    settings: WorkerSettings,
    client: ApiClient,
    token: str,
    slug: str,
    *,
    device: str,
    max_steps: int | None,
    max_minutes: float | None,
    listen: Sequence[str],
    client_mode: bool,
    auxiliary: bool,
    precision: str,
    verbose: bool,
    cpu_threads: int | None = None,
    gpu_memory_fraction: float | None = None,
    progress_file: Path | None = None,
) -> int:
    """Join experiment ``slug`` with ``client`` (not yet opened: closed once joined) and train with its swarm until
    stopped; returns the session's exit code. Raises :class:`WorkerError` for what stops it before the session."""
    from swarmhub.worker.join import doctor
    from swarmhub.worker.join.reporter import Reporter
    from swarmhub.worker.swarm import access as swarm_access
    from swarmhub.worker.training.peer import resolve_device, resolve_precision

    torch_device = resolve_device(device)
    resolved_precision = resolve_precision(precision, torch_device)  # one this device lacks: a usage error, now
    apply_resource_limits(torch_device, cpu_threads, gpu_memory_fraction)
    if auxiliary and client_mode:
        raise WorkerError("An auxiliary peer must accept connections: drop --client-mode", ExitCode.USAGE)
    with client:
        username = client.me().username
        # One key per user and experiment on this machine: the peer ID, the swarm token and the signed
        # progress records all use it, so the peer ID is stable across restarts and its work attributable.
        identity_path = settings.identity_path(client.server_url, username, slug)
        public_key = swarm_access.public_key_text(swarm_access.load_or_create_identity(identity_path))
        doctor.raise_open_files_limit()
        # Fail fast where the join would (an unknown experiment, one not running), before the probes take seconds.
        status = client.experiment(slug).status
        if status != ExperimentStatus.running:
            raise not_accepting(slug, status.value)
        # How this peer joins is decided before the join, which tells the organizer's swarm view about it.
        note = None
        if not client_mode:
            # Can other peers dial us? If not, join in client mode: train and average through reachable peers.
            reach, listen = doctor.check_reachability(client, listen)
            client_mode = reach.status != doctor.OK
            if client_mode and auxiliary:
                raise WorkerError(
                    f"An auxiliary peer must be reachable, and {reach.detail.split(':')[0]}: {reach.fix}",
                    ExitCode.USAGE,
                )
            if client_mode:
                note = f"Note: {reach.detail}."  # once joined: a refused join stays one line
        # The link speed goes to hivemind's load balancing: faster peers reduce a larger part of the vector.
        bandwidth = None if client_mode else doctor.measure_bandwidth(client)
        request = JoinRequest(
            device=torch_device.type,
            client_version=__version__,
            peer_public_key=public_key,
            precision=None if auxiliary else Precision(resolved_precision),  # an auxiliary peer computes no gradients
            client_mode=client_mode,
            role=PeerRole.auxiliary if auxiliary else PeerRole.trainer,
            # a link measured at 0 Mbit/s is one not measured; a loopback measurement may exceed any real link
            bandwidth_mbps=min(bandwidth, MAX_BANDWIDTH_MBPS) if bandwidth else None,
        )
        joined = client.join(
            slug,
            request,
            on_wait=lambda most: click.echo(
                f"The swarm of {slug!r} is starting on the server: waiting for it (up to {most / 60:.0f} minutes)."
            ),
        )
        assert client.last_exchange is not None  # the join's own answer
        check_clock(joined.server_time, *client.last_exchange)
        check_swarm_protocol(client.server_url, joined)
        if note:
            click.echo(note)

    def fetch_token() -> SwarmToken:
        with ApiClient(client.server_url, token, user_agent=USER_AGENT) as refresher:
            return refresher.swarm_token(joined, public_key)

    def denied() -> set[str]:
        with ApiClient(client.server_url, token, user_agent=USER_AGENT) as poller:
            return poller.denylist(slug)

    corpus = None
    if joined.data_path and not auxiliary:
        corpus = remote_corpus(client.server_url, token, joined, settings.corpus_dir(client.server_url, slug))

    click.echo(
        f"Joined {slug!r} ({joined.experiment.title}) as {joined.username}: "
        + ("helping average (auxiliary peer)" if auxiliary else f"training {joined.experiment.task} on {torch_device}")
        + ". Ctrl-C to leave."
    )
    spool_dir = settings.spool_dir(client.server_url, joined.username, slug)
    _send_leftovers(client.server_url, token, joined, spool_dir)
    reporter = Reporter.for_join(client.server_url, token, joined, spool=Spool(spool_dir, joined.worker_id)).start()
    code = run_session(
        joined,
        device=str(torch_device),
        listen_maddrs=listen,
        client_mode=client_mode,
        auxiliary=auxiliary,
        bandwidth=bandwidth,
        precision=precision,
        max_steps=max_steps,
        max_minutes=max_minutes,
        reporter=reporter,
        log_path=settings.logs_dir / f"{slug}.log",
        verbose=verbose,
        restore_stderr=False,  # the process exits next
        identity_path=identity_path,
        fetch_token=fetch_token,
        denied=denied,
        corpus=corpus,
        progress_file=progress_file,
    )
    return code


def apply_resource_limits(device: Any, cpu_threads: int | None, gpu_memory_fraction: float | None) -> None:
    """The volunteer's share of this machine for the training in this process: torch's intra-op threads, and
    the part of the GPU's memory its caching allocator may take (on CUDA only; ignored elsewhere)."""
    import torch

    if cpu_threads is not None:
        torch.set_num_threads(cpu_threads)
    if gpu_memory_fraction is not None and device.type == "cuda" and torch.cuda.is_available():
        torch.cuda.set_per_process_memory_fraction(gpu_memory_fraction, device)


def _send_leftovers(server_url: str, token: str, joined: JoinResponse, folder: Path) -> None:
    """Reports an earlier session spooled and never got acknowledged (it crashed, or the server was away):
    sent now, to the worker runs they belong to. The server stores each exactly once."""
    from swarmhub.worker.join.reporter import Reporter

    for worker_id in leftovers(folder):
        spool = Spool(folder, worker_id)
        count = len(spool.unacked())
        if not count:
            spool.close(done=True)
            continue
        earlier = joined.model_copy(update={"worker_id": worker_id})
        reporter = Reporter.for_join(server_url, token, earlier, spool=spool).start()
        if reporter.close(timeout=15.0):
            click.echo(f"Sent {count} metric reports left from an earlier session.")
        elif reporter.fatal is not None and reporter.fatal.exit_code in (ExitCode.AUTH, ExitCode.NOT_FOUND):
            logger.warning("dropping %d spooled reports the server refuses: %s", count, reporter.fatal.message)
            discard(folder, worker_id)
        else:
            logger.warning("%d reports of worker run %s are still unsent: kept for next time", count, worker_id)


def remote_corpus(server_url: str, token: str, joined: JoinResponse, cache_dir: Path) -> Any:
    """The experiment's corpus, downloaded as the task reads it and cached in ``cache_dir``."""
    from swarmhub.worker.tasks.data import corpus_of  # numpy: not for the commands that never train

    assert joined.data_path is not None
    return corpus_of(server_url, token, joined.experiment.slug, cache_dir, joined.data_path)


def check_swarm_protocol(server_url: str, joined: JoinResponse) -> None:
    """Refuse a hub whose swarm speaks another protocol than this worker's peers (``protocol.SWARM_PROTOCOL``):
    every request between them would be refused, so the peer could neither train with the swarm nor be seen."""
    if joined.swarm_protocol == SWARM_PROTOCOL:
        return
    fix = (
        "the hub runs an earlier swarmhub: ask its operator to upgrade the server"
        if joined.swarm_protocol < SWARM_PROTOCOL
        else "upgrade with `swarmhub upgrade` (the worker the hub serves), then join again"
    )
    raise WorkerError(
        f"The swarm at {server_url} speaks protocol {joined.swarm_protocol} and this swarmhub {SWARM_PROTOCOL}: {fix}",
        ExitCode.ERROR,
    )
