"""What a peer accepts from strangers in the swarm: averaged parts, the swarm's epoch, and downloaded state.

hivemind 1.1.12 trusts every peer in a round: a reducer sums ``part * weight`` as parts arrive, weights are what
each sender claims, the swarm's epoch is the largest any progress record states, and a joiner downloads the
state of whichever peer advertises the highest priority. :func:`install` replaces those three points in this
process (and in the averager processes hivemind forks from it afterwards):

- **Averaging** (:class:`GuardedPartReducer`): a reducer holds the parts of one round's current slice from every
  sender, then drops a part that is not finite (the sender is flagged), caps each claimed weight (at the
  experiment's ``target_batch_size``, and with three senders or more at ``WEIGHT_MEDIAN_FACTOR`` times the
  median claim), and combines the rest with the experiment's ``aggregation``: ``mean`` or ``centered-clip``
  (CenteredClip, Karimireddy et al. 2021, run by each reducer on its slice as in Gorbunov et al. 2022); a state
  round is the bounded mean. The arithmetic is in ``aggregation.py``. An averaged part that a reducer sends back is
  kept only where it is finite.
- **The swarm's epoch** (:func:`epoch_bound`): one vote per account (the largest epoch among its peers'
  records; the server's peers are one account); a record more than one epoch past both this peer's epoch and
  the lower median of the other accounts' votes is ignored. With two other accounts or more in the swarm, a
  peer with a made-up epoch can neither make the swarm's peers download state nor move their schedule, unless
  it holds half of those accounts.
- **State download** (:func:`order_sources`, :func:`check_state`): only from peers whose advertised epoch is
  within that bound, the server's own peers first; a state with a non-finite tensor, or whose parameters'
  norm is over ``STATE_NORM_JUMP`` times this peer's own (a volunteer's peer) is refused and its source flagged.

Refusals are logged and counted in ``peer_flags`` (peer ID -> reasons), which :func:`take_flags` hands to whoever
reports them. A peer flagged with evidence (anything but :data:`LOCAL_REASONS`) is also *distrusted* for
``DISTRUST_SECONDS`` (:func:`distrusted`): its progress records are not followed and its state is not downloaded.
Without that, a peer whose state was refused but whose records stay one epoch ahead keeps every honest peer
"out of sync": each step asks for the swarm's state again and refuses it again, and nobody trains.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from typing import Any

import torch

from swarmhub.worker.swarm import flags as peer_flags
from swarmhub.worker.swarm.aggregation import (
    AGGREGATIONS,
    ROBUST_STATE,
    STANDING_EARLY_PARTS,
    STANDING_FLAG_T,
    WEIGHT_FLAG_FACTOR,
    Standing,
    capped_weights,
    combine,
    finite,
)
from swarmhub.worker.swarm.flags import (
    DISTRUST_SECONDS,
    FLAGS,
    LOCAL_REASONS,
    PARTNER_SECONDS,
    averaged_with,
    distrusted,
    flag,
    partners,
    take_flags,
)
from swarmhub.worker.swarm.policy import POLICY
from swarmhub.worker.swarm.state_guard import install_state_guard

logger = logging.getLogger(__name__)


# Each sender's standing in this process's gradient rounds under centered-clip (``aggregation.Standing``): it lives
# as long as the averager's process, across rounds, which is what lets it tell a sign-flipped or noise part of an
# honest norm from an honest one.
STANDING = Standing()
DISSENT_REASON = "gradients against the swarm's"
UNRELATED_REASON = "gradients unrelated to the swarm's"  # noise: a freeloader's parts, which train nothing


def _reducer_base() -> type:
    from hivemind.averaging.partition import TensorPartReducer

    return TensorPartReducer


class _Held:
    """The parts of the current slice that the senders sent, before they are combined."""

    def __init__(self) -> None:
        self.parts: list[torch.Tensor] = []
        self.weights: list[float] = []
        self.senders: list[int] = []


def make_reducer_class() -> type:
    from hivemind.averaging.partition import AllreduceException, BannedException

    base = _reducer_base()

    class GuardedPartReducer(base):  # type: ignore[misc, valid-type]
        """hivemind's reducer, holding a slice's parts until every sender's is in, then combining them with
        :func:`combine` (non-finite parts dropped, weights capped, ``POLICY.aggregation``).

        Memory: one slice (hivemind's part size, 512 KiB by default) per sender at a time."""

        def __init__(
            self,
            part_shapes: Sequence[torch.Size],
            num_senders: int,
            sender_ids: Sequence[str] = (),
            aggregation: str | None = None,
            own_id: str | None = None,
        ):
            self.sender_ids = list(sender_ids)
            self.own_id = own_id  # this peer's own part can be left out like any other, never flagged
            self.aggregation = aggregation  # None: the experiment's (POLICY.aggregation), read when combining
            self.claimed = [0.0] * num_senders  # the largest weight each sender claimed in this round
            self.dropped: set[int] = set()
            self.overclaimed: set[int] = set()
            self.dissented: set[int] = set()  # screened out of a part by its standing: no say, and no credit
            self._held = _Held()
            super().__init__(part_shapes, num_senders)

        def reset_accumulators(self) -> None:
            done = self.current_part_accumulated_from == self.num_current_senders  # type: ignore[has-type]
            assert done or self.current_part_index == -1
            if self.current_part_index >= self.num_parts - 1:
                self.finalize()
                return
            self.current_part_index += 1
            self.current_part_accumulated_from = 0
            self.current_part_future: asyncio.Future[Any] = asyncio.Future()
            self.num_current_senders = sum(self.current_part_index < failed for failed in self.sender_failed_after)
            self.accumulator = None
            self.denominator = 0.0
            self._held = _Held()

        async def accumulate_part(
            self, sender_index: int, part_index: int, tensor_part: torch.Tensor, weight: float = 1.0
        ) -> torch.Tensor:
            if not 0 <= sender_index < self.num_senders or not 0 <= part_index < self.num_parts:
                raise AllreduceException("a part out of range")
            self.num_parts_received[sender_index] += 1
            while part_index > self.current_part_index:  # slices are combined in order
                await asyncio.wait(
                    {self.current_part_future, asyncio.create_task(self.finished.wait())},
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if self.finished.is_set():
                    raise AllreduceException(f"attempted to aggregate part in a finalized {type(self).__name__}")
            if self.sender_failed_after[sender_index] != float("inf"):
                raise BannedException(f"sender {sender_index} was banned in background")
            if part_index != self.current_part_index:
                raise AllreduceException("a part sent twice")
            future = self.current_part_future
            if part_index < self.sender_failed_after[sender_index]:
                if tensor_part.shape != self.part_shapes[part_index]:
                    raise AllreduceException("a part of the wrong shape")
                self.claimed[sender_index] = max(self.claimed[sender_index], float(weight))
                if weight > POLICY.flag_weight and sender_index not in self.overclaimed:
                    self.overclaimed.add(sender_index)
                    who = self.sender_ids[sender_index] if sender_index < len(self.sender_ids) else "?"
                    logger.warning("%s claimed a weight of %.3g in a round (capped)", who, weight)
                    flag(who, "claimed weight far over the target batch")
                if not finite(tensor_part) or not math.isfinite(weight):
                    if sender_index not in self.dropped:
                        self.dropped.add(sender_index)
                        who = self.sender_ids[sender_index] if sender_index < len(self.sender_ids) else "?"
                        logger.warning("dropped a non-finite part from %s", who)
                        flag(who, "non-finite gradients")
                    weight = 0.0
                self._held.parts.append(tensor_part)
                self._held.weights.append(float(weight))
                self._held.senders.append(sender_index)
                self.current_part_accumulated_from += 1
                self.check_current_part_finished()
            return await future

        def _who(self, sender_index: int) -> str:
            return self.sender_ids[sender_index] if sender_index < len(self.sender_ids) else f"sender-{sender_index}"

        def _dissent(self, sender_index: int, who: str) -> None:
            """``who`` was screened out of a part by its standing: no credit for this round, and a flag when, after
            ``STANDING_EARLY_PARTS`` parts, its standing is under the bound it was held to (zero, or half the
            others' median) by ``STANDING_FLAG_T`` standard errors of its agreements or more: evidence over rounds,
            not a few parts' chance. ``DISSENT_REASON`` when its standing is under zero by as many standard errors
            too (against the others, as a sign-flipper's), ``UNRELATED_REASON`` otherwise (near zero, as noise's:
            its sign alone is chance, and named noise a sign-flipper in one run of three reducers in eight)."""
            if sender_index in self.dissented:
                return
            self.dissented.add(sender_index)
            bound = STANDING.held_to.get(who, 0.0)
            score, seen, evidence = STANDING.score[who], STANDING.seen[who], STANDING.evidence(who, bound)
            logger.warning(
                "left out %s's part: its gradients stand apart from the swarm's (standing %.3f over %d parts, %.1f"
                " standard errors from the %.3f it was held to)",
                who,
                score,
                seen,
                evidence,
                bound,
            )
            if who != self.own_id and seen >= STANDING_EARLY_PARTS and evidence <= -STANDING_FLAG_T:
                against = STANDING.evidence(who, 0.0) <= -STANDING_FLAG_T
                flag(who, DISSENT_REASON if against else UNRELATED_REASON)

        def check_current_part_finished(self) -> None:
            assert self.current_part_accumulated_from <= self.num_current_senders
            if self.current_part_accumulated_from == self.num_current_senders:
                held = self._held
                if held.parts:
                    weights = capped_weights(held.weights, POLICY.max_weight)
                    aggregation = self.aggregation or POLICY.aggregation
                    if aggregation == "state" and POLICY.aggregation == "centered-clip":
                        aggregation = ROBUST_STATE
                    ids = [self._who(i) for i in held.senders]
                    standing = STANDING if aggregation == "centered-clip" else None
                    result = combine(held.parts, weights, aggregation, ids, standing)
                    for who in standing.left_out if standing is not None else ():
                        self._dissent(held.senders[ids.index(who)], who)
                else:
                    result = torch.zeros(self.part_shapes[self.current_part_index])
                self.current_part_future.set_result(result)
                self.reset_accumulators()

    return GuardedPartReducer


def make_runner_class() -> type:
    from hivemind.averaging.allreduce import AllReduceRunner

    reducer_class = make_reducer_class()

    class GuardedAllReduceRunner(AllReduceRunner):  # type: ignore[misc, valid-type]
        """hivemind's all-reduce with :class:`GuardedPartReducer`, keeping only the finite entries of what other
        reducers send back (elsewhere this peer keeps its own value)."""

        def __init__(self, **kwargs: Any):
            super().__init__(**kwargs)
            # hivemind's own reducer is replaced before any part arrives: mark it finished so that its finalizer
            # does not log a spurious "received 0.0% of input tensors" for every round
            vars(self)["tensor_part_reducer"].finished.set()
            shapes = tuple(part.shape for part in self.parts_for_local_averaging)
            senders = [peer.to_base58() for peer in self.sender_peer_ids]
            # gradients are combined the experiment's way; the state averager's rounds (parameters) by state_parts
            gradients = (self._prefix or "").endswith("_grad_averager")
            self.tensor_part_reducer = reducer_class(
                shapes, len(self.sender_peer_ids), senders, None if gradients else "state", self.peer_id.to_base58()
            )
            container = self.tensor_part_container
            register = container.register_processed_part
            ordered = [peer.to_base58() for peer in self.ordered_peer_ids]

            # A reducer sends back the average less this peer's own part: where this peer's own values were not
            # finite, neither is what comes back, through no fault of the reducer's (the reducer left them out).
            # Checked only when a non-finite answer arrives (a pass over the whole vector), once per round: the
            # answers registered so far are finite or zeroed, so they cannot change what the check finds.
            own_finite: list[bool] = []

            def register_finite(peer_index: int, part_index: int, delta: torch.Tensor) -> None:
                if not finite(delta):
                    if not own_finite:
                        own_finite.append(all(finite(tensor) for tensor in container.local_tensors))
                    if own_finite[0]:
                        logger.warning("a reducer sent back non-finite values: kept this peer's own there")
                        flag(ordered[peer_index], "non-finite averaged part")
                    else:
                        logger.warning("this peer's own part was not finite: kept its own values, flagged no one")
                    delta = torch.nan_to_num(delta, nan=0.0, posinf=0.0, neginf=0.0)
                register(peer_index, part_index, delta)

            container.register_processed_part = register_finite

        async def rpc_aggregate_part(self, stream: Any, context: Any) -> Any:
            """hivemind's handler, with each answer's delivery bounded. hivemind bounds the wait for a sender's next
            part, but not the wait while an answer is sent back: a sender that sends its parts and never reads the
            answers (keeping its stream open) holds this handler at its first answers, then this peer's reducer,
            which waits for that sender's next part, and so this peer's whole round until ``averaging_timeout``.
            An answer not taken within ``reducer_timeout`` (what a sender waits for an answer) leaves the sender out
            of the rest of this peer's slice, like one that stops sending, and closes its stream."""
            timeout = self.reducer_timeout or self.sender_timeout
            task = asyncio.current_task()
            loop = asyncio.get_running_loop()

            def deaf() -> None:
                logger.warning("%s did not take its averaged part within %.1f s: left out", context.remote_id, timeout)
                # hivemind's sender ban; then the stream goes: cancelling the delivery ends the stream's task
                asyncio.ensure_future(self._ban_sender(context.remote_id)).add_done_callback(
                    lambda _: task.cancel() if task is not None else None
                )

            async for message in super().rpc_aggregate_part(stream, context):
                timer = loop.call_later(timeout, deaf) if timeout else None
                try:
                    yield message
                finally:
                    if timer is not None:
                        timer.cancel()

        async def run(self) -> Any:
            async for delta in super().run():
                yield delta
            if (self._prefix or "").endswith("_grad_averager"):
                own = self.peer_id.to_base58()
                averaged_with([peer.to_base58() for peer in self.ordered_peer_ids if peer.to_base58() != own])
                if POLICY.witness is not None:
                    self._witness()

        def _witness(self) -> None:
            """The server's peer saw this gradient round complete: report who it credits (:func:`credited`)."""
            reducer = self.tensor_part_reducer
            if reducer.num_parts == 0:
                return  # this peer reduced nothing in this round: it saw no sender's weight
            witness = POLICY.witness
            if witness is not None:
                witness(self.group_id.hex(), credited(reducer))

    return GuardedAllReduceRunner


def credited(reducer: Any) -> list[tuple[str, float]]:
    """The senders a reducer saw take part in a completed gradient round, with the weight each counted for: every
    part of its slice sent, none of them non-finite or screened out by its standing, and a capped weight above
    zero. The witness's ledger is made of these."""
    weights = capped_weights(reducer.claimed, POLICY.max_weight)
    return [
        (peer, weight)
        for i, (peer, weight) in enumerate(zip(reducer.sender_ids, weights, strict=True))
        if reducer.num_parts_received[i] == reducer.num_parts
        and i not in reducer.dropped | reducer.dissented
        and weight > 0
    ]


def install(
    aggregation: str,
    target_batch_size: int,
    run_id: str,
    experiment_key: Any,
    username: str,
    *,
    trusted: bool = False,
    batch_size: int = 1,
) -> None:
    """Guard every hivemind averager created after this call in this process (and its children): averaging,
    state download. Call before creating ``hivemind.Optimizer``; its tracker comes from
    :func:`progress.make_tracker_class`."""
    import hivemind.averaging.averager as averager_module

    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}")
    POLICY.aggregation = aggregation
    POLICY.max_weight = float(target_batch_size)
    POLICY.flag_weight = WEIGHT_FLAG_FACTOR * max(target_batch_size, batch_size)
    POLICY.run_id = run_id
    POLICY.experiment_key = experiment_key
    POLICY.trusted_state = trusted
    POLICY.username = username
    peer_flags.open_queue()
    if not getattr(averager_module.AllReduceRunner, "__swarmhub__", False):
        runner = make_runner_class()
        runner.__swarmhub__ = True  # type: ignore[attr-defined]
        averager_module.AllReduceRunner = runner
    install_state_guard()


__all__ = [
    "DISTRUST_SECONDS",
    "FLAGS",
    "LOCAL_REASONS",
    "PARTNER_SECONDS",
    "averaged_with",
    "distrusted",
    "flag",
    "partners",
    "take_flags",
]
