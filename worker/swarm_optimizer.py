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

import logging
import time
from typing import Any

import hivemind

from . import robust

logger = logging.getLogger(__name__)
# After a state download that left this peer behind, the swarm's progress is read again at most this often
REREAD_AFTER_FAILED_CATCH_UP_SECONDS = 2.0


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

    def _alone_with_server_peers(self) -> bool:
        return self._roster is not None and getattr(self.tracker, "other_trainers", 1) == 0

    def _update_global_epoch(self, grad_scaler: Any) -> None:
        """hivemind's, without a state averaging round when no other volunteer trains: the server's witness keeps
        a record in the swarm (so that a lone volunteer's gradient rounds are witnessed) but holds no training
        state and joins no state round, and hivemind would wait ``averaging_timeout`` for a group every time."""
        if not self._alone_with_server_peers():
            return super()._update_global_epoch(grad_scaler)
        every = self.average_state_every  # type: ignore[has-type]
        self.average_state_every = 2**62
        try:
            return super()._update_global_epoch(grad_scaler)
        finally:
            self.average_state_every = every

    def _maybe_schedule_state_averaging(self) -> None:
        if not self._alone_with_server_peers():
            super()._maybe_schedule_state_averaging()

    def _maybe_schedule_gradient_averaging(self) -> None:
        if self.tracker.global_progress.num_peers <= 1:
            return  # alone: hivemind would cancel the round at the epoch's end (see the module's docstring)
        super()._maybe_schedule_gradient_averaging()

    def load_state_from_peers(self, **kwargs: Any) -> None:
        """hivemind's, then, when no state could be taken and the swarm still looks ahead, an immediate read of
        the swarm's progress: the read leaves out the peers whose state was just refused (``robust.distrusted``),
        so a peer that serves a poisoned state while advertising a newer epoch keeps no one "out of sync" (without
        it, hivemind asks for the state again at every step until its next scheduled read, and refuses it again)."""
        super().load_state_from_peers(**kwargs)
        if self._roster is None or self.local_epoch >= self.tracker.global_epoch:
            return
        if time.monotonic() - getattr(self, "_reread_at", 0.0) < REREAD_AFTER_FAILED_CATCH_UP_SECONDS:
            return
        self._reread_at = time.monotonic()
        self.refresh_swarm_progress(timeout=REREAD_AFTER_FAILED_CATCH_UP_SECONDS)

    def refresh_swarm_progress(self, timeout: float = 10.0, force: bool = False) -> None:
        """Have hivemind's progress tracker read the swarm's progress now, when its epoch is not this peer's.

        After loading the swarm's state, the tracker's idea of the swarm's epoch can be older than the state just
        loaded, and hivemind then counts none of this peer's samples towards the swarm's batch: a fast peer trains
        alone for up to its next scheduled read (tens of seconds) and its work never reaches an averaging round.
        """
        tracker = self.tracker
        if tracker.global_epoch == self.local_epoch and not force:
            return
        tracker.fetched_global_progress_this_epoch.clear()
        tracker.global_progress.next_fetch_time = 0.0
        tracker.global_state_updated.set()  # wakes the fetcher, which then sees that a read is due now
        if not tracker.fetched_global_progress_this_epoch.wait(timeout):
            logger.warning("the swarm's progress was not read within %.0f s", timeout)
