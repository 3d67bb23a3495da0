"""The server's auxiliary peer for one experiment, when its organizer asks for one.

Run as its own process by ``SwarmHost`` (hivemind objects must never cross a ``spawn``):

    python -m swarmhub.server.swarm.aux_peer --config FILE --signing-key-file FILE --identity FILE --host HOST
        [--port 0]

It joins the experiment's swarm like a volunteer started with ``swarmhub join --aux``: it computes no
gradients and lends the server's link to every averaging round. For a task that trains on a corpus it reads the
corpus's manifest and tokenizer in place (the model's shape comes from them), never its shards. Its swarm token
is one it signs itself, as ``swarmhub``, with the experiment's key (like the bootstrap peer). It leaves the swarm
cleanly on SIGTERM, SIGINT, or when its stdin closes (the server went away).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from swarmhub.server.swarm.events import AuxConfig, Ready, Stopped
from swarmhub.server.swarm.process import ServerPeerAccess, companion_arguments, emit, run, stop_event


def main(argv: list[str] | None = None) -> int:
    parser = companion_arguments("swarmhub-aux-peer", "JSON (events.AuxConfig): experiment, run_id, initial_peers")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    stop = stop_event()

    from swarmhub.server.core.settings import tcp_maddr
    from swarmhub.worker.tasks.data import LocalCorpus
    from swarmhub.worker.training.peer import train

    config = AuxConfig.model_validate_json(Path(args.config).read_text())
    # It computes nothing, but builds the task's model: for a task that trains on a corpus, its shape (vocabulary,
    # sequence length) is in the corpus's manifest, which the server's peers read in place.
    corpus = LocalCorpus(Path(config.corpus)) if config.corpus else None
    access = ServerPeerAccess.load(config.run_id, args.signing_key_file, Path(args.identity), args.token_minutes)
    emit({"event": "joining", "run_id": config.run_id})
    summary = train(
        access.join(config, worker_id=f"aux-{config.run_id}"),
        device="cpu",
        listen_maddrs=[tcp_maddr(args.host, args.port)],
        announce_maddrs=[tcp_maddr(args.announce_host, args.port)] if args.announce_host else None,
        auxiliary=True,
        identity_path=access.identity,
        fetch_token=access.mint_wire,
        denied=access.denied,
        stop_event=stop,
        corpus=corpus,
        witness_index=config.index,
        on_joined=lambda peer_id, maddrs: emit(Ready(peer_id=peer_id, maddrs=maddrs)),
    )
    emit(Stopped(epoch=summary.epoch))
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
