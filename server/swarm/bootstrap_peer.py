"""The server's peer for one experiment: the swarm's bootstrap node and its monitor.

Run as its own process (hivemind objects must never cross a ``spawn``):

    python -m swarmhub.server.swarm.bootstrap_peer --run-id RUN --host 127.0.0.1 [--port 0] [--announce-host HOST]
        [--identity PATH]

It speaks JSON lines on stdout:

- ``{"event": "ready", "maddrs": [...]}`` once the DHT is up: the addresses workers bootstrap from;
- ``{"event": "progress", "epoch": E, "peers": N, "samples_per_second": S, "samples": A, "contributors": [...]}``
  about every ``--interval`` seconds (jittered), read from the peers' signed ``{run_id}_progress`` records;
  each contributor is ``{peer_id, username, epoch, samples, samples_per_second, time, client_mode}``, attributed through
  the access token of the key that signed the record (see ``read_progress``).

It shuts down cleanly (no orphaned ``p2pd`` or averager processes) on SIGTERM, SIGINT, or when its
stdin closes, so it never outlives the server that started it (``process.py``; its events: ``events.py``).
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
from pathlib import Path
from typing import Any

from .events import Ready
from .process import emit


def read_progress(dht: Any, run_id: str, experiment_key: Any = None) -> dict[str, Any]:
    """Summarise the swarm's progress records, as hivemind's ProgressTracker does, and attribute each
    record to a volunteer (``contributors``) when ``experiment_key`` is given.

    A record is attributed only when the key that signed it (hivemind's RSASignatureValidator checked the
    signature when the record was stored and read) is the key of a valid access token on the run's roster:
    the token, signed by the experiment's key, names the volunteer. Anything else is counted in the
    swarm's totals but credited to no one.
    """
    from hivemind.optim.progress_tracker import LocalTrainingProgress

    from swarmhub.worker import swarm_access

    record = dht.get(f"{run_id}_progress", latest=True)
    peers: list[tuple[bytes, LocalTrainingProgress]] = []
    if record is not None and isinstance(record.value, dict):
        for subkey, entry in record.value.items():
            try:
                peers.append((subkey, LocalTrainingProgress.parse_obj(entry.value)))
            except Exception:  # noqa: S112 - a malformed record from one peer must not stop the monitor
                continue
    event: dict[str, Any] = {
        "event": "progress",
        "epoch": max((p.epoch for _, p in peers), default=0),
        "peers": len(peers),
        "samples_per_second": round(sum(p.samples_per_second for _, p in peers), 3),
        "samples": sum(p.samples_accumulated for _, p in peers),
    }
    if experiment_key is None:
        return event
    roster = swarm_access.RosterGuard(experiment_key, run_id)
    admitted = roster.admit(dht.get(swarm_access.roster_key(run_id), latest=True))
    contributors = []
    for subkey, progress in peers:
        owner = swarm_access.record_owner(subkey)
        try:
            peer_id = swarm_access.peer_id_for_public_key(owner) if owner else None
        except ValueError:
            peer_id = None
        if peer_id is None or peer_id not in admitted:
            continue
        contributors.append(
            {
                "peer_id": peer_id,
                "username": roster.username_of(peer_id),
                "epoch": progress.epoch,
                "samples": progress.samples_accumulated,
                "samples_per_second": round(progress.samples_per_second, 3),
                "time": progress.time,
                "client_mode": progress.client_mode,
            }
        )
    event["contributors"] = contributors
    event["rounds"], event["flags"] = read_witness(dht, run_id, roster, admitted)
    return event


def read_witness(dht: Any, run_id: str, roster: Any, admitted: dict[str, float]) -> tuple[list[Any], list[Any]]:
    """The rounds and flags that the server's own peers published (``worker/witness.py``), their peers attributed
    through the roster. A record counts only when the key that signed it holds a valid token as the server's peer:
    a volunteer's peer can publish under this key too, and is ignored."""
    from swarmhub.worker import swarm_access, witness

    record = dht.get(witness.witness_key(run_id), latest=True)
    rounds: dict[str, Any] = {}
    flags: dict[str, Any] = {}
    if record is None or not isinstance(record.value, dict):
        return [], []

    def attributed(peer_id: Any) -> str | None:
        return roster.username_of(peer_id) if isinstance(peer_id, str) and peer_id in admitted else None

    for subkey, entry in record.value.items():
        owner = swarm_access.record_owner(subkey)
        try:
            signer = swarm_access.peer_id_for_public_key(owner) if owner else None
        except ValueError:
            signer = None
        if signer is None or signer not in admitted or roster.username_of(signer) != swarm_access.SERVER_PEER_USERNAME:
            continue
        value = entry.value if isinstance(entry.value, dict) else {}
        for item in value.get("rounds", []) if isinstance(value.get("rounds"), list) else []:
            try:
                senders = [
                    {"peer_id": peer, "username": name, "weight": float(weight)}
                    for peer, weight in item["senders"]
                    if (name := attributed(peer)) is not None and name != swarm_access.SERVER_PEER_USERNAME
                ]
                rounds[str(item["id"])] = {
                    "id": str(item["id"]),
                    "epoch": int(item["epoch"]),
                    "time": float(item["time"]),
                    "senders": senders,
                }
            except (KeyError, TypeError, ValueError):
                continue
        for item in value.get("flags", []) if isinstance(value.get("flags"), list) else []:
            if isinstance(item, dict) and (name := attributed(item.get("peer_id"))) is not None:
                if name != swarm_access.SERVER_PEER_USERNAME:
                    flags[str(item.get("id"))] = {**item, "username": name}
    return list(rounds.values()), list(flags.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="swarmhub-bootstrap-peer")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument(
        "--announce-host", default="", help="public address to announce (behind NAT) with --port; empty: --host"
    )
    parser.add_argument("--identity", default=None, help="key file that keeps the peer ID stable")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between reads of the progress records")
    parser.add_argument("--signing-key-file", required=True, help="the experiment's token signing key")
    parser.add_argument("--token-minutes", type=float, default=60.0)
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    import hivemind

    from swarmhub.worker import swarm_access

    from .process import ServerPeerAccess, stop_event

    stop = stop_event()
    identity = Path(args.identity or os.path.join(os.path.dirname(args.signing_key_file), f"{args.run_id}.key"))
    access = ServerPeerAccess.load(args.run_id, args.signing_key_file, identity, args.token_minutes)
    swarm_access.use_as_process_key(access.own_key)
    own_key, signing_key = access.own_key, access.signing_key
    authorizer = swarm_access.SwarmAuthorizer(
        own_key,
        signing_key.get_public_key(),
        args.run_id,
        access.mint,
        first_token=access.mint(),
        refresh_margin=min(swarm_access.REFRESH_MARGIN, access.lifetime / 4),
        denied=swarm_access.DenyList(access.denied),
    )
    from swarmhub.server.settings import tcp_maddr

    dht = hivemind.DHT(
        host_maddrs=[tcp_maddr(args.host, args.port)],
        # Behind NAT the addresses the peer listens on reach no one outside: workers get the public one.
        announce_maddrs=[tcp_maddr(args.announce_host, args.port)] if args.announce_host else None,
        start=True,
        identity_path=str(identity),
        authorizer=authorizer,
    )
    # The same validators as the trainers' (their progress trackers' and their roster's): progress records and
    # roster entries are signed by each peer's key, and without the signature validator this node could neither
    # store nor read them, nor refuse an entry that someone else's key wrote.
    from hivemind.dht.schema import SchemaValidator
    from hivemind.optim.progress_tracker import TrainingProgressSchema

    progress_schema = SchemaValidator(TrainingProgressSchema, prefix=args.run_id)
    dht.add_validators([*swarm_access.roster_validators(args.run_id, own_key), progress_schema])
    try:
        emit(Ready(maddrs=[str(m) for m in dht.get_visible_maddrs()]))
        while not stop.is_set():
            try:
                emit(read_progress(dht, args.run_id, signing_key.get_public_key()))
            except Exception as exc:  # the monitor keeps the bootstrap node alive whatever a read does
                logging.warning("progress read failed: %r", exc)
            # Jittered: a fixed period can lock in phase with the swarm's epochs (a swarm of one with short
            # epochs pauses at the start of each, see training._loop) and then read every record at the
            # same point of its epoch, for example always before the peer's first step of it.
            stop.wait(args.interval * random.uniform(0.5, 1.5))
    finally:
        dht.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
