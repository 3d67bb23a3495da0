"""The worker's reporter against the real server: nothing is lost when the server restarts, and a revoked
token or a paused experiment reaches the training loop."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import func, select

from swarmhub.common.protocol import MetricReport
from swarmhub.server import experiments
from swarmhub.server.accounts import users as accounts
from swarmhub.server.app import create_app
from swarmhub.server.models import MetricPoint
from swarmhub.server.services import services
from swarmhub.worker.client import ExitCode
from swarmhub.worker.join.reporter import Reporter

from .conftest import LiveServer, free_port, make_experiment, make_user


def message(seq: int) -> MetricReport:
    return MetricReport(
        seq=seq, step=seq, epoch=seq, samples=32 * (seq + 1), loss=2.0, samples_per_second=50.0, peers=1
    )


def wait_for(condition, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def joined(db, app):
    user = make_user(db)
    make_experiment(db, user, slug="reported", status="running")
    with db.begin() as session:
        experiment = experiments.get_visible(session, "reported", session.merge(user))
        worker_id = experiments.start_worker_run(session, experiment, session.merge(user), "cpu").id
        token, _ = accounts.issue_token(session, session.merge(user), "reporter test")
    return worker_id, token


def stored_seqs(db) -> list[int]:
    with db() as session:
        return list(session.scalars(select(MetricPoint.seq).order_by(MetricPoint.seq)))


def test_reports_survive_a_server_restart_exactly_once(db, settings, joined):
    worker_id, token = joined
    first = LiveServer(create_app(settings))
    url = f"ws://127.0.0.1:{first.port}/ws/experiments/reported/report?worker_id={worker_id}"
    with first:
        reporter = Reporter(url, token).start()
        for seq in range(3):
            reporter.report(message(seq))
        assert wait_for(lambda: reporter.pending == 0)
    # The server is down: training goes on and reports wait in the reporter.
    for seq in range(3, 6):
        reporter.report(message(seq))
    time.sleep(1)
    assert reporter.pending == 3
    with LiveServer(create_app(settings), port=first.port):
        assert wait_for(lambda: reporter.pending == 0, timeout=60)
        assert reporter.close(5)
    assert stored_seqs(db) == [0, 1, 2, 3, 4, 5]
    assert reporter.dropped == 0 and reporter.fatal is None


def test_a_healthy_connection_that_drops_is_back_within_seconds_however_often_it_dropped(db, settings, joined):
    """The backoff counts connections that ended without an ack: a worker whose network drops now and then (here
    the server restarts five times) reconnects within seconds each time, not after 15-45 s once it has dropped
    five times."""
    worker_id, token = joined
    port = free_port()
    url = f"ws://127.0.0.1:{port}/ws/experiments/reported/report?worker_id={worker_id}"
    reporter = Reporter(url, token).start()
    waits = []
    try:
        for seq in range(6):
            with LiveServer(create_app(settings), port=port):
                started = time.monotonic()
                reporter.report(message(seq))
                assert wait_for(lambda: reporter.pending == 0, timeout=60)
                waits.append(time.monotonic() - started)
    finally:
        reporter.close(2)
    assert stored_seqs(db) == list(range(6))
    assert max(waits[1:]) < 12, waits  # each restart: the reporter's own backoff of 1-3 s, and the connect


def test_revoked_token_is_fatal(db, app, live_server, joined):
    worker_id, token = joined
    with services(app).sessionmaker.begin() as session:
        _, api_token = accounts.user_for_token(session, token)
        accounts.revoke_token(session, api_token)
    url = f"ws://127.0.0.1:{live_server.port}/ws/experiments/reported/report?worker_id={worker_id}"
    reporter = Reporter(url, token).start()
    reporter.report(message(0))
    assert wait_for(lambda: reporter.fatal is not None)
    assert reporter.fatal.exit_code == ExitCode.AUTH
    assert "swarmhub login" in reporter.fatal.message
    reporter.close(1)
    with db() as session:
        assert session.scalar(select(func.count(MetricPoint.id))) == 0


def test_pause_reaches_the_worker(db, app, live_server, joined):
    worker_id, token = joined
    url = f"ws://127.0.0.1:{live_server.port}/ws/experiments/reported/report?worker_id={worker_id}"
    reporter = Reporter(url, token).start()
    reporter.report(message(0))
    assert wait_for(lambda: reporter.pending == 0)
    assert reporter.control is None
    with services(app).sessionmaker.begin() as session:
        experiment = experiments.get_visible(session, "reported", None)
        experiments.change_status(session, experiment, "pause")
    reporter.report(message(1))
    assert wait_for(lambda: reporter.control is not None)
    assert reporter.control.status == "paused"
    reporter.close(2)


def test_removed_volunteer_stops_reporting_at_once(db, app, live_server):
    """Once removed, the reporter neither reconnects nor waits to flush: the worker can exit promptly."""
    organizer, volunteer = make_user(db, "olga"), make_user(db, "vic")
    make_experiment(db, organizer, slug="reported", status="running")
    with db.begin() as session:
        experiment = experiments.get_visible(session, "reported", session.merge(volunteer))
        worker_id = experiments.start_worker_run(session, experiment, session.merge(volunteer), "cpu").id
        token, _ = accounts.issue_token(session, session.merge(volunteer), "reporter test")
    url = f"ws://127.0.0.1:{live_server.port}/ws/experiments/reported/report?worker_id={worker_id}"
    reporter = Reporter(url, token).start()
    reporter.report(message(0))
    assert wait_for(lambda: reporter.pending == 0)
    with services(app).sessionmaker.begin() as session:
        experiments.ban(session, experiments.get_visible(session, "reported", None), "vic")
    reporter.report(message(1))
    assert wait_for(lambda: reporter.control is not None)
    assert reporter.control.removed
    # No reconnect: the reporter's thread ends by itself once the server has closed the connection.
    assert wait_for(lambda: not reporter._thread.is_alive(), timeout=5), "a removed worker's reporter reconnected"
    started = time.monotonic()
    reporter.close(30)
    assert time.monotonic() - started < 1
    assert stored_seqs(db) == [0]


def test_a_full_buffer_drops_the_oldest_and_never_blocks_training(db, settings, joined):
    """With the server away, reports pile up in a bounded buffer: report() returns at once, the oldest go
    (counted), and the newest reach the server once it is back."""
    worker_id, token = joined
    port = free_port()  # nothing listens here yet
    url = f"ws://127.0.0.1:{port}/ws/experiments/reported/report?worker_id={worker_id}"
    reporter = Reporter(url, token, max_buffer=10, open_timeout=1.0).start()
    started = time.monotonic()
    for seq in range(25):
        reporter.report(message(seq))
    took = time.monotonic() - started
    assert not reporter.connected and reporter.fatal is None
    assert took < 2.0, took  # no waiting on the network: a blocking send would still be trying to connect
    assert (reporter.pending, reporter.dropped) == (10, 15)
    with LiveServer(create_app(settings), port=port):
        assert wait_for(lambda: reporter.pending == 0, timeout=60)
        assert reporter.close(5)
    assert stored_seqs(db) == list(range(15, 25))
    assert reporter.dropped == 15
