"""The ``swarmhub`` command line: log in, list experiments, join one and train with its swarm.

Every failure is one line, ``Error: <what happened>: <what to do next>``, and a documented exit code
(see :mod:`swarmhub.worker.client`); never a traceback. ``server``, ``admin`` and ``demo`` are thin
wrappers around ``swarmhub.server.cli`` (the ``[server]`` extra), imported only when used.
"""

# ruff: noqa: E402 - the interrupt handler below is installed before the modules it covers are imported

from __future__ import annotations

import signal
import sys
import threading


def _interrupted_while_loading(signum: int, frame: object) -> None:
    sys.stderr.write("\nInterrupted.\n")
    raise SystemExit(130)  # ExitCode.INTERRUPTED, as once loaded


# Ctrl-C while this module's imports load (about a second, several on a busy machine; `swarmhub join --any` passes
# it on to the join it has just started) ends the command as it does later, one line and exit code 130, rather
# than with a KeyboardInterrupt traceback from inside an import. Python's handler is back at the end of the module.
_HANDLER_BEFORE_LOADING: Any = None
if (
    threading.current_thread() is threading.main_thread()
    and signal.getsignal(signal.SIGINT) is signal.default_int_handler
):
    _HANDLER_BEFORE_LOADING = signal.signal(signal.SIGINT, _interrupted_while_loading)

import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from pydantic import SecretStr

from swarmhub import __version__
from swarmhub.common.protocol import SLUG_RE
from swarmhub.worker.cli import service as service_cli
from swarmhub.worker.cli.commands import CommandGroup, authed_client, registered_commands, worker_settings
from swarmhub.worker.cli.login import device_flow
from swarmhub.worker.cli.upgrade import upgrade
from swarmhub.worker.client import USER_AGENT, ApiClient, ExitCode, WorkerError
from swarmhub.worker.credentials import (
    StoredCredentials,
    delete_credentials,
    load_credentials,
    resolve_credentials,
    store_credentials,
)
from swarmhub.worker.join.prepare import join_and_train
from swarmhub.worker.join.session import DEFAULT_LISTEN
from swarmhub.worker.service.limits import ServiceConfig
from swarmhub.worker.service.runner import Conditions, Runner, join_command
from swarmhub.worker.settings import WorkerSettings
from swarmhub.worker.transport import insecure_option, require_encryption

logger = logging.getLogger("swarmhub.worker")


@click.group(cls=CommandGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="swarmhub")
def main() -> None:
    """Train deep-learning models together on donated hardware.

    \b
    Volunteers:  swarmhub login --server URL;  swarmhub experiments;  swarmhub join SLUG
    Background:  swarmhub service install|start|stop|status|uninstall  (limits in config.toml)
    Exit codes:  0 ok, 1 unexpected error, 2 usage, 3 authentication, 4 unknown experiment,
                 5 server unreachable, 6 experiment not accepting volunteers, 7 clock off, 8 removed,
                 9 swarmhub too old for the hub's swarm, 130 Ctrl-C, 143 SIGTERM
    """


# -- account ----------------------------------------------------------------------------------------------


@main.command()
@click.option("--server", "server_opt", metavar="URL", help="Server URL (default: SWARMHUB_SERVER or the last one)")
@click.option("--with-token", is_flag=True, help="Read an API token from stdin instead of the browser flow")
@click.option(
    "--scope",
    type=click.Choice(["volunteer", "organizer"]),
    default="volunteer",
    show_default=True,
    help="What the token may do: volunteer (join, report, read) or organizer (also create and run experiments)",
)
@insecure_option
def login(server_opt: str | None, with_token: bool, scope: str, insecure: bool) -> None:
    """Log in to a swarmhub server (device-code flow in the browser, or --with-token)."""
    settings = worker_settings()
    stored = load_credentials(settings.config_dir)
    server = server_opt or settings.server or (stored.server if stored else None)
    if not server:
        raise WorkerError("No server given: run `swarmhub login --server URL`", ExitCode.USAGE)
    server = require_encryption(server, insecure)
    with ApiClient(server, user_agent=USER_AGENT) as client:
        if with_token:
            line = sys.stdin.readline().strip()
            if not line:
                raise WorkerError(
                    "No token on stdin: pipe one in, e.g. `swarmhub login --with-token < token.txt`",
                    ExitCode.USAGE,
                )
            username = client.me(token=line).username
            token = line
        else:
            token, username = device_flow(client, scope)
    path = store_credentials(
        settings.config_dir, StoredCredentials(server=server, token=SecretStr(token), username=username)
    )
    click.echo(f"Logged in to {server} as {username} (credentials in {path})")
    if settings.token is not None:
        click.echo("Note: SWARMHUB_TOKEN is set and overrides the stored token.", err=True)


