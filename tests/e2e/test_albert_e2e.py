"""The paper's workload end to end: an organizer gives an ALBERT experiment its text (the Python standard
library's docstrings, uploaded), the server trains the tokenizer and serves the shards, two real `swarmhub join`
processes pretrain a tiny ALBERT together, the server's checkpoint peer measures held-out loss falling, the model
downloads in the transformers format and fills a masked token; then the swarm empties, the experiment restarts,
and the next volunteer goes on from the checkpoint instead of from scratch; last, the organizer rolls the swarm
back to its first checkpoint while a volunteer trains, and she trains on from there."""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import signal
import subprocess
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from swarmhub.server.corpus import text as corpus

from ..processes import SWARMHUB, descendants, http, outlived, running_server, signup, wait_volunteers

# Not `solo`: it trains so many steps, not for so long, and asserts what they did (the "peers" lane of tests/lanes.py)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]  # 605 s once on a slow machine, the other lanes beside it
SLUG = "e2e-albert"
VOCAB = 1000
UPLOADED_BYTES = 400_000
TASK = {"size": "tiny", "batch_size": 16, "warmup_steps": 2, "total_steps": 2000, "masking": "whole-word"}


def create_experiment(url: str) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {signup(url, 'organizer')}"}
    created = http.post(
        f"{url}/api/experiments",
        headers=headers,
        json={
            "slug": SLUG,
            "title": "E2E ALBERT",
            "task": "albert-mlm",
            "task_params": TASK,
            "optimizer": "lamb",
            "learning_rate": 0.06,
            "target_batch_size": 128,
            "matchmaking_time": 2.0,
            "averaging_timeout": 20.0,
            "checkpoint_minutes": 0.2,  # every 12 s: each pulls the swarm's state and scores it on held-out text
        },
    )
    assert created.status_code == 201, created.text
    text = corpus.builtin_text("python-docstrings", max_bytes=UPLOADED_BYTES).encode()
    uploaded = http.put(
        f"{url}/api/experiments/{SLUG}/corpus",
        headers=headers,
        files={"file": ("docstrings.txt", text, "text/plain")},
        data={"vocab_size": str(VOCAB), "seq_length": "64"},
        timeout=120,
    )
    assert uploaded.status_code == 200, uploaded.text
    return headers


def set_status(url: str, headers: dict[str, str], action: str) -> None:
    response = http.post(f"{url}/api/experiments/{SLUG}/status", headers=headers, json={"action": action})
    assert response.status_code == 200, response.text


def join(url: str, tmp: Path, name: str, limit: list[str]) -> tuple[str, Any, subprocess.Popen]:
    token = signup(url, name) if not (tmp / name).exists() else (tmp / name / "token").read_text()
    env = {**os.environ, "SWARMHUB_CONFIG_DIR": str(tmp / name), "SWARMHUB_STATE_DIR": str(tmp / name)}
    env["SWARMHUB_CACHE_DIR"] = str(tmp / name / "cache")
    env.update({"SWARMHUB_SERVER": url, "SWARMHUB_TOKEN": token})
    (tmp / name).mkdir(exist_ok=True)
    (tmp / name / "token").write_text(token)
    out = open(tmp / f"{name}.out", "ab")
    command = [*SWARMHUB, "join", SLUG, *limit, "--listen", "/ip4/127.0.0.1/tcp/0"]
    return name, out, subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)


def checkpoints(url: str) -> list[dict[str, Any]]:
    return http.get(f"{url}/api/experiments/{SLUG}/checkpoints").json()


def wait_for_checkpoint(url: str, after_epoch: int, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [c for c in checkpoints(url) if c["epoch"] > after_epoch and c["downloadable"]]
        if done:
            return done[-1]
        time.sleep(1)
    raise AssertionError(f"no checkpoint after step {after_epoch} within {timeout:.0f} s: {checkpoints(url)}")


def saved_checkpoint(tmp: Path, epoch: int) -> dict[str, Any]:
    """The info.json of the server's checkpoint of ``epoch`` and its saved optimizer's learning rates."""
    import torch

    (folder,) = [path.parent for path in tmp.rglob(f"{epoch:010d}/state.pt")]
    state = torch.load(folder / "state.pt", map_location="cpu", weights_only=True)
    rates = [group["lr"] for group in state["optimizer"]["param_groups"]]
    return {"info": json.loads((folder / "info.json").read_text()), "rates": rates}


def reports(tmp: Path, username: str) -> list[tuple[int, float]]:
    """(epoch, loss) of every report the volunteer's workers sent, oldest first."""
    engine = sa.create_engine(f"sqlite:///{tmp / 'e2e.db'}")
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT p.epoch, p.loss FROM metric_points p JOIN worker_runs w ON w.id = p.worker_run_id "
                "JOIN users u ON u.id = w.user_id WHERE u.username = :name ORDER BY p.id"
            ),
            {"name": username},
        ).all()
    engine.dispose()
    return [(int(epoch), float(loss)) for epoch, loss in rows]


