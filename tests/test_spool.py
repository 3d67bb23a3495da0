"""The worker's metric spool: reports are on disk before they are sent; a worker that crashes with reports
unacknowledged sends them at its next start, and the server stores each exactly once. Bounded, and says so."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from sqlalchemy import select

from swarmhub.common.protocol import MetricReport
from swarmhub.server import experiments
from swarmhub.server.accounts import users as accounts
from swarmhub.server.app import create_app
from swarmhub.server.models import MetricPoint
from swarmhub.worker.join.reporter import Reporter
from swarmhub.worker.join.spool import Spool, leftovers

from .conftest import LiveServer, free_port, make_experiment, make_user


def message(seq: int) -> str:
    return MetricReport(
        seq=seq, step=seq, epoch=0, samples=32 * (seq + 1), loss=2.0, samples_per_second=50.0, peers=1
    ).model_dump_json()


def test_spool_keeps_unacked_reports_in_order_and_is_bounded(tmp_path, caplog):
    spool = Spool(tmp_path, "run-1", max_messages=5)
    for seq in range(4):
        spool.append(seq, message(seq))
    spool.ack(1)
    assert [seq for seq, _ in spool.unacked()] == [2, 3]
    with spool.path.open("a") as handle:
        handle.write('{"seq": 4, "tor')  # a crash mid-write leaves a torn last line
    assert [seq for seq, _ in Spool(tmp_path, "run-1", max_messages=5).unacked()] == [2, 3]
    for seq in range(5, 20):
        spool.append(seq, message(seq))
    assert spool.dropped > 0 and "metric spool full" in caplog.text
    assert len(spool.unacked()) <= 2 * spool.max_messages
    assert [seq for seq, _ in spool.unacked()][-1] == 19  # the newest are kept
    assert leftovers(tmp_path) == ["run-1"]
    for seq, _ in spool.unacked():
        spool.ack(seq)
    spool.close(done=True)
    assert leftovers(tmp_path) == []


CRASHING_WORKER = """
import os, sys
from pathlib import Path
from swarmhub.common.protocol import MetricReport
from swarmhub.worker.join.reporter import Reporter
from swarmhub.worker.join.spool import Spool

url, token, folder, worker_id = sys.argv[1:5]
reporter = Reporter(url, token, open_timeout=1.0, spool=Spool(Path(folder), worker_id)).start()
for seq in range(6):
    reporter.report(MetricReport(seq=seq, step=seq, epoch=0, samples=32 * (seq + 1), loss=2.0,
                                 samples_per_second=50.0, peers=1))
os._exit(1)  # a crash: nothing flushed, nothing closed
"""


def test_a_crashed_workers_reports_are_sent_at_its_next_start_exactly_once(db, settings, tmp_path):
    organizer = make_user(db, "olga")
    make_experiment(db, organizer, slug="spooled", status="running")
    with db.begin() as session:
        experiment = experiments.get_visible(session, "spooled", None)
        user = accounts.create_user(session, "ada", "correct-horse-battery")
        worker_id = experiments.start_worker_run(session, experiment, user, "cpu").id
        token, _ = accounts.issue_token(session, user, "worker")
    port = free_port()
    url = f"ws://127.0.0.1:{port}/ws/experiments/spooled/report?worker_id={worker_id}"
    folder = tmp_path / "spool"
    # The server is down while the worker reports, then the worker crashes.
    crashed = subprocess.run(
        [sys.executable, "-c", CRASHING_WORKER, url, token, str(folder), worker_id], timeout=60, capture_output=True
    )
    assert crashed.returncode == 1, crashed.stderr.decode()[-2000:]
    assert leftovers(folder) == [worker_id]
    with LiveServer(create_app(settings), port=port):
        # The next start finds the spool and sends what it holds; one report is sent twice on purpose.
        spool = Spool(folder, worker_id)
        assert [seq for seq, _ in spool.unacked()] == list(range(6))
        reporter = Reporter(url, token, spool=spool).start()
        reporter.report(MetricReport.model_validate(json.loads(message(3))))
        assert reporter.close(30)
        time.sleep(0.2)
    assert leftovers(folder) == []
    with db() as session:
        seqs = list(session.scalars(select(MetricPoint.seq).where(MetricPoint.worker_run_id == worker_id)))
    assert sorted(seqs) == list(range(6))
