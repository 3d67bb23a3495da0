"""``swarmhub upgrade``: install the worker the hub serves (``GET /api/worker``: its version, pinned to its wheel's
SHA-256) into the Python that runs this command."""

from __future__ import annotations

import shlex
import subprocess
import sys

import click

from swarmhub.worker.cli.commands import worker_settings
from swarmhub.worker.client import USER_AGENT, ApiClient, ExitCode, WorkerError
from swarmhub.worker.credentials import resolve_credentials
from swarmhub.worker.transport import insecure_option, require_encryption


@click.command()
@click.option("--server", "server_opt", metavar="URL", help="Server URL (default: SWARMHUB_SERVER or the last one)")
@click.option("--dry-run", is_flag=True, help="Print the command instead of running it")
@insecure_option
def upgrade(server_opt: str | None, dry_run: bool, insecure: bool) -> None:
    """Install the worker the hub serves (its version, pinned to its wheel's hash) into this Python."""
    server = server_opt or resolve_credentials(worker_settings()).server
    if not server:
        raise WorkerError("No server given: run `swarmhub upgrade --server URL`", ExitCode.USAGE)
    with ApiClient(require_encryption(server, insecure), user_agent=USER_AGENT) as client:
        package = client.worker_package()
    if not package.available or package.url is None or package.sha256 is None:
        raise WorkerError(
            f"{server} serves no worker package ({package.problem or 'it is being prepared: try again in a minute'})",
            ExitCode.ERROR,
        )
    command = [sys.executable, "-m", "pip", "install", "--upgrade", f"swarmhub @ {package.url}#sha256={package.sha256}"]
    if dry_run:
        click.echo(shlex.join(command))
        return
    click.echo(f"Installing swarmhub {package.version} from {package.url} ...")
    done = subprocess.run(command, check=False)  # noqa: S603 - pip, with the hub's URL pinned to its hash
    if done.returncode != 0:
        raise WorkerError(f"pip failed (exit {done.returncode}): see its output above", ExitCode.ERROR)
    click.echo(f"Installed swarmhub {package.version}: run `swarmhub --version` to check.")
