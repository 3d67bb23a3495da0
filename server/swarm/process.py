"""What every peer process of the server does alike (``bootstrap_peer``, ``aux_peer``, ``checkpoint_peer``).

- It stops cleanly on SIGTERM, SIGINT, or when its stdin closes (the server that started it went away), so it
  never outlives the server: :func:`stop_event`.
- It speaks JSON lines on stdout, one event each (:func:`emit`; the events are in ``commands.py``).
- It is the server's own peer: it signs its swarm token itself, with the experiment's key and under the reserved
  username, and refuses the volunteers the server removed (``<run_id>.deny``, kept current by the server):
  :class:`ServerPeerAccess`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel


def emit(event: BaseModel | dict[str, Any]) -> None:
    """One event on stdout, as a JSON line (the host reads it as soon as it is written)."""
    data = event.model_dump(mode="json", exclude_none=True) if isinstance(event, BaseModel) else event
    text = json.dumps(data)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def stop_event() -> threading.Event:
    """An event set on SIGTERM or SIGINT, or when the parent's pipe (stdin) closes.

    A process that hivemind forks inherits the signal handlers: there the signal still kills. The parent's pipe is
    watched on a private copy of fd 0 and fd 0 becomes /dev/null: hivemind forks its DHT and averager processes, and
    a forked child that closes a stdin another thread is blocked reading would deadlock."""
    stop = threading.Event()
    main_pid = os.getpid()

    def on_signal(signum: int, frame: object) -> None:
        if os.getpid() == main_pid:
            stop.set()
        else:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)

    parent_pipe = os.dup(0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)

    def watch_parent() -> None:
        try:
            while os.read(parent_pipe, 1024):
                pass
        except OSError:
            pass
        stop.set()

    threading.Thread(target=watch_parent, daemon=True).start()
    return stop


def run(main: Callable[[], int]) -> int:
    """Run a peer process's ``main``; when it fails, say why in one ``failed`` event before exiting with 1.

    The host shows that message as the peer's last error and logs it once per distinct error. An expected failure
    (a :class:`WorkerError`, such as a task the experiment's data does not fit) is one line on stderr; anything else
    also leaves its traceback in the peer's log."""
    from swarmhub.worker.client import WorkerError

    try:
        return main()
    except WorkerError as exc:
        message = str(exc)
        print(f"error: {message}", file=sys.stderr)
    except Exception as exc:
        message = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    emit({"event": "failed", "error": message[:2000]})
    return 1


def companion_arguments(prog: str, config_help: str) -> argparse.ArgumentParser:
    """The command line of a companion peer (``commands.companion_command`` writes it)."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--config", required=True, help=config_help)
    parser.add_argument("--signing-key-file", required=True)
    parser.add_argument("--identity", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--announce-host", default="", help="public address to announce (behind NAT) with --port")
    parser.add_argument("--token-minutes", type=float, default=60.0)
    return parser


@dataclass
class ServerPeerAccess:
    """A server peer's way into its experiment's swarm: its own key, the experiment's signing key and deny list."""

    run_id: str
    signing_key: Any  # hivemind RSAPrivateKey: the experiment's
    identity: Path
    own_key: Any  # hivemind RSAPrivateKey: this peer's
    lifetime: timedelta
    deny_file: Path

    @classmethod
    def load(cls, run_id: str, signing_key_file: str, identity: Path, token_minutes: float) -> ServerPeerAccess:
        from swarmhub.worker.swarm import access as swarm_access

        signing_key = swarm_access.signing_key_from_text(Path(signing_key_file).read_text().strip())
        return cls(
            run_id=run_id,
            signing_key=signing_key,
            identity=identity,
            own_key=swarm_access.load_or_create_identity(identity),
            lifetime=timedelta(minutes=token_minutes),
            deny_file=Path(signing_key_file).with_suffix(".deny"),
        )

    def mint(self) -> Any:
        """A fresh access token for this peer's key, signed by the experiment's key under the reserved name."""
        from swarmhub.worker.swarm import access as swarm_access

        public_key = self.own_key.get_public_key().to_bytes()
        name = swarm_access.SERVER_PEER_USERNAME
        return swarm_access.sign_token(self.signing_key, self.run_id, name, public_key, self.lifetime)

    def mint_wire(self) -> Any:
        """:meth:`mint` as the worker's protocol carries it (``SwarmToken``)."""
        from swarmhub.common.protocol import SwarmToken
        from swarmhub.worker.swarm import access as swarm_access

        return SwarmToken(**swarm_access.token_to_wire(self.mint()))

    def denied(self) -> set[str]:
        """The usernames the server removed from the experiment (one a line in the deny file)."""
        return set(self.deny_file.read_text().split()) if self.deny_file.exists() else set()

    def join(self, config: Any, worker_id: str) -> Any:
        """The ``JoinResponse`` a companion trains with, as a volunteer's worker would get it from the server."""
        import time

        from swarmhub.common.protocol import JoinResponse
        from swarmhub.worker.swarm import access as swarm_access

        return JoinResponse(
            experiment=config.experiment,
            run_id=self.run_id,
            initial_peers=config.initial_peers,
            worker_id=worker_id,
            username=swarm_access.SERVER_PEER_USERNAME,
            report_path="",
            swarm_token=self.mint_wire(),
            token_path="",
            experiment_public_key=swarm_access.public_key_text(self.signing_key),
            server_time=time.time(),
        )
