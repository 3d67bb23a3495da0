"""What every ``swarmhub`` command shares: the group that renders a :class:`WorkerError` and Ctrl-C as one line
and an exit code, the settings from the environment, and an API client with the resolved login."""

from __future__ import annotations

import logging
from typing import Any, NoReturn

import click
from pydantic import ValidationError

from .client import USER_AGENT, ApiClient, ExitCode, WorkerError, not_logged_in
from .credentials import resolve_credentials
from .settings import WorkerSettings
from .transport import require_encryption

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
