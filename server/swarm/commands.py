"""The command lines and files that the server's peer processes start from.

Each running experiment has a bootstrap + monitor peer (``bootstrap_peer.py``) and, when asked for, an auxiliary
peer (``aux_peer.py``) and a checkpoint peer (``checkpoint_peer.py``), its companions. ``SwarmHost`` (``host.py``)
starts and stops them; this module says what they are given (their configs and events are in ``events.py``).
Their files live in ``data_dir/peers``, named after the run::

    <run_id>.signing         the experiment's signing key (readable by this user only)
    <run_id>.key             the bootstrap peer's identity (so its peer ID survives a restart)
    <run_id>.<kind>.json     a companion's config (kind "aux", "aux1", ... for the witnesses, or "checkpoints")
    <run_id>.<kind>.key      a companion's identity
    <run_id>.deny            the removed volunteers, one username a line
    <run_id>.restore         the organizer's newest rollback, for the checkpoint peer
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarmhub.server.ledger.contributions import MONITOR_SECONDS
from swarmhub.server.swarm.events import AuxConfig, KeeperConfig

AUX = "aux"  # the auxiliary peer's files: <run_id>.aux.json, <run_id>.aux.key, <run_id>.aux.log


def aux_kind(index: int) -> str:
    """The files of auxiliary peer number ``index``: the first one's are ``aux`` (as before there were several),
    the others' ``aux1``, ``aux2``, ..."""
    return AUX if index == 0 else f"{AUX}{index}"


CHECKPOINTS = "checkpoints"  # the checkpoint peer's


@dataclass(frozen=True)
class Network:
    """What every peer process of the server is told about the network: where it listens and what it announces."""

    host: str
    token_minutes: float
    announce_host: str  # "": announce the addresses it listens on


def peers_folder(data_dir: Path) -> Path:
    return data_dir / "peers"


def restore_file(data_dir: Path, run_id: str) -> Path:
    return peers_folder(data_dir) / f"{run_id}.restore"


def write_signing_key(folder: Path, run_id: str, signing_key: str) -> Path:
    """The experiment's key, in a file only we can read: the peers mint their own swarm tokens with it."""
    key_file = folder / f"{run_id}.signing"
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(signing_key)
    return key_file


def _listening(network: Network, port: int) -> list[str]:
    return ["--host", network.host, "--port", str(port)]


def _announcing(network: Network) -> list[str]:
    return ["--announce-host", network.announce_host] if network.announce_host else []


def bootstrap_command(folder: Path, run_id: str, network: Network, port: int) -> list[str]:
    """The bootstrap + monitor peer's command line (``bootstrap_peer.py``)."""
    return [
        sys.executable,
        "-m",
        "swarmhub.server.swarm.bootstrap_peer",
        "--run-id",
        run_id,
        *_listening(network, port),
        "--identity",
        str(folder / f"{run_id}.key"),
        "--signing-key-file",
        str(folder / f"{run_id}.signing"),
        "--token-minutes",
        str(network.token_minutes),
        "--interval",
        str(MONITOR_SECONDS),
        *_announcing(network),
    ]


def companion_command(module: str, folder: Path, run_id: str, kind: str, network: Network, port: int) -> list[str]:
    """The command line of a companion peer (``module``: ``aux_peer`` or ``checkpoint_peer``), whose config and
    identity are the files of its ``kind``."""
    return [
        sys.executable,
        "-m",
        f"swarmhub.server.swarm.{module}",
        "--config",
        str(companion_config(folder, run_id, kind)),
        "--signing-key-file",
        str(folder / f"{run_id}.signing"),
        "--identity",
        str(folder / f"{run_id}.{kind}.key"),
        *_listening(network, port),
        "--token-minutes",
        str(network.token_minutes),
        *_announcing(network),
    ]


def companion_config(folder: Path, run_id: str, kind: str) -> Path:
    return folder / f"{run_id}.{kind}.json"


def companion_log(folder: Path, run_id: str, kind: str) -> Path:
    return folder / f"{run_id}.{kind}.log"


def write_aux_config(
    folder: Path, run_id: str, config: dict[str, Any], initial_peers: list[str], kind: str = AUX, index: int = 0
) -> None:
    """An auxiliary peer's config (``kind``: :func:`aux_kind`): ``config`` (the experiment's config and its corpus
    folder), where the swarm is, and its number among the experiment's witnesses."""
    aux = AuxConfig.model_validate({**config, "run_id": run_id, "initial_peers": initial_peers, "index": index})
    companion_config(folder, run_id, kind).write_text(aux.model_dump_json())


def write_keeper_config(
    data_dir: Path, run_id: str, config: dict[str, Any], initial_peers: list[str], checkpoints: Path
) -> None:
    """The checkpoint peer's config: ``config`` (the experiment's config, its corpus folder, how often to save),
    where the swarm is, the folder it saves to and the file its rollbacks come in."""
    keeper = KeeperConfig.model_validate(
        {
            **config,
            "run_id": run_id,
            "initial_peers": initial_peers,
            "folder": str(checkpoints),
            "restore_file": str(restore_file(data_dir, run_id)),
        }
    )
    companion_config(peers_folder(data_dir), run_id, CHECKPOINTS).write_text(keeper.model_dump_json())


def write_denied(data_dir: Path, run_id: str, usernames: list[str]) -> None:
    folder = peers_folder(data_dir)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / f"{run_id}.deny"
    text = "".join(f"{name}\n" for name in usernames)
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(".deny.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)  # the peer never reads half a list


def write_restore(data_dir: Path, run_id: str, order: dict[str, int] | None) -> None:
    """The organizer's newest rollback for the checkpoint peer (``rollback.py``), whole or absent."""
    path = restore_file(data_dir, run_id)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    text = json.dumps(order) if order is not None else ""
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(".restore.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