@main.command()
@insecure_option
def logout(insecure: bool) -> None:
    """Revoke the stored token on the server (best effort) and delete it from this machine."""
    settings = worker_settings()
    stored = load_credentials(settings.config_dir)
    if stored is None:
        click.echo("Not logged in: nothing to remove.")
    else:
        revoked = ""
        try:
            server = require_encryption(stored.server, insecure)
            with ApiClient(server, stored.token.get_secret_value(), user_agent=USER_AGENT) as client:
                client.revoke_token()
            revoked = "token revoked on the server, "
        except WorkerError as exc:
            click.echo(f"Warning: could not revoke the token on the server ({exc.message})", err=True)
        delete_credentials(settings.config_dir)
        click.echo(f"Logged out of {stored.server}: {revoked}credentials removed from this machine.")
    if settings.token is not None:
        click.echo("Note: SWARMHUB_TOKEN is still set in your environment.", err=True)


@main.command()
@insecure_option
def whoami(insecure: bool) -> None:
    """Show who you are logged in as, and where."""
    settings = worker_settings()
    client, _ = authed_client(settings, insecure)
    with client:
        me = client.me()
    role = " (admin)" if me.is_admin else ""
    source = " [token from SWARMHUB_TOKEN]" if resolve_credentials(settings).source == "env" else ""
    token = ""
    if me.scope:  # servers before token scopes do not say
        until = f", expires {me.expires_at:%Y-%m-%d %H:%M} UTC" if me.expires_at else ", until revoked"
        token = f"; {me.scope} token{until}"
    click.echo(f"{me.username}{role} on {client.server_url}{source}{token}")


@main.command()
@insecure_option
def experiments(insecure: bool) -> None:
    """List the server's experiments."""
    settings = worker_settings()
    creds = resolve_credentials(settings)
    if not creds.server:
        raise WorkerError(
            "No server configured: run `swarmhub login --server URL` or set SWARMHUB_SERVER", ExitCode.USAGE
        )
    token = creds.token.get_secret_value() if creds.token else None
    with ApiClient(require_encryption(creds.server, insecure), token, user_agent=USER_AGENT) as client:
        items = client.experiments()
    if not items:
        click.echo(f"No experiments on {client.server_url} yet.")
        return
    rows = [("SLUG", "STATUS", "TASK", "TITLE")] + [(e.slug, e.status.value, e.task, e.title) for e in items]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        padded = [cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True)]
        click.echo("  ".join([*padded, row[3]]))


# -- join ---------------------------------------------------------------------------------------------------


@main.command()
@click.argument("slug", required=False)
@click.option(
    "--any",
    "any_experiment",
    is_flag=True,
    help="Instead of SLUG: join the experiment that needs peers most among those you may join, and the next "
    "most needed when it finishes",
)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--max-steps", type=click.IntRange(min=1), help="Stop after this many local steps")
@click.option("--max-minutes", type=click.FloatRange(min=0, min_open=True), help="Stop after this long")
@click.option(
    "--listen",
    "listen",
    multiple=True,
    default=(DEFAULT_LISTEN,),
    show_default=True,
    metavar="MADDR",
    help="hivemind listen multiaddr (repeatable)",
)
@click.option(
    "--client-mode",
    is_flag=True,
    help="Do not accept connections from other peers (default: only when the server cannot dial this machine)",
)
@click.option(
    "--aux",
    "auxiliary",
    is_flag=True,
    help="Help the swarm average without computing gradients (a CPU machine with a good link)",
)
@click.option(
    "--precision",
    type=click.Choice(["auto", "fp32", "bf16", "fp16"]),
    default="auto",
    show_default=True,
    help="Compute precision: auto is bf16 or fp16 on CUDA, fp32 on the CPU; the swarm always averages fp32",
)
@click.option("--cpu-threads", type=click.IntRange(min=1), help="CPU threads for training (torch.set_num_threads)")
@click.option(
    "--gpu-memory-fraction",
    type=click.FloatRange(min=0, max=1, min_open=True),
    help="Largest share of the GPU's memory training may take (CUDA only)",
)
@click.option("--progress-file", type=click.Path(dir_okay=False, path_type=Path), hidden=True)
@click.option("--verbose", is_flag=True, help="Show hivemind's logs on the console instead of the log file")
@insecure_option
def join(
    slug: str | None,
    any_experiment: bool,
    device: str,
    max_steps: int | None,
    max_minutes: float | None,
    listen: Sequence[str],
    client_mode: bool,
    auxiliary: bool,
    precision: str,
    cpu_threads: int | None,
    gpu_memory_fraction: float | None,
    progress_file: Path | None,
    verbose: bool,
    insecure: bool,
) -> None:
    """Join experiment SLUG (or --any) and train with its swarm until stopped (Ctrl-C leaves cleanly)."""
    settings = worker_settings()
    if any_experiment:
        if slug is not None:
            raise WorkerError(f"Give either SLUG or --any, not both: `swarmhub join {slug}`", ExitCode.USAGE)
        if max_steps is not None or max_minutes is not None:
            raise WorkerError(
                "--max-steps and --max-minutes end one experiment's join: with --any, stop with Ctrl-C",
                ExitCode.USAGE,
            )
        options = ["--device", device, "--precision", precision]
        options += ["--client-mode"] * client_mode + ["--aux"] * auxiliary + ["--verbose"] * verbose
        raise click.exceptions.Exit(
            _join_any(settings, listen, insecure, options, cpu_threads=cpu_threads, gpu_fraction=gpu_memory_fraction)
        )
    if slug is None:
        raise WorkerError(
            "No experiment given: `swarmhub join SLUG` (see `swarmhub experiments`) or `swarmhub join --any`",
            ExitCode.USAGE,
        )
    client, token = authed_client(settings, insecure)
    if not SLUG_RE.match(slug):
        raise WorkerError(
            f"{slug!r} is not an experiment name: run `swarmhub experiments` to list them", ExitCode.USAGE
        )
    code = join_and_train(
        settings,
        client,
        token,
        slug,
        device=device,
        max_steps=max_steps,
        max_minutes=max_minutes,
        listen=listen,
        client_mode=client_mode,
        auxiliary=auxiliary,
        precision=precision,
        verbose=verbose,
        cpu_threads=cpu_threads,
        gpu_memory_fraction=gpu_memory_fraction,
        progress_file=progress_file,
    )
    raise click.exceptions.Exit(code)


