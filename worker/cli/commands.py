"""What every ``swarmhub`` command shares: the group that renders a :class:`WorkerError` and Ctrl-C as one line
and an exit code, the settings from the environment, and an API client with the resolved login."""

from __future__ import annotations

import logging
from typing import Any, NoReturn

import click
from pydantic import ValidationError

from swarmhub.worker.client import USER_AGENT, ApiClient, ExitCode, WorkerError, not_logged_in
from swarmhub.worker.credentials import resolve_credentials
from swarmhub.worker.errors import SERVER_EXTRA_HINT
from swarmhub.worker.settings import WorkerSettings
from swarmhub.worker.transport import require_encryption

logger = logging.getLogger("swarmhub.worker")


class CommandGroup(click.Group):
    """Renders :class:`WorkerError` and Ctrl-C as one line and an exit code, for every command."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except WorkerError as exc:
            fail(exc.message, exc.exit_code)
        except KeyboardInterrupt:
            click.echo("\nInterrupted.", err=True)
            raise click.exceptions.Exit(ExitCode.INTERRUPTED) from None
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:  # a bug: still one line, no traceback on the volunteer's console
            logger.debug("unexpected error", exc_info=True)
            fail(f"unexpected {type(exc).__name__}: {exc} (please report this bug)", ExitCode.ERROR)


def fail(message: str, code: int) -> NoReturn:
    click.echo(f"Error: {message}", err=True)
    raise click.exceptions.Exit(code)


def worker_settings() -> WorkerSettings:
    try:
        return WorkerSettings()
    except ValidationError as exc:
        fields = ", ".join("SWARMHUB_" + str(err["loc"][0]).upper() for err in exc.errors() if err["loc"])
        raise WorkerError(f"Invalid setting in the environment: check {fields}", ExitCode.USAGE) from None


def authed_client(settings: WorkerSettings, insecure: bool) -> tuple[ApiClient, str]:
    """A client with the resolved token; exits 3 with the login hint when there is none."""
    creds = resolve_credentials(settings)
    if creds.token is None:
        raise not_logged_in(creds.server)
    if creds.server is None:
        raise WorkerError(
            "No server configured: run `swarmhub login --server URL` or set SWARMHUB_SERVER", ExitCode.AUTH
        )
    token = creds.token.get_secret_value()
    return ApiClient(require_encryption(creds.server, insecure), token, user_agent=USER_AGENT), token


COMMANDS_GROUP = "swarmhub.commands"


def _needs_the_server_extra(name: str) -> click.Command:
    """``name`` where the package that registers it cannot be imported (a worker without the server's package)."""

    @click.command(name, context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
    def command() -> None:
        click.echo(SERVER_EXTRA_HINT, err=True)
        raise click.exceptions.Exit(ExitCode.ERROR)

    command.help = "Needs the [server] extra."
    return command


def registered_commands() -> list[click.Command]:
    """The commands other parts of swarmhub register in the ``swarmhub.commands`` entry-point group: the server's
    ``server``, ``admin`` and ``demo`` (the worker never imports the server)."""
    from importlib.metadata import entry_points

    commands = []
    for point in sorted(entry_points(group=COMMANDS_GROUP), key=lambda p: p.name):
        try:
            commands.append(point.load())
        except ImportError as exc:
            # a module of ours that fails to import is a bug; the registering package missing is the extra
            if not (exc.name and (exc.name == point.module or point.module.startswith(exc.name + "."))):
                raise
            commands.append(_needs_the_server_extra(point.name))
    return commands
