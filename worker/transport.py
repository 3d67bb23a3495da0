"""Which server URLs the worker talks to: https anywhere, plain http only to this machine unless ``--insecure``.

Over plain http the API token (sent with every request) and every metric report cross the network unencrypted,
so anyone on the way could take the volunteer's account. A server on this machine (``localhost``, 127.0.0.0/8,
``[::1]``) never puts them on the network; any other plain-http server is refused before the first connection.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

import click

from swarmhub.worker.client import ExitCode, WorkerError, normalize_server_url

insecure_option = click.option(
    "--insecure",
    is_flag=True,
    help="Allow a plain http:// server on another machine (your token and reports then cross the network unencrypted)",
)


def on_this_machine(host: str) -> bool:
    """``localhost`` or a loopback or unspecified address: traffic to it never leaves this machine."""
    host = host.lower().rstrip(".")
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name may resolve anywhere: only "localhost" is taken on trust
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback or address.is_unspecified


def require_encryption(url: str, insecure: bool = False) -> str:
    """The normalized ``url``; a plain-http one to another machine is refused unless ``insecure``."""
    url = normalize_server_url(url)
    parts = urlsplit(url)
    if parts.scheme == "https" or insecure or on_this_machine(parts.hostname or ""):
        return url
    secure = "https://" + url.split("://", 1)[1]
    raise WorkerError(
        f"Refusing plain http to {parts.hostname}: your API token and every report would cross the network "
        f"unencrypted. Use {secure}, or add --insecure if you trust every network in between",
        ExitCode.USAGE,
    )
