"""A peer's deny list across the processes hivemind forks: one asks the source, all of them see a removal."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

from swarmhub.worker.swarm import deny_list
from swarmhub.worker.swarm.deny_list import DenyList

INTERVAL = 0.2


def file_source(folder: Path):  # noqa: ANN201
    """The server's peers' kind of source: a file of usernames; each read is logged with the reading process."""
    names, calls = folder / "denied", folder / "calls"
    names.write_text("")

    def read() -> set[str]:
        with calls.open("a") as log:
            log.write(f"{os.getpid()}\n")
        return set(names.read_text().split())

    return read, names, calls


def watch(denied: DenyList, name: str, seen, timeout: float) -> None:  # noqa: ANN001
    """In a forked process, as hivemind's DHT and averagers are: when does ``name`` show up in the list?"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if name in denied:
            seen.value = time.monotonic()
            return
        time.sleep(0.02)


def forked_watchers(denied: DenyList, name: str, count: int, timeout: float) -> tuple[list, list]:
    context = multiprocessing.get_context("fork")
    seen = [context.RawValue("d", 0.0) for _ in range(count)]
    watchers = [context.Process(target=watch, args=(denied, name, s, timeout)) for s in seen]
    for watcher in watchers:
        watcher.start()
    return watchers, seen


def test_forked_processes_see_a_removal_while_only_the_owner_asks_the_source(tmp_path):
    read, names, calls = file_source(tmp_path)
    denied = DenyList(read, interval=INTERVAL)
    try:
        assert "mallory" not in denied
        watchers, seen = forked_watchers(denied, "mallory", count=3, timeout=10)
        time.sleep(1.0)  # the forked processes look up the list meanwhile, as averagers do for every caller
        names.write_text("mallory\n")
        removed_at = time.monotonic()
        for watcher in watchers:
            watcher.join(15)
    finally:
        denied.close()
    assert all(s.value > 0 for s in seen), "a forked process never saw the removal"
    # within the owner's interval, plus the lookups' own pace
    assert max(s.value for s in seen) - removed_at < INTERVAL + 1.0, [s.value - removed_at for s in seen]
    assert "mallory" in denied
    # every read of the source was the owner's: one request per interval, however many processes look
    readers = set(calls.read_text().split())
    assert readers == {str(os.getpid())}, readers


def test_a_list_too_long_to_share_is_asked_for_by_each_process(tmp_path, monkeypatch):
    monkeypatch.setattr(deny_list, "SHARED_BYTES", 64)
    read, names, calls = file_source(tmp_path)
    names.write_text(" ".join(f"volunteer-{i}" for i in range(20)))  # over 64 bytes as JSON
    denied = DenyList(read, interval=INTERVAL)
    try:
        assert "volunteer-3" in denied
        watchers, seen = forked_watchers(denied, "volunteer-7", count=2, timeout=10)
        for watcher in watchers:
            watcher.join(15)
        assert all(s.value > 0 for s in seen)
        names.write_text(names.read_text() + " mallory")
        watchers, seen = forked_watchers(denied, "mallory", count=2, timeout=10)
        for watcher in watchers:
            watcher.join(15)
    finally:
        denied.close()
    assert all(s.value > 0 for s in seen), "a forked process missed a removal in a long list"
    assert len(set(calls.read_text().split())) > 1  # the forked processes asked on their own


def test_without_a_source_nothing_is_denied():
    assert "anyone" not in DenyList()
