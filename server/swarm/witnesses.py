"""How many witnesses (the server's auxiliary peers) an experiment's swarm gets: one per averaging group of the
experiment's ``group_size`` volunteers' peers, as the monitor last counted them, between 1 and ``MAX_WITNESSES``;
one for a swarm of one group. More start as soon as the swarm grows; one no group needs is stopped only once
none has needed it for ``FEWER_AFTER_SECONDS`` (peers come and go between rounds)."""

from __future__ import annotations

import time

from swarmhub.worker.swarm.matchmaking import MAX_GROUPS, groups_for

MAX_WITNESSES = MAX_GROUPS  # witnesses (auxiliary peers) per experiment at most: one per averaging group
FEWER_AFTER_SECONDS = 120.0  # a witness no group needs is stopped once none has needed it for this long


def wanted(volunteer_peers: int | None, group_size: int) -> int:
    """Witnesses for ``volunteer_peers`` (None: not counted yet) in groups of ``group_size`` (0: one group)."""
    if volunteer_peers is None:
        return 1
    return groups_for(volunteer_peers, group_size)  # the groups the volunteers' peers deal themselves into


class Shrinking:
    """Since when each run has needed fewer witnesses than it runs."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}

    def due(self, run_id: str, running: int, wanted: int) -> bool:
        """Whether the witnesses past ``wanted`` of ``running`` are to be stopped now."""
        if running <= wanted:
            self._since.pop(run_id, None)
            return False
        since = self._since.setdefault(run_id, time.monotonic())
        if time.monotonic() - since < FEWER_AFTER_SECONDS:
            return False
        self._since.pop(run_id, None)
        return True
