"""Running totals: after a realistic run of reports and reads of the swarm's signed records, the leaderboard
and summary read from ``VolunteerTotal``/``ExperimentTotal`` equal a recount from every stored row, and keep
the ledger's documented meaning (verified: credited through rounds the server's peer witnessed; pending: claimed
by records in the open epoch).
SQLite and PostgreSQL."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from swarmhub.common.protocol import MetricReport
from swarmhub.server import experiments, metrics
from swarmhub.server.ledger import contributions, witnessed
from swarmhub.server.models import Experiment, MetricPoint, User, VolunteerTotal, WorkerRun, utcnow

from .conftest import api_token, make_experiment, make_user

pytestmark = pytest.mark.both_databases  # running totals are upserts, per dialect

WINDOW = 60


def recount(session: Any, experiment: Experiment) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The leaderboard (with flags) and summary counted from scratch: every worker run, every stored report
    and the whole ledger, the way they were computed before running totals."""
    since = utcnow() - timedelta(seconds=WINDOW)
    people: dict[int, dict[str, Any]] = defaultdict(
        lambda: {"claimed": 0, "sps": 0.0, "last_seen": None, "classes": set(), "peak": 0.0}
    )
    runs = session.scalars(select(WorkerRun).where(WorkerRun.experiment_id == experiment.id)).all()
    for run in runs:
        if run.last_seen_at is None:  # never reported: claims nothing
            continue
        p = people[run.user_id]
        p["classes"].add(metrics.device_class(run.device))
        p["claimed"] += run.samples
        p["sps"] += run.samples_per_second if run.last_seen_at >= since else 0.0
        p["last_seen"] = max(filter(None, [p["last_seen"], run.last_seen_at]))
    peaks = session.execute(
        select(WorkerRun.user_id, func.max(MetricPoint.samples_per_second))
        .join(MetricPoint, MetricPoint.worker_run_id == WorkerRun.id)
        .where(WorkerRun.experiment_id == experiment.id)
        .group_by(WorkerRun.user_id)
    ).all()
    for user_id, peak in peaks:
        people[user_id]["peak"] = peak
    ledger = contributions.by_user(session, experiment)
    for user_id, v in ledger.items():
        people[user_id]["last_seen"] = max(filter(None, [people[user_id]["last_seen"], v.last_seen]))
    names = dict(session.execute(select(User.id, User.username)).tuples().all())
    total_verified = sum(v.samples for v in ledger.values())
    fastest: dict[str, float] = defaultdict(float)
    for user_id, p in people.items():
        for cls in p["classes"]:
            fastest[cls] = max(fastest[cls], ledger.get(user_id, contributions.Verified()).peak_samples_per_second)
    board = []
    ranked = sorted(
        people.items(),
        key=lambda item: (
            -ledger.get(item[0], contributions.Verified()).samples,
            -item[1]["claimed"],
            names[item[0]].lower(),
        ),
    )
    for rank, (user_id, p) in enumerate(ranked, start=1):
        v = ledger.get(user_id, contributions.Verified())
        flags = []
        backed = v.samples + v.pending
        unseen = v.epochs * contributions.MONITOR_SECONDS * v.peak_samples_per_second
        if p["claimed"] > backed * (1 + metrics.CLAIM_SLACK) + unseen + 2 * experiment.target_batch_size:
            flags.append("unbacked")
        for cls in sorted(p["classes"]):
            if fastest[cls] > 0 and p["peak"] > metrics.THROUGHPUT_FACTOR * fastest[cls]:
                flags.append(f"rate:{cls}")
        others = [
            max(
                (
                    ledger.get(u, contributions.Verified()).peak_samples_per_second
                    for u, q in people.items()
                    if u != user_id and cls in q["classes"]
                ),
                default=0.0,
            )
            for cls in p["classes"]
        ]
        if others and min(others) > 0 and v.peak_samples_per_second > metrics.SIGNED_FACTOR * max(others):
            flags.append(f"signed:{'/'.join(sorted(p['classes']))}")
        board.append(
            {
                "rank": rank,
                "username": names[user_id],
                "samples": v.samples,
                "pending_samples": v.pending,
                "claimed_samples": p["claimed"],
                "share": round(v.samples / total_verified, 4) if total_verified else 0.0,
                "profile_url": f"/u/{names[user_id]}",  # no one here hides their profile
                "samples_per_second": round(p["sps"], 2),
                "time_online_seconds": round(v.online_seconds, 1),
                "active": p["last_seen"] >= since,
                "last_seen": p["last_seen"],
                "flags": flags,
                # one experiment, far below 1M samples and 24 h online, no checkpoints (test_milestones.py)
                "milestones": ["first_round"] if v.samples > 0 else [],
            }
        )
    active = [run for run in runs if run.last_seen_at is not None and run.last_seen_at >= since]
    losses = [run.loss for run in active if run.loss is not None]
    summary = {
        "total_samples": sum(run.samples for run in runs),
        "verified_samples": total_verified,
        "epoch": max((run.epoch for run in runs), default=0),
        "active_peers": len(active),
        "samples_per_second": round(sum(run.samples_per_second for run in active), 2),
        "loss": round(sum(losses) / len(losses), 6) if losses else None,
    }
    return board, summary


