"""How ``swarmhub login`` gets a token in the browser: the device-code flow (RFC 8628). It shows the code, then
polls the server until the volunteer approves it, denies it or lets it expire.
"""

from __future__ import annotations

import socket
import time

import click

from swarmhub.worker.client import ApiClient, ExitCode, WorkerError


def device_flow(client: ApiClient, scope: str = "volunteer") -> tuple[str, str]:
    """RFC 8628: show the code, poll until the user approves it in the browser. ``scope``: volunteer (join,
    report, read) or organizer (also create and run experiments)."""
    code = client.device_code(f"swarmhub-cli on {socket.gethostname()}", scope)
    click.echo(f"Open this page in a browser and approve {scope} access:\n\n    {code.verification_uri_complete}\n")
    click.echo(f"(or go to {code.verification_uri} and enter the code {code.user_code})")
    click.echo("Waiting for approval... (Ctrl-C to cancel)")
    interval = max(code.interval, 1)
    deadline = time.monotonic() + code.expires_in
    while time.monotonic() < deadline:
        time.sleep(interval)
        answer = client.device_token(code.device_code)
        if isinstance(answer, str):
            if answer == "authorization_pending":
                continue
            if answer == "slow_down":
                interval += 5
                continue
            if answer == "access_denied":
                raise WorkerError(
                    "The login was denied in the browser: run `swarmhub login` to try again", ExitCode.AUTH
                )
            if answer == "expired_token":
                break
            raise WorkerError(f"Login failed ({answer}): run `swarmhub login` to try again", ExitCode.AUTH)
        return answer.access_token, answer.username
    raise WorkerError("The login code expired before it was approved: run `swarmhub login` again", ExitCode.AUTH)
