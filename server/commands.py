"""``swarmhub server``, ``admin`` and ``demo``: the server's commands of the ``swarmhub`` command line, registered
through the entry-point group ``swarmhub.commands`` (the worker's CLI never imports the server). Only click here:
``swarmhub.server.cli`` and its web stack (the ``[server]`` extra) are imported when one of them runs, so that a
volunteer's worker needs no web stack."""

from __future__ import annotations

from typing import Any

import click

from swarmhub.worker.errors import SERVER_EXTRA_HINT, ExitCode


def _server_cli() -> Any:
    try:
        from swarmhub.server import cli as server_cli
    except ImportError as exc:
        # A module of ours that fails to import is a bug; a missing server package or web stack is the extra.
        if exc.name and exc.name.startswith("swarmhub") and exc.name not in ("swarmhub.server", "swarmhub.server.cli"):
            raise
        click.echo(SERVER_EXTRA_HINT, err=True)
        raise click.exceptions.Exit(ExitCode.ERROR) from None
    return server_cli


def _exit_with(result: Any) -> None:
    if isinstance(result, int) and result != 0:
        raise click.exceptions.Exit(result)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option("--database-url", default=None, help="SQLAlchemy URL (default: SWARMHUB_DATABASE_URL or SQLite)")
@click.option(
    "--log-level", default="info", show_default=True, type=click.Choice(["debug", "info", "warning", "error"])
)
def server(host: str, port: int, database_url: str | None, log_level: str) -> None:
    """Run the swarmhub server (needs the [server] extra)."""
    _exit_with(_server_cli().run_server(host, port, database_url, log_level))


@click.command()
@click.argument("username")
@click.option("--password-stdin", is_flag=True, help="Read the password from stdin")
def admin(username: str, password_stdin: bool) -> None:
    """Create or promote an admin account on the server's database (needs the [server] extra)."""
    _exit_with(_server_cli().run_admin(username, password_stdin))


@click.command()
@click.option(
    "--experiment",
    type=click.Choice(["demo-albert", "demo-digits", "demo-swav"]),
    default="demo-albert",
    show_default=True,
    help="Which demo experiment the two local workers train",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the server and the workers listen on")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535), help="The server's port")
def demo(experiment: str, host: str, port: int) -> None:
    """Start a server with the two demo experiments and two local workers training one of them (needs the [server]
    extra)."""
    _exit_with(_server_cli().run_demo(host=host, port=port, experiment=experiment))
