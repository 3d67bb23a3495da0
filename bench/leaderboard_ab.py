"""The leaderboard's pages, the summary and the series of this checkout against another commit's, side by side on
one kept build.

``bench/queries.py`` times one version of the code, and this shared machine's speed drifts by up to 2x within an
hour, so two of its runs do not compare two versions. This loads the metrics code (``server/metrics/``) of
``--baseline`` (a commit) beside the checkout's, checks that both give the same results, and times them
interleaved (alternating which goes first), each call in its own session as a request has. Needs the database a
``bench/queries.py --keep`` run left.

    .venv/bin/python bench/queries.py --only leaderboard --keep     # once: builds swarmhub_bench_queries
    .venv/bin/python bench/leaderboard_ab.py --baseline 57bac44     # prints median / p95 of each and the ratio
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.orm import Session

from swarmhub.server import metrics
from swarmhub.server.core.db import make_engine, make_sessionmaker
from swarmhub.server.models import Experiment, utcnow

sys.path.insert(0, str(Path(__file__).resolve().parent))
from queries import ROOT, WINDOW, p95  # noqa: E402


def baseline_module(commit: str) -> Any:
    """``commit``'s metrics code, loaded beside the checkout's: its ``server/metrics/`` package, or before that
    its ``server/metrics.py``."""

    def show(path: str) -> str:
        return subprocess.run(
            ["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout

    listed = subprocess.run(
        ["git", "ls-tree", "--name-only", commit, "server/metrics/"], cwd=ROOT, capture_output=True, text=True
    )
    package = [name for name in listed.stdout.split() if name.endswith(".py")]
    folder = Path(tempfile.mkdtemp()) / "baseline_metrics"
    if package:
        folder.mkdir(parents=True)
        for name in package:
            (folder / Path(name).name).write_text(show(name))
        location, search = folder / "__init__.py", [str(folder)]
    else:
        folder.parent.mkdir(parents=True, exist_ok=True)
        location, search = folder.with_suffix(".py"), None
        location.write_text(show("server/metrics.py"))
    # Loaded as a module of the server package, so that its relative imports resolve to this checkout's.
    spec = importlib.util.spec_from_file_location(
        "swarmhub.server._baseline_metrics", location, submodule_search_locations=search
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, help="the commit to compare with (its server/metrics/)")
    parser.add_argument("--url", default="postgresql+psycopg://postgres@127.0.0.1:5432/swarmhub_bench_queries")
    parser.add_argument("--runs", type=int, default=120, help="timed calls of each version per page")
    args = parser.parse_args()
    old = baseline_module(args.baseline)
    db = make_sessionmaker(make_engine(args.url))
    with db() as session:
        experiment = session.scalars(select(Experiment).where(Experiment.slug == "bench")).one()
        session.expunge(experiment)

    with db() as session:  # the cursor of rank 50,010, as bench/queries.py's deep page
        handover = metrics.leaderboard_page(
            session, session.merge(experiment, load=False), WINDOW, limit=1, offset=50_009
        )
    assert handover.next_cursor is not None
    after = metrics.Cursor.decode(handover.next_cursor)
    now = utcnow()  # the series' clock, the same for both versions
    cases: dict[str, Callable[[Any, Session, Experiment], Any]] = {
        "first page (100)": lambda m, s, e: m.leaderboard_page(s, e, WINDOW),
        "organizer's (flags)": lambda m, s, e: m.leaderboard_page(s, e, WINDOW, with_flags=True),
        "deep page (cursor after rank 50,010)": lambda m, s, e: m.leaderboard_page(s, e, WINDOW, after=after),
        "deepest offset page (offset 10,000)": lambda m, s, e: m.leaderboard_page(s, e, WINDOW, offset=10_000),
        "deep page (offset 50,010)": lambda m, s, e: m.leaderboard_page(s, e, WINDOW, offset=50_010),
        "summary": lambda m, s, e: m.summary(s, e, WINDOW),
        "series": lambda m, s, e: m.series(s, e, now),
    }

    def call(module: Any, case: Callable[[Any, Session, Experiment], Any]) -> Any:
        with db() as session:
            result = case(module, session, session.merge(experiment, load=False))
        return result.model_dump() if isinstance(result, BaseModel) else [item.model_dump() for item in result]

    print(f"baseline {args.baseline} against this checkout, {args.runs} interleaved calls each")
    print("| query | baseline median / p95 ms | checkout median / p95 ms | speed-up (medians) |")
    print("| --- | ---: | ---: | ---: |")
    for name, case in cases.items():
        assert call(old, case) == call(metrics, case), f"{name}: the versions' results differ"
        times: dict[str, list[float]] = {"old": [], "new": []}
        for i in range(args.runs):
            order = [("old", old), ("new", metrics)]
            for label, module in order if i % 2 else reversed(order):
                started = time.perf_counter()
                call(module, case)
                times[label].append((time.perf_counter() - started) * 1000)
        (a, b) = (statistics.median(times["old"]), statistics.median(times["new"]))
        print(f"| {name} | {a:.1f} / {p95(times['old']):.1f} | {b:.1f} / {p95(times['new']):.1f} | {a / b:.2f}x |")


if __name__ == "__main__":
    main()
