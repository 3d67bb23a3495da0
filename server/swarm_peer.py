"""The server's peer for one experiment: the swarm's bootstrap node and its monitor.

Run as its own process (hivemind objects must never cross a ``spawn``):

    python -m swarmhub.server.swarm_peer --run-id RUN --host 127.0.0.1 [--port 0] [--announce-host HOST]
        [--identity PATH]

It speaks JSON lines on stdout:

- ``{"event": "ready", "maddrs": [...]}`` once the DHT is up: the addresses workers bootstrap from;
- ``{"event": "progress", "epoch": E, "peers": N, "samples_per_second": S, "samples": A, "contributors": [...]}``
  about every ``--interval`` seconds (jittered), read from the peers' signed ``{run_id}_progress`` records;
  each contributor is ``{peer_id, username, epoch, samples, samples_per_second, time, client_mode}``, attributed through
  the access token of the key that signed the record (see ``read_progress``).

It shuts down cleanly (no orphaned ``p2pd`` or averager processes) on SIGTERM, SIGINT, or when its
stdin closes, so it never outlives the server that started it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import sys
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any


def _emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


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
    parser = argparse.ArgumentParser(prog="swarmhub-swarm-peer")
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

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    # Watch the parent's pipe on a private copy of fd 0 and give fd 0 /dev/null: hivemind forks its DHT
    # process, and a forked child that closes a stdin another thread is blocked reading would deadlock.
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

    from swarmhub.worker import swarm_access

    with open(args.signing_key_file) as handle:
        signing_key = swarm_access.signing_key_from_text(handle.read().strip())
    identity = Path(args.identity or os.path.join(os.path.dirname(args.signing_key_file), f"{args.run_id}.key"))
    own_key = swarm_access.load_or_create_identity(identity)
    swarm_access.use_as_process_key(own_key)
    public_key = own_key.get_public_key().to_bytes()
    lifetime = timedelta(minutes=args.token_minutes)

    def mint() -> Any:  # this peer is the server's own: it signs its token itself, under the reserved name
        name = swarm_access.SERVER_PEER_USERNAME
        return swarm_access.sign_token(signing_key, args.run_id, name, public_key, lifetime)

    deny_file = Path(args.signing_key_file).with_suffix(".deny")

    def denied() -> set[str]:  # the server keeps this file current (one username a line)
        return set(deny_file.read_text().split()) if deny_file.exists() else set()

    authorizer = swarm_access.SwarmAuthorizer(
        own_key,
        signing_key.get_public_key(),
        args.run_id,
        mint,
        first_token=mint(),
        refresh_margin=min(swarm_access.REFRESH_MARGIN, lifetime / 4),
        denied=swarm_access.DenyList(denied),
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
        _emit({"event": "ready", "maddrs": [str(m) for m in dht.get_visible_maddrs()]})
        while not stop.is_set():
            try:
                _emit(read_progress(dht, args.run_id, signing_key.get_public_key()))
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
