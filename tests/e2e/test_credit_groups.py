"""Credit beyond one averaging group: a real server, an experiment with ``group_size`` 2, four real `swarmhub join`
volunteers. The swarm averages in groups of at most two volunteers' peers, the server runs one witness per group
(two here), and every volunteer is credited verified samples, which only a witness can give."""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from ..processes import http, outlived, running_server, signup, wait_volunteers
from .test_credit_every_task import join, verified, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.solo, pytest.mark.timeout(600)]

SLUG = "credited"  # the name test_credit_every_task's join() joins
GROUP_SIZE = 2
VOLUNTEERS = ("ada", "grace", "alan", "edsger")
CREDIT_SECONDS = 300  # from the volunteers' start: six peers start and join on two busy cores


RUN = "running"


def witnesses(url: str, organizer: dict[str, str]) -> list[dict[str, Any]]:
    view = http.get(f"{url}/api/experiments/{SLUG}/swarm", headers=organizer).json()
    return [state for state in view["server_peers"] if state["kind"] == "witness"]


def rounds(database: Path) -> dict[tuple[int, str], list[str]]:
    """Each witnessed round's senders (their peer IDs), by (the swarm's epoch, the round's group ID), from the
    ledger."""
    with sqlite3.connect(database) as db:
        rows = db.execute(
            "SELECT w.epoch, w.round_id, c.peer_id FROM witnessed_rounds w "
            "JOIN round_credits c ON c.round_pk = w.id WHERE c.weight > 0"
        ).fetchall()
    found: dict[tuple[int, str], list[str]] = defaultdict(list)
    for epoch, round_id, peer_id in rows:
        found[epoch, round_id].append(peer_id)
    return found


def groups_per_epoch(ledger: dict[tuple[int, str], list[str]]) -> dict[int, int]:
    """How many groups were witnessed in each of the swarm's steps (``{-1: 0}`` for an empty ledger)."""
    per_epoch: dict[int, set[str]] = defaultdict(set)
    for epoch, group in ledger:
        per_epoch[epoch].add(group)
    return {epoch: len(groups) for epoch, groups in per_epoch.items()} or {-1: 0}


def test_four_volunteers_in_groups_of_two_are_each_credited(tmp_path: Path) -> None:
    with running_server(tmp_path) as (url, _):
        organizer = {"Authorization": f"Bearer {signup(url, 'organizer')}"}
        body = {
            "slug": SLUG,
            "title": "Credit in groups",
            "task": "digits",
            "task_params": {"hidden_size": 32, "batch_size": 32},
            "learning_rate": 0.003,
            "target_batch_size": 512,
            "matchmaking_time": 2.0,
            "averaging_timeout": 20.0,
            "group_size": GROUP_SIZE,
        }
        created = http.post(f"{url}/api/experiments", headers=organizer, json=body)
        assert created.status_code == 201, created.text
        assert created.json()["group_size"] == GROUP_SIZE
        started = http.post(f"{url}/api/experiments/{SLUG}/status", headers=organizer, json={"action": "start"})
        assert started.json()["status"] == "running", started.text
        workers = [join(url, tmp_path, name) for name in VOLUNTEERS]
        try:
            wait_for(
                lambda: all(verified(url, organizer).get(name, {}).get("samples", 0) > 0 for name in VOLUNTEERS),
                CREDIT_SECONDS,
                f"all four volunteers credited: {verified(url, organizer)}; witnesses {witnesses(url, organizer)}",
            )
            # one witness per group: the second starts once the monitor has counted the four volunteers' peers (dealt
            # groups can credit all four before that, while a volunteer still counts fewer peers and deals one group)
            wait_for(
                lambda: sorted((w["index"], w["state"]) for w in witnesses(url, organizer)) == [(0, RUN), (1, RUN)],
                CREDIT_SECONDS,
                f"two witnesses running: {witnesses(url, organizer)}",
            )
            # the swarm's step was averaged in two groups at once, each witnessed
            wait_for(
                lambda: max(groups_per_epoch(rounds(tmp_path / "e2e.db")).values()) >= 2,
                CREDIT_SECONDS,
                f"two groups witnessed in one step: {rounds(tmp_path / 'e2e.db')}",
            )
            ledger = rounds(tmp_path / "e2e.db")
            # and no witnessed round held more volunteers' peers than a group takes
            assert max(len(senders) for senders in ledger.values()) <= GROUP_SIZE, ledger
        finally:
            seen_children, _ = wait_volunteers(workers, tmp_path, until=lambda: True)
    assert outlived(seen_children) == set()
