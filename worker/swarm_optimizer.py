"""``hivemind.Optimizer`` as swarmhub's workers run it (imported only when training starts: hivemind is heavy).

One change: a gradient averaging round is pre-scheduled only while the swarm's progress shows another peer.

hivemind pre-schedules the next round shortly before an epoch ends, so that matchmaking overlaps the last steps.
When the epoch ends and the progress tracker shows no other peer (a swarm's first seconds, before the peers'
progress records have been read; or after the others left), it cancels that round. If the cancel lands while the
round is still looking for a group, hivemind 1.1's matchmaking can be left broken: the log shows
``RuntimeError: aclose(): asynchronous generator is already running`` from ``_declare_averager_periodically``,
and from then on every round of that peer ends "could not find a group" (seen in two-peer swarms on a busy
2-core machine: both peers pre-scheduled at the start, saw each other a moment later, and never averaged).
A peer that sees no other would skip the round anyway; not scheduling it leaves nothing to cancel. When a peer
appears before the epoch ends, hivemind starts matchmaking at the epoch's end instead (a round without the
head start).
"""

from __future__ import annotations

from typing import Any

import hivemind

from . import robust


class SwarmOptimizer(hivemind.Optimizer):  # type: ignore[misc]
    """``roster`` (the swarm's, see ``robust.Roster``) makes the progress tracker read the swarm's epoch through
    ``robust.bounded_progress``: a record with a made-up epoch moves no one."""

    def __init__(self, *args: Any, roster: robust.Roster | None = None, **kwargs: Any):
        self._roster = roster
        super().__init__(*args, **kwargs)

    def _make_progress_tracker(self, target_batch_size: int, **kwargs: Any) -> Any:
        if self._roster is None:
            return super()._make_progress_tracker(target_batch_size, **kwargs)
        return robust.make_tracker_class()(
            dht=self.dht,
            prefix=self.run_id,
            target_batch_size=target_batch_size,
            client_mode=self.client_mode,
            status_loglevel=self.status_loglevel,
            start=True,
            roster=self._roster,
            **kwargs,
        )

    def _maybe_schedule_gradient_averaging(self) -> None:
        if self.tracker.global_progress.num_peers <= 1:
            return  # alone: hivemind would cancel the round at the epoch's end (see the module's docstring)
        super()._maybe_schedule_gradient_averaging()
