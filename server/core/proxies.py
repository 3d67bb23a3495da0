"""Who the client is when a reverse proxy fronts the server: ``SWARMHUB_TRUSTED_PROXIES``.

Rate limits and the reachability probe key on the client's address. Behind a proxy every connection comes from the
proxy, and the client's address arrives in ``X-Forwarded-For``, a header any client can also send. This ASGI
middleware believes the header only on connections from a listed proxy: the client is then the right-most address
in it that is not itself a listed proxy (each proxy appends the address it saw). On every other connection the
header is ignored, so a client cannot escape a limit or aim the probe by writing one. The server runs uvicorn with
its own proxy-header handling off (``server/cli.py``), so this is the only place the header is read.
"""

from __future__ import annotations

import ipaddress
from typing import Any

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(text: str) -> list[Network]:
    """``10.0.0.0/8, 127.0.0.1`` -> networks; raises ValueError naming a bad entry."""
    networks = []
    for item in (part.strip() for part in text.split(",")):
        if item:
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                raise ValueError(f"{item!r} is not an IP address or network") from None
    return networks


class TrustedProxies:
    def __init__(self, app: Any, networks: list[Network]):
        self.app, self.networks = app, networks

    def _trusted(self, host: str) -> bool:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self.networks)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        client = scope.get("client")
        if self.networks and scope["type"] in ("http", "websocket") and client and self._trusted(client[0]):
            forwarded = [
                part.strip()
                for name, value in scope["headers"]
                if name == b"x-forwarded-for"
                for part in value.decode("latin-1").split(",")
            ]
            for candidate in reversed(forwarded):
                if not self._trusted(candidate):
                    try:
                        ipaddress.ip_address(candidate)
                    except ValueError:
                        break  # a malformed entry: nothing before it can be believed; keep the proxy's address
                    scope = {**scope, "client": (candidate, 0)}
                    break
        await self.app(scope, receive, send)