def aggregated(session: Any, experiment: Experiment, **page: int) -> list[dict[str, Any]]:
    rows = metrics.leaderboard(session, experiment, WINDOW, with_flags=True, **page)
    return [
        {
            **row.model_dump(),
            "flags": [
                "unbacked"
                if "never reached" in flag
                else f"signed:{flag.split('no other ')[1].split()[0]}"
                if "signed records" in flag
                else f"rate:{flag.split(' of a ')[1].split()[0]}"
                for flag in row.flags or []
            ],
        }
        for row in rows
    ]


class Run:
    """A test's view of one experiment: reports through ``metrics.ingest``, reads of the signed records
    through ``contributions.record``, each in its own transaction as the server does them."""

    def __init__(self, db: Any, experiment_id: int):
        self.db, self.experiment_id = db, experiment_id
        self.seqs: dict[str, int] = defaultdict(int)
        self.t0 = utcnow()

    def report(
        self, worker_id: str, samples: int, sps: float, epoch: int = 1, loss: float = 2.0, seq: int = -1
    ) -> bool:
        if seq < 0:
            seq = self.seqs[worker_id]
            self.seqs[worker_id] += 1
        message = MetricReport(
            seq=seq, step=seq, epoch=epoch, samples=samples, loss=2.0 - seq / 1000, samples_per_second=sps, peers=3
        )
        with self.db.begin() as session:
            return metrics.ingest(session, session.get(WorkerRun, worker_id), message)

    def read(self, seconds: float, *records: tuple[str, str, int, int, float]) -> None:
        """One read of the progress records at ``t0 + seconds``: (username, peer, epoch, samples, rate)."""
        now = self.t0 + timedelta(seconds=seconds)
        observed = [
            {"peer_id": peer, "username": name, "epoch": epoch, "samples": samples, "samples_per_second": sps,
             "time": now.timestamp()}
            for name, peer, epoch, samples, sps in records
        ]  # fmt: skip
        with self.db.begin() as session:
            experiment = session.get(Experiment, self.experiment_id)
            contributions.record(session, experiment, contributions.parse(observed), now)

    def witness(self, seconds: float, round_id: str, epoch: int, *senders: tuple[str, str, float]) -> int:
        """One read of the server's witness record at ``t0 + seconds`` holding one round: (username, peer, weight)."""
        now = self.t0 + timedelta(seconds=seconds)
        rounds = [
            {"id": round_id, "epoch": epoch, "time": now.timestamp(),
             "senders": [{"peer_id": peer, "username": name, "weight": weight} for name, peer, weight in senders]}
        ]  # fmt: skip
        with self.db.begin() as session:
            experiment = session.get(Experiment, self.experiment_id)
            return witnessed.record_rounds(session, experiment, witnessed.parse_rounds(rounds), now)

    def check(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The aggregated leaderboard and summary equal the recount; returns them."""
        with self.db() as session:
            experiment = session.get(Experiment, self.experiment_id)
            board, summary = recount(session, experiment)
            assert aggregated(session, experiment, limit=1000) == board
            got = metrics.summary(session, experiment, WINDOW).model_dump()
            assert {key: got[key] for key in summary} == summary
            return board, summary


@pytest.fixture
def volunteers(db):
    organizer = make_user(db, "olga")
    users = {name: make_user(db, name) for name in ("ada", "Grace", "bob", "mallory", "zed")}
    experiment = make_experiment(db, organizer, slug="totals", status="running")  # target batch 128
    devices = {"ada": ["cpu", "cuda:0"], "Grace": ["cpu"], "bob": ["mps"], "mallory": ["cpu"], "zed": ["cpu"]}
    workers: dict[str, list[str]] = {}
    with db.begin() as session:
        exp = session.get(Experiment, experiment.id)
        for name, kinds in devices.items():
            user = session.merge(users[name])
            workers[name] = [experiments.start_worker_run(session, exp, user, d).id for d in kinds]
    return Run(db, experiment.id), workers


def test_totals_equal_a_recount_through_epochs_duplicates_late_reads_and_a_removal(client, volunteers):
    run, workers = volunteers
    ada_cpu, ada_gpu = workers["ada"]
    # Epoch 1: everyone trains and reports; the monitor reads the records twice.
    assert run.report(ada_cpu, 40, 20.0)
    assert run.report(ada_gpu, 100, 80.0)
    assert run.report(workers["Grace"][0], 30, 15.0)
    assert run.report(workers["zed"][0], 25, 12.0)
    run.read(0, ("ada", "QmA1", 1, 40, 20.0), ("ada", "QmA2", 1, 90, 80.0), ("Grace", "QmG", 1, 30, 15.0))
    run.read(1, ("ada", "QmA2", 1, 100, 80.0), ("zed", "QmZ", 1, 25, 12.0), ("ghost", "QmX", 1, 64, 9.0))
    board, summary = run.check()
    assert [(r["username"], r["samples"], r["pending_samples"]) for r in board][:2] == [
        ("ada", 0, 140),
        ("Grace", 0, 30),
    ]
    assert summary["verified_samples"] == 0  # nothing closed yet: the swarm is still in epoch 1

    # A re-sent report is a no-op; an older message that arrives late is stored but does not replace the latest.
    assert not run.report(ada_gpu, 100, 80.0, seq=0)
    assert run.report(ada_gpu, 10, 70.0, seq=100) and run.report(ada_gpu, 5, 1.0, seq=50)

    # The swarm moves to epoch 2: epoch 1's claims are no longer pending. The server's witness saw epoch 1's round
    # with each peer's weight: that is what is verified (read twice, counted once).
    run.read(2, ("ada", "QmA1", 2, 10, 20.0), ("Grace", "QmG", 1, 60, 15.0), ("bob", "QmB", 2, 7, 9.0))
    epoch_1 = [("ada", "QmA1", 40.0), ("ada", "QmA2", 100.0), ("Grace", "QmG", 60.0), ("zed", "QmZ", 25.0)]
    assert run.witness(2.5, "g1", 1, *epoch_1) == 1
    assert run.witness(2.6, "g1", 1, *epoch_1) == 0
    board, summary = run.check()
    rows = {r["username"]: r for r in board}
    # Each peer is credited at most what another volunteer's peer of its device class gains over the same minutes,
    # this round included: ada's second peer claims 100 where the fastest other cpu peer (Grace's) brings 60. (The
    # server knows a volunteer's device classes, not each peer's: ada's cuda peer is held against the cpu peers.)
    assert (rows["ada"]["samples"], rows["ada"]["pending_samples"]) == (40 + 60, 10)
    assert (rows["Grace"]["samples"], rows["Grace"]["pending_samples"]) == (60, 0)
    assert (rows["zed"]["samples"], rows["bob"]["pending_samples"]) == (25, 7)
    assert summary["verified_samples"] == 185

    # The organizer removes zed: its reports are refused from now on; its past work stays on the board.
    olga = api_token(client, "olga")
    assert client.post("/api/experiments/totals/bans", json={"username": "zed"}, headers=olga).status_code == 204
    with client.websocket_connect(
        f"/ws/experiments/totals/report?worker_id={workers['zed'][0]}", headers=api_token(client, "zed")
    ) as ws:
        ws.send_text(
            MetricReport(
                seq=9, step=9, epoch=2, samples=9999, loss=1.0, samples_per_second=1.0, peers=2
            ).model_dump_json()
        )
        assert ws.receive_json()["removed"] is True

    # mallory claims a lot, fast, with nothing signed; bob reports on the one mps run; epoch 3 opens; late, larger
    # reads of closed epochs add nothing; the witness's round of epoch 2 credits ada and bob.
    assert run.report(workers["mallory"][0], 40_000, 900.0, epoch=2)
    assert run.report(workers["bob"][0], 12, 9.0, epoch=2)
    run.read(3, ("ada", "QmA1", 3, 50, 25.0), ("bob", "QmB", 2, 12, 9.0))
    run.read(4, ("ada", "QmA2", 1, 5000, 80.0), ("bob", "QmB", 2, 20, 9.0), ("ada", "QmA1", 3, 45, 25.0))
    assert run.witness(4.5, "g2", 2, ("ada", "QmA1", 10.0), ("bob", "QmB", 20.0), ("mallory", "QmM", 1e9)) == 1
    board, summary = run.check()
    rows = {r["username"]: r for r in board}
    assert (rows["ada"]["samples"], rows["ada"]["pending_samples"]) == (100 + 10, 50)
    assert (rows["bob"]["samples"], rows["bob"]["pending_samples"]) == (20, 0)
    assert rows["zed"]["claimed_samples"] == 25 and rows["zed"]["samples"] == 25
    assert rows["mallory"]["flags"] == ["unbacked", "rate:cpu"]
    assert rows["ada"]["flags"] == [] and rows["Grace"]["flags"] == []
    assert [r["username"] for r in board] == ["ada", "Grace", "zed", "bob", "mallory"]
    assert rows["mallory"]["samples"] == 0  # a round's sender with no record yet: no time to credit it for
    assert summary["verified_samples"] == 110 + 60 + 25 + 20
    assert summary["total_samples"] == 40 + 10 + 30 + 25 + 40_000 + 12

    # A peer that later signs for another account moves its time and peaks there; its epochs stay where
    # they were credited (the ledger's rows keep their user).
    run.read(5, ("Grace", "QmB", 3, 30, 9.0))
    run.check()

    with run.db() as session:  # totals rows match a recount column by column, not only as rendered
        experiment = session.get(Experiment, run.experiment_id)
        ledger = contributions.by_user(session, experiment)
        for row in session.scalars(select(VolunteerTotal)):
            v = ledger.get(row.user_id, contributions.Verified())
            assert (row.verified_samples, row.pending_samples, row.epochs) == (v.samples, v.pending, v.epochs)
            assert row.online_seconds == pytest.approx(v.online_seconds)

    # mallory now also signs records at the rate she claims: she holds the cpu class's fastest signed rate, so
    # her claim is no longer far above it; her signed rate is held against the other cpu peers' instead.
    run.read(6, ("mallory", "QmM", 3, 40, 2000.0))
    # a round one second later where she claims a huge weight: credited at most what the fastest other cpu peer
    # sent in the witnessed rounds of the last WINDOW_SECONDS (ada's second peer: 100, of which it was credited 60)
    assert run.witness(7, "g3", 3, ("mallory", "QmM", 1e9)) == 1
    board, _ = run.check()
    rows = {r["username"]: r for r in board}
    assert rows["mallory"]["samples"] == 100
    # and no more in a round ten seconds on: the others sent nothing since
    assert run.witness(17, "g4", 4, ("mallory", "QmM", 1e9)) == 1
    assert {r["username"]: r for r in run.check()[0]}["mallory"]["samples"] == 100
    # once the window has passed, ada's peer's work sets the bound again: 10 in the window that ends at 610 s
    assert run.witness(610, "g5", 5, ("ada", "QmA1", 10.0)) == 1
    assert run.witness(611, "g6", 6, ("mallory", "QmM", 1e9)) == 1
    assert {r["username"]: r for r in run.check()[0]}["mallory"]["samples"] == 100 + 10
    assert "rate:cpu" not in rows["mallory"]["flags"] and "signed:cpu" in rows["mallory"]["flags"]
    assert rows["ada"]["flags"] == [] and rows["Grace"]["flags"] == []  # ada (cpu and cuda) has no other cuda peer


def test_leaderboard_pages_keep_the_absolute_rank(client, db):
    organizer = make_user(db, "olga")
    names = [f"v{i:02d}" for i in range(7)]
    for name in names:
        make_user(db, name)
    experiment = make_experiment(db, organizer, slug="pages", status="running")
    run = Run(db, experiment.id)
    with db.begin() as session:
        exp = session.get(Experiment, experiment.id)
        for i, name in enumerate(names):
            user = session.scalar(select(User).where(User.username == name))
            worker = experiments.start_worker_run(session, exp, user, "cpu")
            metrics.ingest(session, worker, MetricReport(seq=0, step=0, epoch=1, samples=10 * i, loss=1.0,
                                                         samples_per_second=1.0, peers=1))  # fmt: skip
    run.read(0, *[(name, f"Qm{name}", 1, 5 * i, 1.0) for i, name in enumerate(names)])
    run.read(1, ("v00", "Qmv00", 2, 1, 1.0))  # closes epoch 1
    run.check()
    whole = client.get("/api/experiments/pages/leaderboard").json()
    assert [r["username"] for r in whole] == names[::-1][:6] + ["v00"]
    assert [r["rank"] for r in whole] == list(range(1, 8))
    page = client.get("/api/experiments/pages/leaderboard", params={"limit": 2, "offset": 3}).json()
    assert page == whole[3:5]
    assert client.get("/api/experiments/pages/leaderboard", params={"offset": 7}).json() == []
    for params in ({"limit": 0}, {"limit": 1001}, {"limit": "ten"}, {"offset": -1}):
        bad = client.get("/api/experiments/pages/leaderboard", params=params)
        assert bad.status_code == 422, params
        assert bad.json()["detail"][0]["loc"] == ["query", next(iter(params))]


def test_dashboard_snapshot_shows_the_top_rows_only(db, app):
    from swarmhub.server.live.snapshots import DASHBOARD_ROWS, dashboard_snapshot

    organizer = make_user(db, "olga")
    experiment = make_experiment(db, organizer, slug="crowd", status="running")
    crowd = [make_user(db, f"crowd{i:03d}") for i in range(DASHBOARD_ROWS + 3)]
    with db.begin() as session:
        exp = session.get(Experiment, experiment.id)
        for i, user in enumerate(crowd):
            worker = experiments.start_worker_run(session, exp, session.merge(user), "cpu")
            metrics.ingest(session, worker, MetricReport(seq=0, step=0, epoch=1, samples=i, loss=1.0,
                                                         samples_per_second=1.0, peers=1))  # fmt: skip
    with db() as session:
        snapshot = dashboard_snapshot(session, session.get(Experiment, experiment.id), app)
    assert len(snapshot["leaderboard"]) == DASHBOARD_ROWS
    assert snapshot["leaderboard"][0]["username"] == f"crowd{DASHBOARD_ROWS + 2:03d}"
    assert snapshot["metrics"]["summary"]["total_samples"] == sum(range(DASHBOARD_ROWS + 3))


def test_honest_volunteers_in_rounds_of_their_own_are_each_credited_in_full(client, volunteers):
    """Two honest cpu volunteers whose peers finish their batches at different moments: each round holds one of
    them and the witness, never both. Each is credited all it sent: the one whose rounds come first is held, in each
    of its rounds, to what the other has sent so far (one round behind), and that shortfall is paid in its next round
    and, after its last, with the other's last round. A bound on the other's credit instead
    of its witnessed weight held each at the other's credit, which was held to its own: neither was credited beyond
    the first round. A forger claiming the reducers' cap in rounds of its own is still held to what the fastest
    other volunteer's peer of its class sent over the window."""
    run, _ = volunteers
    run.read(1, ("Grace", "QmG", 1, 10, 50.0), ("zed", "QmZ", 1, 10, 50.0), ("mallory", "QmM", 1, 10, 50.0))
    for index in range(10):
        assert run.witness(2 + 2 * index, f"g{index}", 1 + index, ("Grace", "QmG", 100.0)) == 1
        assert run.witness(3 + 2 * index, f"z{index}", 1 + index, ("zed", "QmZ", 100.0)) == 1
    rows = {r["username"]: r for r in run.check()[0]}
    assert (rows["Grace"]["samples"], rows["zed"]["samples"]) == (10 * 100, 10 * 100)
    for index in range(12):  # 128: the experiment's target batch, where every reducer caps a claimed weight
        assert run.witness(30 + index, f"m{index}", 11 + index, ("mallory", "QmM", 128.0)) == 1
    rows = {r["username"]: r for r in run.check()[0]}
    assert rows["mallory"]["samples"] == 10 * 100  # zed's (or Grace's) witnessed weight over the window, not 12 x 128


def test_an_overclaimer_whose_rounds_come_last_earns_no_more_than_the_honest_peer(client, volunteers):
    """zed claims the reducers' cap (128) in every round while Grace sends 64. They meet once, then Grace averages
    alone for four rounds (held to zed's 128 so far; zed is paid his 128 in full), then zed alone for three: zed is
    held to Grace's 320, and Grace, who sent those 320, is paid her shortfall with zed's last round. Before that
    payment an honest peer whose rounds came first ended with 128 against the overclaimer's 320."""
    run, _ = volunteers
    run.read(1, ("Grace", "QmG", 1, 10, 50.0), ("zed", "QmZ", 1, 10, 50.0))
    assert run.witness(2, "both", 1, ("Grace", "QmG", 64.0), ("zed", "QmZ", 128.0)) == 1
    for index in range(4):
        assert run.witness(3 + index, f"g{index}", 2 + index, ("Grace", "QmG", 64.0)) == 1
    rows = {r["username"]: r for r in run.check()[0]}
    assert (rows["Grace"]["samples"], rows["zed"]["samples"]) == (128, 128)  # each what the other sent, at most
    for index in range(3):
        assert run.witness(10 + index, f"z{index}", 6 + index, ("zed", "QmZ", 128.0)) == 1
    rows = {r["username"]: r for r in run.check()[0]}
    assert (rows["Grace"]["samples"], rows["zed"]["samples"]) == (320, 320)
