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

from swarmhub.server.swarm.events import Ready
from swarmhub.server.swarm.process import emit, run


class MonitorRoster:
    """The roster as the monitor last read it, read again only when a record needs it: a round of the witness's
    that names a peer it does not hold and that is newer than its last read (the witness admits only peers on the
    roster, so a read after the round holds its senders), any other peer it does not hold at most every
    ``UNKNOWN_SECONDS`` (a record signed by a key that is on no roster entry counts in the totals and is credited to
    no one), and at least every ``REFRESH_SECONDS``. In a steady swarm the monitor reads the progress and witness
    records each interval and the roster about every half minute, where it read all three. Entries cannot be taken
    back before their tokens expire, so a peer admitted by the last read is admitted by a new one until then."""

    REFRESH_SECONDS = 30.0
    UNKNOWN_SECONDS = 5.0

    def __init__(self, experiment_key: Any, run_id: str):
        from swarmhub.worker.swarm import access as swarm_access

        self.guard = swarm_access.RosterGuard(experiment_key, run_id)
        self.run_id = run_id
        self.reads = 0
        self._admitted: dict[str, float] = {}
        self._read_at = float("-inf")  # time.time() of the last read

    def _live(self, now: float) -> dict[str, float]:
        return {peer: expiry for peer, expiry in self._admitted.items() if expiry == 0.0 or expiry > now}

    def admitted(self, dht: Any, needed: set[str], in_rounds: dict[str, float]) -> dict[str, float]:
        """Peer ID -> token expiry of the peers the roster admits now. ``needed``: peers to attribute; ``in_rounds``:
        round senders with the time of their newest round."""
        import time

        from swarmhub.worker.swarm import access as swarm_access

        now = time.time()
        live = self._live(now)
        unknown = (needed | in_rounds.keys()) - live.keys()
        if (
            now - self._read_at >= self.REFRESH_SECONDS
            or any(in_rounds.get(peer, float("-inf")) >= self._read_at for peer in unknown)
            or (unknown and now - self._read_at >= self.UNKNOWN_SECONDS)
        ):
            self._read_at = time.time()
            self._admitted = self.guard.admit(dht.get(swarm_access.roster_key(self.run_id), latest=True))
            self.reads += 1
            live = self._live(now)
        return live


def read_progress(dht: Any, run_id: str, roster: MonitorRoster | None = None) -> dict[str, Any]:
    """Summarise the swarm's progress records, as hivemind's ProgressTracker does, and attribute each
    record to a volunteer (``contributors``) when a ``roster`` (``MonitorRoster``) is given.

    A record is attributed only when the key that signed it (hivemind's RSASignatureValidator checked the
    signature when the record was stored and read) is the key of a valid access token on the run's roster:
    the token, signed by the experiment's key, names the volunteer. Anything else is counted in the
    swarm's totals but credited to no one.
    """
    from hivemind.optim.progress_tracker import LocalTrainingProgress

    from swarmhub.worker.swarm import witness
    from swarmhub.worker.swarm.epoch import owner_peer_id

    record = dht.get(f"{run_id}_progress", latest=True)
    peers: list[tuple[str | None, LocalTrainingProgress]] = []
    if record is not None and isinstance(record.value, dict):
        for subkey, entry in record.value.items():
            try:
                peers.append((owner_peer_id(subkey), LocalTrainingProgress.parse_obj(entry.value)))
            except Exception:  # noqa: S112 - a malformed record from one peer must not stop the monitor
                continue
    event: dict[str, Any] = {
        "event": "progress",
        "epoch": max((p.epoch for _, p in peers), default=0),
        "peers": len(peers),
        "samples_per_second": round(sum(p.samples_per_second for _, p in peers), 3),
        "samples": sum(p.samples_accumulated for _, p in peers),
    }
    if roster is None:
        return event
    published = _witness_items(dht.get(witness.witness_key(run_id), latest=True))
    needed = {peer for peer, _ in peers if peer is not None}
    in_rounds: dict[str, float] = {}
    for signer, rounds, flags in published:
        needed.add(signer)
        needed.update(item["peer_id"] for item in flags if isinstance(item.get("peer_id"), str))
        for item in rounds:
            at = item.get("time") if isinstance(item, dict) else None
            if isinstance(at, int | float):
                for peer, *_ in _senders(item):
                    in_rounds[peer] = max(in_rounds.get(peer, float("-inf")), float(at))
    admitted = roster.admitted(dht, needed, in_rounds)
    contributors = []
    for peer_id, progress in peers:
        if peer_id is None or peer_id not in admitted:
            continue
        contributors.append(
            {
                "peer_id": peer_id,
                "username": roster.guard.username_of(peer_id),
                "epoch": progress.epoch,
                "samples": progress.samples_accumulated,
                "samples_per_second": round(progress.samples_per_second, 3),
                "time": progress.time,
                "client_mode": progress.client_mode,
            }
        )
    event["contributors"] = contributors
    event["rounds"], event["flags"] = read_witness(published, roster.guard, admitted)
    event["roster_reads"] = roster.reads
    return event


def _senders(item: dict[str, Any]) -> list[Any]:
    senders = item.get("senders")
    if not isinstance(senders, list):
        return []
    return [s for s in senders if isinstance(s, list | tuple) and len(s) == 2 and isinstance(s[0], str)]


def _witness_items(record: Any) -> list[tuple[str, list[Any], list[Any]]]:
    """(signer, rounds, flags) of each entry of the witness record, as published (not yet checked)."""
    from swarmhub.worker.swarm.epoch import owner_peer_id

    if record is None or not isinstance(record.value, dict):
        return []
    items: list[tuple[str, list[Any], list[Any]]] = []
    for subkey, entry in record.value.items():
        signer = owner_peer_id(subkey)
        value = entry.value if isinstance(entry.value, dict) else {}
        if signer is None:
            continue
        rounds, flags = value.get("rounds"), value.get("flags")
        items.append(
            (
                signer,
                rounds if isinstance(rounds, list) else [],
                [f for f in flags if isinstance(f, dict)] if isinstance(flags, list) else [],
            )
        )
    return items


def read_witness(
    published: list[tuple[str, list[Any], list[Any]]], roster: Any, admitted: dict[str, float]
) -> tuple[list[Any], list[Any]]:
    """The rounds and flags that the server's own peers published (``worker/swarm/witness.py``), their peers attributed
    through the roster. A record counts only when the key that signed it holds a valid token as the server's peer:
    a volunteer's peer can publish under this key too, and is ignored."""
    from swarmhub.worker.swarm import access as swarm_access

    rounds: dict[str, Any] = {}
    flags: dict[str, Any] = {}

    def attributed(peer_id: Any) -> str | None:
        return roster.username_of(peer_id) if isinstance(peer_id, str) and peer_id in admitted else None

    for signer, published_rounds, published_flags in published:
        if signer not in admitted or roster.username_of(signer) != swarm_access.SERVER_PEER_USERNAME:
            continue
        for item in published_rounds:
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
        for item in published_flags:
            if (name := attributed(item.get("peer_id"))) is not None:
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

    from swarmhub.server.swarm.process import ServerPeerAccess, stop_event
    from swarmhub.worker.swarm import access as swarm_access

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
    from swarmhub.server.core.settings import tcp_maddr

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
        roster = MonitorRoster(signing_key.get_public_key(), args.run_id)
        while not stop.is_set():
            try:
                emit(read_progress(dht, args.run_id, roster))
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
    sys.exit(run(main))
