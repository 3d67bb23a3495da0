"""The server's side of each experiment's swarm: ``SwarmHost`` (``host.py``) runs, per running experiment, the
bootstrap and monitor peer (``bootstrap_peer.py``) and its companions, the auxiliary peers (``aux_peer.py``, the
swarm's witnesses, one per averaging group: ``witnesses.py``) and the checkpoint peer (``checkpoint_peer.py``), each
its own process (hivemind objects must never cross a ``spawn``). ``commands.py`` says how each is started and with
what files, ``events.py`` what they say on stdout and what their configs hold, ``process.py`` what every one of them
does alike, ``peer_logs.py`` where their logs go, ``supervision.py`` how they are restarted, ``ports.py`` which
ports they listen on, ``coordinator.py`` what the web process does with their events, and ``leases.py`` which
server process hosts each experiment's peers.

The peer processes import this package too: ``SwarmHost`` is loaded only when asked for, so that they do not
import the server's database layer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from swarmhub.server.swarm.host import SwarmHost

__all__ = ["SwarmHost"]


def __getattr__(name: str) -> Any:
    if name == "SwarmHost":
        from swarmhub.server.swarm.host import SwarmHost

        return SwarmHost
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
