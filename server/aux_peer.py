"""The server's auxiliary peer for one experiment, when its organizer asks for one.

Run as its own process by ``SwarmHost`` (hivemind objects must never cross a ``spawn``):

    python -m swarmhub.server.aux_peer --config FILE --signing-key-file FILE --identity FILE --host HOST [--port 0]

It joins the experiment's swarm like a volunteer started with ``swarmhub join --aux``: it computes no
gradients and lends the server's link to every averaging round. Its swarm token is one it signs itself, as
``swarmhub``, with the experiment's key (like the bootstrap peer). It leaves the swarm cleanly on SIGTERM,
SIGINT, or when its stdin closes (the server went away).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="swarmhub-aux-peer")
    parser.add_argument("--config", required=True, help="JSON: experiment, run_id, initial_peers")
    parser.add_argument("--signing-key-file", required=True)
    parser.add_argument("--identity", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--announce-host", default="", help="public address to announce (behind NAT) with --port")
    parser.add_argument("--token-minutes", type=float, default=60.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    stop = threading.Event()
    main_pid = os.getpid()

    def on_signal(signum: int, frame: object) -> None:
        if os.getpid() == main_pid:
            stop.set()
        else:  # a process hivemind forked inherited this handler: it must still die
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)

    # As in swarm_peer: watch the parent's pipe on a private copy of fd 0 (hivemind forks).
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

    from swarmhub.server.settings import tcp_maddr
    from swarmhub.worker import swarm_access
    from swarmhub.worker.protocol import ExperimentConfig, JoinResponse, SwarmToken
    from swarmhub.worker.training import train

    config = json.loads(Path(args.config).read_text())
    signing_key = swarm_access.signing_key_from_text(Path(args.signing_key_file).read_text().strip())
    identity = Path(args.identity)
    public_key = swarm_access.load_or_create_identity(identity).get_public_key().to_bytes()
    run_id = config["run_id"]
    lifetime = timedelta(minutes=args.token_minutes)

    def mint() -> SwarmToken:
        token = swarm_access.sign_token(signing_key, run_id, swarm_access.SERVER_PEER_USERNAME, public_key, lifetime)
        return SwarmToken(**swarm_access.token_to_wire(token))

    deny_file = Path(args.signing_key_file).with_suffix(".deny")

    def denied() -> set[str]:
        return set(deny_file.read_text().split()) if deny_file.exists() else set()

    join = JoinResponse(
        experiment=ExperimentConfig.model_validate(config["experiment"]),
        run_id=run_id,
        initial_peers=config["initial_peers"],
        worker_id=f"aux-{run_id}",
        username=swarm_access.SERVER_PEER_USERNAME,
        report_path="",
        swarm_token=mint(),
        token_path="",
        experiment_public_key=swarm_access.public_key_text(signing_key),
        server_time=time.time(),
    )
    print(json.dumps({"event": "joining", "run_id": run_id}), flush=True)
    summary = train(
        join,
        device="cpu",
        listen_maddrs=[tcp_maddr(args.host, args.port)],
        announce_maddrs=[tcp_maddr(args.announce_host, args.port)] if args.announce_host else None,
        auxiliary=True,
        identity_path=identity,
        fetch_token=mint,
        denied=denied,
        stop_event=stop,
        on_joined=lambda peer_id, maddrs: print(
            json.dumps({"event": "ready", "peer_id": peer_id, "maddrs": maddrs}), flush=True
        ),
    )
    print(json.dumps({"event": "stopped", "epoch": summary.epoch}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