def _join_any(
    settings: WorkerSettings,
    listen: Sequence[str],
    insecure: bool,
    options: list[str],
    *,
    cpu_threads: int | None,
    gpu_fraction: float | None,
) -> int:
    """``join --any``: the background worker's loop in the foreground, without its limits. It supervises one
    ``join SLUG`` at a time (the most needed experiment) and moves to the next most needed one when that one stops
    taking volunteers. Ctrl-C stops the child cleanly, then exits 130 (SIGTERM: 143)."""
    client, _ = authed_client(settings, insecure)  # not logged in: one line now, not a loop of failing joins
    client.close()
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    logging.getLogger("swarmhub.worker.service").setLevel(logging.INFO)  # which experiment, and why
    config = ServiceConfig(any=True, pause_on_battery=False, cpu_threads=cpu_threads, gpu_memory_fraction=gpu_fraction)
    with tempfile.TemporaryDirectory(prefix="swarmhub-join-any-") as folder:
        runner = Runner(
            config,
            Path(folder),
            command=join_command(config, listen=listen, insecure=insecure, extra=options),
            conditions=Conditions(config),
            poll=2.0,
            fetch=service_cli.joinable_fetcher(settings, insecure),
        )
        runner.run()
    if runner.stopped_by == signal.SIGINT:
        return ExitCode.INTERRUPTED
    return ExitCode.TERMINATED if runner.stopped_by == signal.SIGTERM else ExitCode.OK


@main.command()
@click.argument("slug", required=False)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option(
    "--listen",
    "listen",
    multiple=True,
    default=(DEFAULT_LISTEN,),
    show_default=True,
    metavar="MADDR",
    help="the multiaddr `join` would listen on (repeatable)",
)
@insecure_option
def doctor(slug: str | None, device: str, listen: Sequence[str], insecure: bool) -> None:
    """Check this machine before it joins: device, clock, open files, bandwidth, reachability, and with
    SLUG the experiment's training throughput here. Exits 1 when something must be fixed first."""
    from swarmhub.worker.join import doctor as checks
    from swarmhub.worker.training.peer import resolve_device

    settings = worker_settings()
    client, token = authed_client(settings, insecure)
    with client:
        if slug is not None and not SLUG_RE.match(slug):
            raise WorkerError(
                f"{slug!r} is not an experiment name: run `swarmhub experiments` to list them", ExitCode.USAGE
            )
        failed = checks.run_all(client, token, settings, slug, resolve_device(device), listen, click.echo)
    raise click.exceptions.Exit(ExitCode.ERROR if failed else 0)


# -- the background worker (service_cli) ----------------------------------------------------------------------

main.add_command(service_cli.service)
main.add_command(service_cli.run_service)


main.add_command(upgrade)


for _command in registered_commands():
    main.add_command(_command)


if _HANDLER_BEFORE_LOADING is not None:  # loaded: every command renders Ctrl-C itself (``CommandGroup``)
    signal.signal(signal.SIGINT, _HANDLER_BEFORE_LOADING)


if __name__ == "__main__":  # `python -m swarmhub.worker.cli.main`, as `swarmhub demo` runs its workers
    main(prog_name="swarmhub")
