"""Which peer a peer downloads the swarm's state from, and which state it refuses (``robust``'s overview says
why). ``install_state_guard`` replaces hivemind's ``_load_state_from_peers``; it runs in the averager's process."""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Sequence
from typing import Any

import torch

from swarmhub.worker.swarm import access as swarm_access
from swarmhub.worker.swarm import flags as peer_flags
from swarmhub.worker.swarm.aggregation import STATE_NORM_JUMP
from swarmhub.worker.swarm.epoch import Roster, bounded_progress
from swarmhub.worker.swarm.policy import POLICY

logger = logging.getLogger(__name__)
# Set by this peer's own state download, never by the source: the state came from the server's own peer.
FROM_SERVER_PEER = "swarmhub_from_server_peer"


def order_sources(
    priorities: dict[str, float], names: dict[str, str], bound: int | None, own_id: str
) -> tuple[list[str], list[str]]:
    """The peers to download state from, in order: within the epoch bound, the server's own peers first (when
    one is as new as the newest candidate less one epoch), then by epoch, newest first. Also the peers left
    out for advertising an epoch past the bound."""
    server = swarm_access.SERVER_PEER_USERNAME
    ahead = [
        p
        for p, epoch in priorities.items()
        if bound is not None and epoch > bound and p != own_id and names.get(p) != server  # the hub's are followed
    ]
    candidates = {p: e for p, e in priorities.items() if p != own_id and p not in ahead and p in names}
    if not candidates:
        return [], ahead
    newest = max(candidates.values())
    shuffled = list(candidates)
    random.shuffle(shuffled)  # ties in any order

    def rank(peer: str) -> tuple[bool, float]:
        trusted = names.get(peer) == server and candidates[peer] >= newest - 1
        return (trusted, candidates[peer])

    return sorted(shuffled, key=rank, reverse=True), ahead


def check_state(tensors: Sequence[torch.Tensor], reference: Sequence[torch.Tensor] | None) -> str | None:
    """Why a downloaded state must be refused, or None. ``reference`` is this peer's own parameters (the first
    tensors of a state are the parameters): a state whose parameters' norm is over STATE_NORM_JUMP times theirs
    is refused."""
    for tensor in tensors:
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return "state with non-finite values"
    if reference:
        own = math.sqrt(sum(float(t.float().norm()) ** 2 for t in reference))
        theirs = math.sqrt(sum(float(t.float().norm()) ** 2 for t in tensors[: len(reference)]))
        if own > 0 and theirs > STATE_NORM_JUMP * own:
            return f"state whose parameters' norm is {theirs / own:.0f}x this peer's"
    return None


def install_state_guard() -> None:
    """Replace ``DecentralizedAverager._load_state_from_peers`` (it runs in the averager's process)."""
    from hivemind.averaging.averager import DecentralizedAverager
    from hivemind.compression import deserialize_torch_tensor
    from hivemind.p2p import PeerID
    from hivemind.proto import averaging_pb2
    from hivemind.utils.asyncio import aiter_with_timeout
    from hivemind.utils.streaming import combine_from_streaming
    from hivemind.utils.timed_storage import ValueWithExpiration

    if getattr(DecentralizedAverager._load_state_from_peers, "__swarmhub__", False):
        return

    async def load_state_from_peers(self: Any, future: Any, timeout: float | None = None) -> None:
        if timeout is not None:
            timeout = self.next_chunk_timeout if self.next_chunk_timeout is not None else self.request_timeout
        try:
            # blocking DHT reads in the averager's loop, as hivemind's own version of this method makes
            prefix = self._matchmaking.group_key_manager.prefix
            found = self.dht.get(f"{prefix}.all_averagers", latest=True)
            priorities = {}
            for subkey, info in found.value.items() if found is not None and isinstance(found.value, dict) else ():
                if isinstance(info, ValueWithExpiration) and isinstance(info.value, int | float):
                    try:  # the subkeys are peer IDs as bytes
                        priorities[PeerID(subkey).to_base58()] = float(info.value)
                    except Exception:  # noqa: S112 - not a peer ID: nobody to download from
                        continue
            denied = swarm_access._GUARD.denied if swarm_access._GUARD is not None else None
            roster = Roster(self.dht, POLICY.run_id, POLICY.experiment_key, denied=denied)
            distrusted = peer_flags.distrusted()  # the peers whose state this process refused before, among others
            names = {peer: name for peer, name in roster.usernames().items() if peer not in distrusted}
            progress = self.dht.get(f"{POLICY.run_id}_progress", latest=True)
            # judged as a newcomer would (this process's copy of the local epoch is not kept current)
            _, bound, _ = bounded_progress(
                progress.value if progress is not None else None, names, POLICY.username, 0, distrusted
            )
            order, ahead = order_sources(priorities, names, bound, self.peer_id.to_base58())
            for peer in ahead:
                logger.warning("did not download state from %s: its epoch is past the swarm's (%s)", peer, bound)
                peer_flags.flag(peer, "state epoch ahead of the swarm")
            reference = None
            if not POLICY.trusted_state:
                main = getattr(self, "main_parameters", None)
                reference = [p.detach().cpu() for p in main] if main else None
            for peer in order:
                logger.info("downloading the swarm's state from %s", peer)
                try:
                    stub = self.get_stub(self._p2p, PeerID.from_base58(peer), namespace=self.prefix)
                    stream = await stub.rpc_download_state(averaging_pb2.DownloadRequest())
                    metadata: Any = None
                    parts: list[Any] = []
                    tensors: list[torch.Tensor] = []
                    async for message in aiter_with_timeout(stream, timeout=timeout):
                        if message.metadata:
                            metadata = self.serializer.loads(message.metadata)
                        if message.tensor_part.dtype and parts:
                            tensors.append(deserialize_torch_tensor(combine_from_streaming(parts)))
                            parts = []
                        parts.append(message.tensor_part)
                    if parts:
                        tensors.append(deserialize_torch_tensor(combine_from_streaming(parts)))
                    if not metadata:
                        continue
                    trusted = names.get(peer) == swarm_access.SERVER_PEER_USERNAME
                    why = check_state(tensors, None if trusted else reference)
                    if why is None and not isinstance(metadata, dict):
                        why = "state without its metadata"
                    if why is not None:
                        logger.warning("refused the state of %s: %s", peer, why)
                        peer_flags.flag(peer, why)
                        continue
                    # set here, over whatever the source sent: whether the loader may take its optimizer statistics
                    future.set_result((dict(metadata, **{FROM_SERVER_PEER: trusted}), tensors))
                    return
                except Exception as exc:
                    logger.warning("could not download the state of %s: %r", peer, exc)
        finally:
            if not future.done():
                future.set_result(None)

    load_state_from_peers.__swarmhub__ = True  # type: ignore[attr-defined]
    DecentralizedAverager._load_state_from_peers = load_state_from_peers