def held_out_paragraphs(count: int = 40) -> list[str]:
    """Standard-library docstrings that come after the uploaded text: no worker and no tokenizer has seen them."""
    uploaded = len(list(corpus.bounded(corpus.python_docstrings(), UPLOADED_BYTES)))
    later = itertools.islice(corpus.python_docstrings(), uploaded, None)
    return [paragraph for paragraph in later if len(paragraph.split()) >= 8][:count]


def masked_lm_losses(model_dir: Path) -> tuple[float, float, list[str]]:
    """Masked-LM loss on held-out text of the downloaded model and of an untrained model of the same config (the
    same masks: every fifth token), and the downloaded model's top tokens at the masks."""
    import torch
    from transformers import AlbertConfig, AlbertForMaskedLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trained = AlbertForMaskedLM.from_pretrained(model_dir).eval()
    torch.manual_seed(0)
    untrained = AlbertForMaskedLM(AlbertConfig.from_pretrained(model_dir)).eval()
    batch = tokenizer(held_out_paragraphs(), truncation=True, max_length=64, padding=True, return_tensors="pt")
    labels = batch["input_ids"].clone()
    special = torch.tensor(
        [tokenizer.get_special_tokens_mask(ids, already_has_special_tokens=True) for ids in labels.tolist()]
    ).bool()
    chosen = (torch.arange(labels.shape[1]) % 5 == 2).expand_as(labels) & ~special
    batch["input_ids"] = labels.masked_fill(chosen, tokenizer.mask_token_id)
    labels = labels.masked_fill(~chosen, -100)
    with torch.no_grad():
        out = trained(**batch, labels=labels)
        baseline = untrained(**batch, labels=labels).loss
    tops = tokenizer.convert_ids_to_tokens(out.logits.argmax(-1)[chosen].tolist())
    return float(out.loss), float(baseline), tops


