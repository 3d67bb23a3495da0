"""Loaded by every Python process that ``bench/stall_hunt.py`` starts (it puts this folder on PYTHONPATH and sets
SWARMHUB_TASKDUMP_DIR): on SIGUSR2 the process writes its threads' stacks and each pending asyncio task's chain of
awaits (coroutine, async generator, the future it waits on) to a file in that folder. hivemind's averager and DHT
processes are forked from the worker, so they inherit the handler. Nothing happens without the variable."""

from __future__ import annotations

import faulthandler
import gc
import os
import signal
import sys
import time
from typing import Any

FOLDER = os.environ.get("SWARMHUB_TASKDUMP_DIR")


def _awaits(obj: Any, limit: int = 40) -> list[str]:
    lines = []
    for _ in range(limit):
        if obj is None:
            break
        frame = getattr(obj, "cr_frame", None) or getattr(obj, "ag_frame", None) or getattr(obj, "gi_frame", None)
        if frame is not None:
            lines.append(f"    {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
        inner = next(
            (getattr(obj, name) for name in ("cr_await", "ag_await", "gi_yieldfrom") if getattr(obj, name, None)),
            None,
        )
        if inner is None and type(obj).__name__ in ("async_generator_asend", "async_generator_athrow"):
            # an ``anext()`` in flight: the generator it drives is only reachable through the gc
            inner = next((r for r in gc.get_referents(obj) if type(r).__name__ == "async_generator"), None)
        if inner is None and frame is None:
            if type(obj).__name__ == "FutureIter":  # an awaited future: show the future (its callbacks say whose)
                obj = next((r for r in gc.get_referents(obj) if hasattr(r, "add_done_callback")), obj)
            lines.append(f"    waits on {type(obj).__name__}: {repr(obj)[:300]}")
            break
        obj = inner
    return lines


def _dump(signum: int, frame: Any) -> None:
    try:
        _write()
    except Exception:  # noqa: BLE001 - a handler's exception would surface in whatever the main thread runs
        pass


def _write() -> None:
    assert FOLDER is not None
    path = os.path.join(FOLDER, f"{os.getpid()}-{time.time():.1f}.txt")
    with open(path, "w") as out:
        out.write(f"pid {os.getpid()} argv {' '.join(sys.argv)[:200]}\n")
        faulthandler.dump_traceback(file=out, all_threads=True)
        out.flush()
        import asyncio

        for _ in range(5):  # the set changes under us while a loop thread runs
            try:
                tasks = list(asyncio.tasks._all_tasks)  # every loop's tasks (the averager runs its own in a thread)
                break
            except RuntimeError:
                tasks = []
        for task in tasks:
            if task.done():
                continue
            out.write(f"\ntask {task.get_name()}: {repr(task.get_coro())[:200]}\n")
            out.write("\n".join(_awaits(task.get_coro())) + "\n")


if FOLDER:
    signal.signal(signal.SIGUSR2, _dump)
