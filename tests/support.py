"""Small helpers several test modules share (fixtures are in conftest.py): metric reports and worker runs,
the experiment form, corpora on disk, and the swarm's signed records and witnessed rounds as the monitor hands
them over."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx

from swarmhub.common.protocol import MetricReport
from swarmhub.server import experiments
from swarmhub.server.ledger import contributions, witnessed
from swarmhub.server.models import User

from .conftest import PASSWORD, api_token


def worker_run(db, user, slug):
    with db.begin() as session:
        experiment = experiments.get_visible(session, slug, session.merge(user))
        return experiments.start_worker_run(session, experiment, session.merge(user), "cpu").id


def report(seq, samples=32, loss=2.0):
    return MetricReport(
        seq=seq,
        step=seq,
        epoch=seq // 4,
        samples=samples,
        loss=loss,
        samples_per_second=100.0,
        peers=2,
        averaged_peers=2,
    ).model_dump_json()


def url(worker_id):
    return f"/ws/experiments/live/report?worker_id={worker_id}"


FORM = {
    "title": "Digits together",
    "slug": "digits-together",
    "description": "A first swarm",
    "task": "digits",
    "param.digits.hidden_size": "48",
    "param.digits.batch_size": "16",
    "optimizer": "adam",
    "learning_rate": "0.002",
    "target_batch_size": "128",
    "matchmaking_time": "2",
    "averaging_timeout": "30",
}


def inline_errors(html: str) -> dict[str, str]:
    return dict(re.findall(r'class="error" id="error-([^"]+)" role="alert">([^<]+)<', html))


SMALL = {"vocab_size": "400", "seq_length": "32"}


def corpora_on_disk(settings) -> list[Path]:
    folder = settings.data_dir / "corpora"
    return sorted(folder.iterdir()) if folder.exists() else []


def observe(
    db: Any, experiment_id: int, now: Any, *records: tuple[str, str, int, int], samples_per_second: float = 40.0
) -> None:
    """What the monitor peer read of the swarm's signed progress records: (username, peer, epoch, samples)."""
    items = [
        {"peer_id": peer, "username": name, "epoch": epoch, "samples": samples,
         "samples_per_second": samples_per_second, "time": now.timestamp()}
        for name, peer, epoch, samples in records
    ]  # fmt: skip
    with db.begin() as session:
        experiment = session.get(experiments.Experiment, experiment_id)
        contributions.record(session, experiment, contributions.parse(items), now)


def witness(db: Any, experiment_id: int, now: Any, round_id: str, epoch: int, senders: list[tuple[str, str, float]]):
    """A round the server's auxiliary peer saw complete, as the monitor hands it over."""
    items = [
        {"id": round_id, "epoch": epoch, "time": now.timestamp(),
         "senders": [{"username": name, "peer_id": peer, "weight": weight} for name, peer, weight in senders]}
    ]  # fmt: skip
    with db.begin() as session:
        experiment = session.get(experiments.Experiment, experiment_id)
        assert witnessed.record_rounds(session, experiment, witnessed.parse_rounds(items), now) == 1


def report_over_websocket(client: Any, db: Any, user: User, slug: str, device: str, samples: int) -> None:
    """One metric report from a worker of ``user`` on ``device``, over the real websocket."""
    with db.begin() as session:
        experiment = experiments.get_visible(session, slug, session.merge(user))
        worker_id = experiments.start_worker_run(session, experiment, session.merge(user), device).id
    headers = api_token(client, user.username)
    with client.websocket_connect(f"/ws/experiments/{slug}/report?worker_id={worker_id}", headers=headers) as ws:
        message = {"type": "metrics", "seq": 0, "step": 0, "epoch": 1, "samples": samples, "loss": 2.0,
                   "samples_per_second": 40.0, "peers": 2}  # fmt: skip
        ws.send_text(json.dumps(message))
        assert json.loads(ws.receive_text())["type"] == "ack"


def token_for(url: str, username: str = "alice") -> str:
    """An API token from a live server's real token route."""
    # a password check is slow by design, and slower on a loaded machine: httpx's 5 s default is not enough there
    response = httpx.post(f"{url}/api/auth/token", json={"username": username, "password": PASSWORD}, timeout=60)
    return response.json()["access_token"]