def test_albert_pretrained_by_two_volunteers_and_resumed_from_its_checkpoint(tmp_path):
    with running_server(tmp_path, checkpoints_kept="100") as (url, server_process):
        headers = create_experiment(url)
        set_status(url, headers, "start")
        page = http.get(f"{url}/experiments/{SLUG}").text
        assert 'id="checkpoints"' in page and 'id="corpus-info"' in page

        workers = [join(url, tmp_path, name, ["--max-steps", "100"]) for name in ("ada", "grace")]
        seen, outputs = wait_volunteers(workers, tmp_path)
        for name, _, process in workers:
            assert process.returncode == 0, f"{name} exited {process.returncode}:\n{outputs[name][-3000:]}"
        assert not outlived(seen)

        # Held-out loss, measured by the server on text no worker trains on, fell as the swarm trained.
        last = wait_for_checkpoint(url, after_epoch=0)
        scored = [c for c in checkpoints(url) if c["eval_loss"] is not None]
        assert len(scored) >= 2, scored
        assert scored[-1]["eval_loss"] < scored[0]["eval_loss"] - 0.3, scored
        assert scored[0]["eval_loss"] < math.log(VOCAB) + 1  # a real masked-LM loss, not a broken one
        # ...with its masked-token accuracy beside it, from the checkpoint peer through the coordinator to the list.
        assert all(0 <= c["eval_top1"] <= c["eval_top5"] <= 1 for c in scored), scored
        assert scored[-1]["eval_top5"] > scored[0]["eval_top5"], scored

        # The newest model downloads in the transformers format and fills a masked word.
        download = http.get(f"{url}/api/experiments/{SLUG}/model", timeout=60)
        assert download.status_code == 200, download.text
        model_dir = tmp_path / "model"
        with zipfile.ZipFile(io.BytesIO(download.content)) as archive:
            assert {"config.json", "tokenizer.json", "model.safetensors"} <= set(archive.namelist())
            archive.extractall(model_dir)
        # On held-out text it fills masked tokens better than the same model untrained (about ln(VOCAB)), by as much
        # as the server's own measurement requires above (100 steps each teach a tiny ALBERT little more than which
        # tokens are frequent: 6.2 against 6.9 in one run of 120), and it guesses text, not padding or markers.
        loss, untrained_loss, tops = masked_lm_losses(model_dir)
        print(f"held-out masked-LM loss {loss:.2f}, untrained {untrained_loss:.2f}, {len(tops)} masks")
        assert loss < untrained_loss - 0.3, (loss, untrained_loss, tops[:20])
        specials = [t for t in tops if t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")]
        assert len(specials) < len(tops) / 10, (specials[:10], tops[:20])

        # The swarm has emptied. The organizer pauses and restarts it: the server's peers start afresh and the
        # checkpoint peer loads the newest checkpoint from disk.
        resumed_from = checkpoints(url)[-1]
        set_status(url, headers, "pause")
        set_status(url, headers, "start")
        first_losses = [loss for _, loss in reports(tmp_path, "ada")[:2]]
        # online until the server's checkpoint peer has pulled its state once (60 steps once ended, and the volunteer
        # left within seconds, before the restarted checkpoint peer's first pull on a busy machine); the step limit
        # is a bound
        late = join(url, tmp_path, "linus", ["--max-steps", "400"])
        try:
            # A checkpoint newer than linus's first step is linus's work: the one read above may not be the last of
            # the emptied swarm (the checkpoint peer can still be saving its final state when the list is read).
            deadline = time.monotonic() + 180
            while not (first := reports(tmp_path, "linus")):
                running = late[2].poll() is None and time.monotonic() < deadline
                assert running, (tmp_path / "linus.out").read_text()[-3000:]
                time.sleep(1)
            later = wait_for_checkpoint(url, after_epoch=first[0][0], timeout=240)
        finally:
            late[2].send_signal(signal.SIGTERM)
            seen, outputs = wait_volunteers([late], tmp_path)
        assert late[2].returncode in (0, 143), outputs["linus"][-3000:]  # 143: it left cleanly on SIGTERM
        linus = reports(tmp_path, "linus")
        assert linus, outputs["linus"][-3000:]
        # Its step continues from the checkpoint's, and its loss from where the swarm left off, not from scratch.
        assert linus[0][0] >= resumed_from["epoch"], (linus[:3], resumed_from)
        assert linus[0][1] < min(first_losses) - 0.3, (linus[:3], first_losses)
        assert later["epoch"] > last["epoch"]
        assert not outlived(seen)

        # Rolled back, as after an attack: while joan trains, the organizer restores the first kept checkpoint. The
        # server's checkpoint peer shares it as the swarm's state and saves it at once (the very same model: the same
        # held-out loss); joan loads it and trains on from it, so the next checkpoint is near the restored one's loss,
        # not the newer one's the swarm had reached.
        before = [c for c in checkpoints(url) if c["eval_loss"] is not None]
        target = next(c for c in before if c["downloadable"])
        reached = before[-1]
        assert target["eval_loss"] > reached["eval_loss"] + 0.3, before
        joan = join(url, tmp_path, "joan", ["--max-steps", "150"])
        deadline = time.monotonic() + 120
        while not reports(tmp_path, "joan") and time.monotonic() < deadline:
            time.sleep(1)
        assert reports(tmp_path, "joan"), (tmp_path / "joan.out").read_text()[-3000:]
        rolled = http.post(f"{url}/api/experiments/{SLUG}/rollback", headers=headers, json={"epoch": target["epoch"]})
        assert rolled.status_code == 202, rolled.text
        deadline = time.monotonic() + 90
        while not (restored := [c for c in checkpoints(url) if c["restored_from"] == target["epoch"]]):
            assert time.monotonic() < deadline, checkpoints(url)[-5:]
            time.sleep(1)
        assert restored[0]["eval_loss"] == pytest.approx(target["eval_loss"], abs=1e-4)
        assert restored[0]["epoch"] > reached["epoch"]  # the epoch counter goes on
        after = wait_for_checkpoint(url, after_epoch=restored[0]["epoch"])  # taken from joan's state
        # The learning-rate schedule continues from the restored checkpoint's step, not from the swarm's epoch:
        # each checkpoint's saved optimizer holds the rate of its schedule step.
        for checkpoint, step in (
            (target, target["epoch"]),
            (restored[0], target["epoch"]),
            (after, target["epoch"] + after["epoch"] - restored[0]["epoch"]),
        ):
            saved = saved_checkpoint(tmp_path, checkpoint["epoch"])
            assert saved["info"]["schedule_step"] == step, (checkpoint, saved["info"])
            rate = 0.06 * min((step + 1) / 2, (2000 - step) / 1998)  # TASK's warm-up and linear decay
            assert saved["rates"] == pytest.approx([rate] * len(saved["rates"]), rel=1e-6), (step, saved["rates"])
        deadline = time.monotonic() + 60  # her reports go out every few seconds
        while not any(epoch >= restored[0]["epoch"] for epoch, _ in reports(tmp_path, "joan")):
            assert time.monotonic() < deadline, (tmp_path / "joan.out").read_text()[-3000:]
            time.sleep(1)
        joan[2].send_signal(signal.SIGTERM)  # her step limit is a bound, not the plan: the test has what it needs
        seen, outputs = wait_volunteers([joan], tmp_path)
        assert joan[2].returncode in (0, 143), outputs["joan"][-3000:]  # 143: she left the swarm cleanly on SIGTERM
        assert abs(after["eval_loss"] - target["eval_loss"]) < abs(after["eval_loss"] - reached["eval_loss"]), (
            target,
            reached,
            after,
        )
        assert not outlived(seen)
        server_children = descendants(server_process)  # its bootstrap, checkpoint and p2pd processes
        assert len(server_children) >= 2
    # The server stopped its checkpoint peer and its other swarm processes with it.
    assert not outlived(server_children, grace=30)
