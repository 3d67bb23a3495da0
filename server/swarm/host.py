"""Hosts the server's hivemind peer for every running experiment, each in its own process.

The peer (``bootstrap_peer.py``) is the swarm's bootstrap node and monitor. The host keeps the set of
peer processes equal to the set of running experiments (``reconcile``), restarts a peer that died,
and stops them all at shutdown. Peers keep their identity in ``data_dir/peers`` so that their
peer ID survives a server restart; ``commands.py`` builds their command lines and files, ``events.py`` reads
what they say.

Behind a firewall or NAT the operator gives a port range (``SWARMHUB_SWARM_PORTS``): each peer takes a
free port from it, and announces ``SWARMHUB_SWARM_ANNOUNCE_HOST`` (the public address) with that port
instead of the addresses it listens on.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarmhub.server.swarm import commands as peer_commands
from swarmhub.server.swarm import peer_logs, witnesses
from swarmhub.server.swarm.events import Checkpoint, Failed, Keeping, Progress, Ready, parse
from swarmhub.server.swarm.ports import PortRange, local_maddrs
from swarmhub.server.swarm.supervision import (
    AUX_STOP_SECONDS,
    KEEPER_STOP_SECONDS,
    MONITOR_STOP_SECONDS,
    PeerKind,
    Supervisor,
    terminate_all,
)

logger = logging.getLogger("swarmhub.swarm")
KEEPER_WAIT_SECONDS = 180.0  # joins wait this long at most for a starting checkpoint peer


@dataclass
class Peer:
    run_id: str
    process: subprocess.Popen[str]
    ready: threading.Event = field(default_factory=threading.Event)
    maddrs: list[str] = field(default_factory=list)
    progress: Progress | None = None  # its newest progress event
    started_at: float = field(default_factory=time.monotonic)
    port: int = 0  # 0: a random one


# per running experiment this process hosts: its signing key, its removed volunteers, the auxiliary peer's config
# and the checkpoint peer's (None: that peer is not run)
HostedSwarm = tuple[str, list[str], dict[str, Any] | None, dict[str, Any] | None]


class SwarmHost:
    def __init__(
        self,
        data_dir: Path,
        host: str,
        enabled: bool = True,
        token_minutes: float = 60.0,
        ports: range | None = None,
        announce_host: str = "",
        log_max_bytes: int = peer_logs.MAX_BYTES,
    ):
        self.data_dir = data_dir
        self.log_max_bytes = log_max_bytes  # each server-run peer's log, rotated (server/peer_logs.py)
        self.host = host
        self.enabled = enabled
        self.token_minutes = token_minutes
        self.ports = PortRange(host, ports)
        self.announce_host = announce_host if ports is not None else ""  # hivemind announces known ports only
        self._peers: dict[str, Peer] = {}
        # (run_id, index) -> the server's auxiliary peers (its witnesses, one per averaging group), when asked for
        self._aux: dict[tuple[str, int], subprocess.Popen[str]] = {}
        self._aux_ports: dict[tuple[str, int], int] = {}
        self._shrinking = witnesses.Shrinking()
        self._keepers: dict[str, subprocess.Popen[str]] = {}  # run_id -> the checkpoint peer, for tasks that keep them
        self._keeper_ports: dict[str, int] = {}
        self._keeper_ready: set[str] = set()  # run_ids whose checkpoint peer is in the swarm with its state
        self._keeper_started: dict[str, float] = {}
        self._lock = threading.Lock()
        self.supervisor = Supervisor(self._lock)  # restarts, backoff, last error and state of each peer process
        # Called (in the peer's reader thread) with each progress event: the verified-contribution ledger.
        self.on_progress: Callable[[str, Progress], None] | None = None
        self.on_ready: Callable[[str], None] | None = None  # a bootstrap peer listens now
        self.on_checkpoint: Callable[[str, Checkpoint], None] | None = None  # the checkpoint peer saved one

    def _read(self, peer: Peer) -> None:
        assert peer.process.stdout is not None
        for line in peer.process.stdout:
            event = parse(line)
            if isinstance(event, Ready):
                peer.maddrs = event.maddrs
                peer.ready.set()
                self.supervisor.record(peer.run_id, "monitor").in_swarm = True
                logger.info("swarm peer for %s listening on %s", peer.run_id, peer.maddrs)
                if self.on_ready is not None:
                    self.on_ready(peer.run_id)
            elif isinstance(event, Failed):
                self.supervisor.record(peer.run_id, "monitor").failed_with(event.error)
            elif isinstance(event, Progress):
                peer.progress = event
                if self.on_progress is not None:
                    try:
                        self.on_progress(peer.run_id, event)
                    except Exception:
                        logger.exception("could not record the swarm's progress for %s", peer.run_id)

    def _take_port(self, run_id: str, what: str) -> int | None:
        """A free port of the range (call with the lock held); 0 without a range; None when all are taken."""
        ours = {p.port for p in self._peers.values() if p.process.poll() is None}
        ours |= {self._aux_ports.get(key, 0) for key, process in self._aux.items() if process.poll() is None}
        ours |= {self._keeper_ports.get(r, 0) for r, process in self._keepers.items() if process.poll() is None}
        return self.ports.take(ours, run_id, what)

    @property
    def _network(self) -> peer_commands.Network:
        return peer_commands.Network(self.host, self.token_minutes, self.announce_host)

    # -- the peers ---------------------------------------------------------------------------------------------

    def start(self, run_id: str, signing_key: str) -> Peer | None:
        """Run the experiment's bootstrap + monitor peer unless it runs (or waits out its backoff); None when no
        port is free."""
        with self._lock:
            peer = self._peers.get(run_id)
            if peer is not None and peer.process.poll() is None:
                return peer
            if not self.supervisor.may_start(run_id, "monitor"):
                return None
            port = self._take_port(run_id, "swarm peer")
            if port is None:
                return None
            folder = peer_commands.peers_folder(self.data_dir)
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            peer_commands.write_signing_key(folder, run_id, signing_key)
            cmd = peer_commands.bootstrap_command(folder, run_id, self._network, port)
            # stdin stays open: the peer exits by itself when this process (and so the pipe) goes away.
            # Own session: a stuck peer and the processes hivemind forked for it can be killed as one group.
            process = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
            )
            peer = Peer(run_id=run_id, process=process, port=port)
            self._peers[run_id] = peer
            reader = threading.Thread(target=self._read, args=(peer,), daemon=True, name=f"peer-{run_id}")
            reader.start()
            self.supervisor.watch(
                run_id, "monitor", process, lambda: getattr(self._peers.get(run_id), "process", None), reader
            )
            logger.info("started swarm peer for %s (pid %s)", run_id, process.pid)
            return peer

    def _companion_slot(
        self, run_id: str, process: subprocess.Popen[Any] | None, kind: PeerKind, what: str, index: int = 0
    ) -> tuple[list[str], int] | None:
        """Where a companion of the bootstrap peer (the auxiliary or the checkpoint peer) finds the swarm and the
        port it listens on (call with the lock held); None while it runs (``process``), before the bootstrap peer
        is ready and when no port is free."""
        peer = self._peers.get(run_id)
        if (process is not None and process.poll() is None) or peer is None or not peer.ready.is_set():
            return None
        if not self.supervisor.may_start(run_id, kind, index):
            return None
        port = self._take_port(run_id, what)
        if port is None:
            return None
        return (local_maddrs(self.host, peer.port, peer.maddrs) if self.announce_host else peer.maddrs), port

    def start_aux(self, run_id: str, config: dict[str, Any], index: int = 0) -> None:
        """Run the experiment's auxiliary peer number ``index`` (``aux_peer.py``, a witness of the swarm's rounds)
        once its bootstrap peer is ready. ``config``: the experiment's config and its corpus folder
        (``events.AuxConfig``)."""
        key = (run_id, index)
        with self._lock:
            slot = self._companion_slot(run_id, self._aux.get(key), "witness", "auxiliary peer", index)
            if slot is None:
                return
            initial_peers, port = slot
            folder = peer_commands.peers_folder(self.data_dir)
            kind = peer_commands.aux_kind(index)
            peer_commands.write_aux_config(folder, run_id, config, initial_peers, kind, index)
            cmd = peer_commands.companion_command("aux_peer", folder, run_id, kind, self._network, port)
            process = self._popen_companion(cmd, peer_commands.companion_log(folder, run_id, kind))
            self._aux[key] = process
            self._aux_ports[key] = port
            reader = threading.Thread(
                target=self._read_companion,
                args=(run_id, "witness", process, index),
                daemon=True,
                name=f"{kind}-{run_id}",
            )
            reader.start()
            self.supervisor.watch(run_id, "witness", process, lambda: self._aux.get(key), reader, index)
            logger.info("started auxiliary peer %d for %s (pid %s)", index, run_id, process.pid)

    def _popen_companion(self, cmd: list[str], log: Path) -> subprocess.Popen[str]:
        """A companion peer: its events on stdout (text), its log (stderr) copied into ``log``, capped."""
        process = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        stderr: Any = process.stderr  # text mode (stdout carries its events); the log is copied as bytes
        peer_logs.copy_to_log(stderr.buffer, log, self.log_max_bytes)
        return process

    def _read_companion(self, run_id: str, kind: PeerKind, process: subprocess.Popen[str], index: int = 0) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            event = parse(line)
            if isinstance(event, Failed):
                self.supervisor.record(run_id, kind, index).failed_with(event.error)
            elif isinstance(event, Ready):
                record = self.supervisor.record(run_id, kind, index)
                record.in_swarm, record.peer_id = True, event.peer_id
                logger.info("the %s peer of %s is in the swarm as %s", kind, run_id, event.peer_id)

    def start_keeper(self, run_id: str, config: dict[str, Any]) -> None:
        """Run the experiment's checkpoint peer (``checkpoint_peer.py``) once its bootstrap peer is ready.
        ``config``: the experiment's config, its corpus folder, and how often to save."""
        with self._lock:
            slot = self._companion_slot(run_id, self._keepers.get(run_id), "checkpoints", "checkpoint peer")
            if slot is None:
                return
            initial_peers, port = slot
            folder = peer_commands.peers_folder(self.data_dir)
            checkpoints = self.data_dir / "checkpoints" / run_id
            checkpoints.mkdir(parents=True, exist_ok=True)
            peer_commands.write_keeper_config(self.data_dir, run_id, config, initial_peers, checkpoints)
            kind = peer_commands.CHECKPOINTS
            cmd = peer_commands.companion_command("checkpoint_peer", folder, run_id, kind, self._network, port)
            process = self._popen_companion(cmd, peer_commands.companion_log(folder, run_id, kind))
            self._keepers[run_id] = process
            self._keeper_ports[run_id] = port
            self._keeper_ready.discard(run_id)
            self._keeper_started[run_id] = time.monotonic()
            reader = threading.Thread(
                target=self._read_keeper, args=(run_id, process), daemon=True, name=f"keeper-{run_id}"
            )
            reader.start()
            self.supervisor.watch(run_id, "checkpoints", process, lambda: self._keepers.get(run_id), reader)
            logger.info("started the checkpoint peer for %s (pid %s)", run_id, process.pid)

    def _read_keeper(self, run_id: str, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            event = parse(line)
            if isinstance(event, Failed):
                self.supervisor.record(run_id, "checkpoints").failed_with(event.error)
            elif isinstance(event, Ready):
                self.supervisor.record(run_id, "checkpoints").in_swarm = True
            elif isinstance(event, Keeping):
                self._keeper_ready.add(run_id)
                logger.info("the checkpoint peer of %s is in the swarm at step %s", run_id, event.epoch)
                if self.on_ready is not None:
                    self.on_ready(run_id)  # volunteers may join now
            elif isinstance(event, Checkpoint) and self.on_checkpoint is not None:
                try:
                    self.on_checkpoint(run_id, event)
                except Exception:
                    logger.exception("could not record a checkpoint of %s", run_id)

    def stop_keeper(self, run_id: str, timeout: float = KEEPER_STOP_SECONDS) -> None:
        process = self._detach_keeper(run_id)
        if process is not None:
            terminate_all([(process, timeout, f"the checkpoint peer for {run_id}")])

    def _detach_keeper(self, run_id: str) -> subprocess.Popen[str] | None:
        """The run's checkpoint peer, no longer kept or watched (the caller stops it)."""
        with self._lock:
            process = self._keepers.pop(run_id, None)
            self._keeper_ports.pop(run_id, None)
            self.supervisor.forget(run_id, "checkpoints")
        return process

    def keeper_pending(self, run_id: str) -> bool:
        """Whether volunteers should wait for the checkpoint peer: it is starting (for at most
        ``KEEPER_WAIT_SECONDS``), and once it is in, the first of them loads the newest checkpoint from it
        instead of starting the model from scratch."""
        process = self._keepers.get(run_id)
        if process is None or process.poll() is not None or run_id in self._keeper_ready:
            return False
        return time.monotonic() - self._keeper_started.get(run_id, 0.0) < KEEPER_WAIT_SECONDS

    def stop_aux(self, run_id: str, timeout: float = AUX_STOP_SECONDS, first: int = 0) -> int | None:
        """Stop the auxiliary peers numbered ``first`` and above; the first one's exit code (0: it left the swarm
        cleanly), None when none ran."""
        stopping = self._detach_aux(run_id, first)
        terminate_all([(process, timeout, f"auxiliary peer {index} for {run_id}") for index, process in stopping])
        return stopping[0][1].returncode if stopping else None

    def _detach_aux(self, run_id: str, first: int = 0) -> list[tuple[int, subprocess.Popen[str]]]:
        """The run's auxiliary peers numbered ``first`` and above, no longer kept or watched (the caller stops
        them)."""
        with self._lock:
            keys = sorted(key for key in self._aux if key[0] == run_id and key[1] >= first)
            stopping = [(key[1], self._aux.pop(key)) for key in keys]
            for key in keys:
                self._aux_ports.pop(key, None)
                self.supervisor.forget(run_id, "witness", key[1])
        return stopping

    def aux_running(self, run_id: str, index: int = 0) -> bool:
        process = self._aux.get((run_id, index))
        return process is not None and process.poll() is None

    def witnesses_wanted(self, run_id: str, group_size: int) -> int:
        """How many witnesses the swarm needs now (``witnesses.wanted``, from the monitor's last count)."""
        peer = self._peers.get(run_id)
        progress = peer.progress if peer is not None else None
        return witnesses.wanted(progress.volunteer_peers if progress is not None else None, group_size)

    def _keep_witnesses(self, run_id: str, config: dict[str, Any]) -> None:
        """Run as many witnesses as :meth:`witnesses_wanted` (see ``witnesses.py``)."""
        group_size = int((config.get("experiment") or {}).get("group_size") or 0)
        wanted = self.witnesses_wanted(run_id, group_size)
        for index in range(wanted):
            self.start_aux(run_id, config, index)
        running = 1 + max((key[1] for key in self._aux if key[0] == run_id), default=0)
        if self._shrinking.due(run_id, running, wanted):
            self.stop_aux(run_id, first=wanted)

    def stop(self, run_id: str, timeout: float = MONITOR_STOP_SECONDS) -> None:
        """Stop every peer of the run at once (``supervision.terminate_all``)."""
        self._stop_runs([run_id], timeout)

    def _stop_runs(self, run_ids: list[str], timeout: float = MONITOR_STOP_SECONDS) -> None:
        stopping: list[tuple[subprocess.Popen[Any], float, str]] = []
        for run_id in run_ids:
            stopping += [(p, AUX_STOP_SECONDS, f"auxiliary peer {i} for {run_id}") for i, p in self._detach_aux(run_id)]
            if (keeper := self._detach_keeper(run_id)) is not None:
                stopping.append((keeper, KEEPER_STOP_SECONDS, f"the checkpoint peer for {run_id}"))
            with self._lock:
                peer = self._peers.pop(run_id, None)
                self.supervisor.forget(run_id, "monitor")
            if peer is not None:
                stopping.append((peer.process, timeout, f"swarm peer for {run_id}"))
        terminate_all(stopping)

    def reconcile(self, running: dict[str, HostedSwarm]) -> None:
        """Run exactly one peer per running experiment (run_id -> signing key, removed usernames, the
        experiment's config when it asks for an auxiliary peer, and the checkpoint peer's config when its task
        keeps checkpoints); restart any that died; keep each peer's deny-list file current."""
        if not self.enabled:
            return
        for run_id in list(self._peers):
            if run_id not in running:
                self.stop(run_id)
        for run_id, (signing_key, denied, aux, keeper) in running.items():
            self.write_denied(run_id, denied)
            self.start(run_id, signing_key)
            if aux is not None:
                self._keep_witnesses(run_id, aux)
            elif any(key[0] == run_id for key in self._aux):
                self.stop_aux(run_id)
            if keeper is not None:
                self.write_restore(run_id, keeper.get("restore"))
                self.start_keeper(run_id, keeper)
            elif run_id in self._keepers:
                self.stop_keeper(run_id)

    def write_denied(self, run_id: str, usernames: list[str]) -> None:
        peer_commands.write_denied(self.data_dir, run_id, usernames)

    def restore_file(self, run_id: str) -> Path:
        return peer_commands.restore_file(self.data_dir, run_id)

    def write_restore(self, run_id: str, order: dict[str, int] | None) -> None:
        """The organizer's newest rollback for the checkpoint peer (``rollback.py``), whole or absent."""
        peer_commands.write_restore(self.data_dir, run_id, order)

    def swarm_peers(self, run_id: str) -> int | None:
        peer = self._peers.get(run_id)
        if peer is None or not peer.progress:
            return None
        return peer.progress.peers

    def hosted(self) -> list[str]:
        """The run_ids this process runs a bootstrap peer for."""
        return list(self._peers)

    def maddrs(self, run_id: str) -> list[str]:
        peer = self._peers.get(run_id)
        return list(peer.maddrs) if peer is not None and peer.ready.is_set() else []

    def peer_counts(self) -> dict[str, int]:
        """run_id -> peers its monitor saw in the swarm at its last read."""
        return {run_id: peer.progress.peers for run_id, peer in list(self._peers.items()) if peer.progress}

    def close(self) -> None:
        """Stop every peer of every run, all at once."""
        self._stop_runs(sorted({*self._keepers, *(key[0] for key in self._aux), *self._peers}))
