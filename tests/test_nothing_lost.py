"""Nothing lost: three workers' reporters send while the server restarts twice and a TCP proxy between them
cuts every connection; the rows stored equal the messages sent, exactly, with no duplicate."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from sqlalchemy import func, select

from swarmhub.common.protocol import MetricReport
from swarmhub.server import experiments
from swarmhub.server.accounts import users as accounts
from swarmhub.server.app import create_app
from swarmhub.server.models import MetricPoint
from swarmhub.worker.join.reporter import Reporter

from .conftest import LiveServer, free_port, make_experiment, make_user

pytestmark = pytest.mark.both_databases  # exactly-once ingestion, per dialect

MESSAGES = 60  # per worker, about 4 s of sending each phase


class CuttableProxy:
    """A loopback TCP proxy: ``cut()`` drops every open connection at once, as a flaky network would."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=2)
            except OSError:  # the server is down: the client sees the connection drop and retries later
                client.close()
                continue
            with self._lock:
                self._open |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> int:
        with self._lock:
            connections, self._open = self._open, set()
        for sock in connections:
            try:
                sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            except OSError:
                pass
        return len(connections) // 2

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        self.cut()


@pytest.mark.timeout(600)  # three restarts and a cut, on a loaded machine
def test_reports_survive_restarts_and_cut_connections_exactly_once(db, settings):
    organizer = make_user(db, "olga")
    make_experiment(db, organizer, slug="steady", status="running")
    workers = []
    with db.begin() as session:
        experiment = experiments.get_visible(session, "steady", None)
        for name in ("ada", "grace", "linus"):
            user = accounts.create_user(session, name, "correct-horse-battery")
            run = experiments.start_worker_run(session, experiment, user, "cpu")
            token, _ = accounts.issue_token(session, user, "worker")
            workers.append((run.id, token))

    server_port = free_port()
    proxy = CuttableProxy(server_port)
    reporters = [
        # at most 4 s between attempts (30 s by default): the test waits for reconnections, which under load
        # took the default backoff to minutes
        Reporter(
            f"ws://127.0.0.1:{proxy.port}/ws/experiments/steady/report?worker_id={wid}", token, max_backoff=4.0
        ).start()
        for wid, token in workers
    ]
    sent = 0

    def send(count: int) -> None:
        nonlocal sent
        for _ in range(count):
            for reporter in reporters:
                reporter.report(
                    MetricReport(
                        seq=sent,
                        step=sent,
                        epoch=sent // 10,
                        samples=32 * (sent + 1),
                        loss=2.0,
                        samples_per_second=50.0,
                        peers=3,
                    )
                )
            sent += 1
            time.sleep(0.02)

    cuts = 0
    try:
        for phase in range(3):  # the server runs three times: two restarts in between
            with LiveServer(create_app(settings), port=server_port):
                # The reporters come back by themselves (jittered backoff); the cut needs them connected.
                deadline = time.monotonic() + 90
                while not all(r.connected for r in reporters) and time.monotonic() < deadline:
                    time.sleep(0.1)
                send(MESSAGES // 6)
                cuts += proxy.cut()  # mid-phase, the network drops every connection
                send(MESSAGES // 6)
                if phase < 2:
                    time.sleep(0.5)
            send(2)  # sent while the server is down: kept by the reporters
        with LiveServer(create_app(settings), port=server_port):
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and any(r.pending for r in reporters):
                time.sleep(0.2)
            assert [r.pending for r in reporters] == [0, 0, 0]
    finally:
        for reporter in reporters:
            reporter.close(2)
        proxy.close()
    assert cuts >= 3 * 3, f"the proxy should have cut every reporter's connection in every phase ({cuts})"
    assert all(r.dropped == 0 and r.fatal is None for r in reporters)
    with db() as session:
        for worker_id, _ in workers:
            seqs = list(
                session.scalars(
                    select(MetricPoint.seq).where(MetricPoint.worker_run_id == worker_id).order_by(MetricPoint.seq)
                )
            )
            assert seqs == list(range(sent)), (worker_id, len(seqs), sent)
        assert session.scalar(select(func.count(MetricPoint.id))) == 3 * sent
