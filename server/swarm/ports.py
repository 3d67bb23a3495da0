"""The ports the server's peer processes listen on, behind a firewall or NAT: each takes a free one of the
operator's range (``SWARMHUB_SWARM_PORTS``); without a range, each listens on a random port (0)."""

from __future__ import annotations

import ipaddress
import logging
import socket

from swarmhub.server.core.settings import tcp_maddr

logger = logging.getLogger("swarmhub.swarm")


class PortRange:
    def __init__(self, host: str, ports: range | None):
        self.host = host
        self.ports = ports  # None: random ports
        self._short: set[str] = set()  # run_ids whose peer found no free port (logged once)

    def take(self, in_use: set[int], run_id: str, what: str) -> int | None:
        """A free port of the range, not one of ``in_use`` (the host's running peers'); 0 without a range; None
        when all are taken (logged once per run until one is free again)."""
        if self.ports is None:
            return 0
        for port in self.ports:
            if port not in in_use and can_listen(self.host, port):
                self._short.discard(run_id)
                return port
        if run_id not in self._short:
            self._short.add(run_id)
            logger.error(
                "no free port left in SWARMHUB_SWARM_PORTS=%s-%s for the %s of %s: widen the range (and open it "
                "in the firewall) or stop other experiments; trying again at each reconcile",
                self.ports.start,
                self.ports.stop - 1,
                what,
                run_id,
            )
        return None


def can_listen(host: str, port: int) -> bool:
    """Whether nothing listens on ``host``:``port`` now (with SO_REUSEADDR, as p2pd binds its listener)."""
    family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def local_maddrs(host: str, port: int, maddrs: list[str]) -> list[str]:
    """Where a process on this machine reaches a peer listening on ``host``:``port`` that announces ``maddrs``: its
    announced (public) address may not loop back through the NAT, its listening address does."""
    if ipaddress.ip_address(host).is_unspecified:
        host = "::1" if ipaddress.ip_address(host).version == 6 else "127.0.0.1"
    peer_ids = {m.rsplit("/p2p/", 1)[1] for m in maddrs if "/p2p/" in m}
    return [f"{tcp_maddr(host, port)}/p2p/{peer_id}" for peer_id in sorted(peer_ids)] or maddrs
