"""In real Chromium: an organizer creates an ALBERT experiment through the form (its parameters rendered from the
task's schema, a choice list among them), uploads its training text on the experiment's page (a bad file first),
and the dashboard charts the server's checkpoints' held-out loss against the unigram baseline, shows their
accuracy, and links the newest model."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from playwright.sync_api import expect
from sqlalchemy import select

from swarmhub.server.app import create_app
from swarmhub.server.core.settings import Settings
from swarmhub.server.corpus import text as corpus
from swarmhub.server.corpus import training_data
from swarmhub.server.models import Experiment
from swarmhub.server.services import services

from ..conftest import PASSWORD, LiveServer
from .conftest import shown

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


@pytest.fixture
def server(tmp_path: Path):
    settings = Settings(
        environment="test",
        data_dir=tmp_path / "data",
        database_url=f"sqlite:///{tmp_path / 'browser.db'}",
        live_interval_seconds=0.5,
        swarm_enabled=False,  # the pages only: no swarm peers start
    )
    app = create_app(settings)
    with LiveServer(app) as live:
        yield live, app


def test_organizer_gives_albert_its_text_and_sees_checkpoints(server, page, tmp_path):
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    live, app = server
    base = live.url
    page.goto(f"{base}/signup")
    page.fill("input[name=username]", "organizer")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")

    page.goto(f"{base}/experiments/new")
    page.fill("input[name=title]", "Browser ALBERT")
    page.fill("input[name=slug]", "browser-albert")
    page.select_option("#task-select", "albert-mlm")
    size = page.locator("select[name='param.albert-mlm.size']")
    expect(size).to_be_visible()
    expect(page.locator("input[name='param.digits.hidden_size']")).to_be_hidden()
    size.select_option("tiny")
    page.select_option("select[name='param.albert-mlm.masking']", "token")
    page.select_option("select[name=optimizer]", "lamb")
    page.click("#experiment-form button[type=submit]")
    expect(page).to_have_url(f"{base}/experiments/browser-albert")
    expect(page.locator("#corpus-missing")).to_be_visible()

    binary = tmp_path / "notes.txt"
    binary.write_bytes(b"PK\x03\x04" + bytes(300))
    page.set_input_files("#corpus-form input[name=file]", str(binary))
    page.click("#corpus-form button[type=submit]")
    expect(page.locator("#error-file")).to_contain_text("zip")

    # A real text, under a file name that is markup: shown as text, never run.
    text = tmp_path / "<img src=x onerror=alert(1)>.txt"
    text.write_bytes(corpus.builtin_text("python-docstrings", max_bytes=120_000).encode())
    page.set_input_files("#corpus-form input[name=file]", str(text))
    page.fill("#corpus-form input[name=vocab_size]", "500")
    page.fill("#corpus-form input[name=seq_length]", "32")
    page.click("#corpus-form button[type=submit]")
    expect(page.locator("#corpus-info")).to_contain_text("upload:<img src=x onerror=alert(1)>.txt")
    expect(page.locator("#corpus-info")).to_contain_text("32 tokens")

    # The checkpoint peer's results as the server records them (here without a swarm).
    settings = services(app).settings
    with services(app).sessionmaker.begin() as session:
        experiment = session.scalar(select(Experiment).where(Experiment.slug == "browser-albert"))
        experiment.status = "running"
        for epoch, loss in ((1, 6.2), (4, 5.6), (9, 5.1)):
            folder = settings.data_dir / "checkpoints" / "run" / str(epoch)
            folder.mkdir(parents=True)
            with zipfile.ZipFile(folder / "model.zip", "w") as archive:
                archive.writestr("config.json", json.dumps({"epoch": epoch}))
            training_data.record_checkpoint(
                session, settings, experiment, epoch, loss, f"run/{epoch}", eval_top1=epoch / 100, eval_top5=0.375
            )
        stored = training_data.baseline(session, experiment)
    assert stored is not None
    page.reload()
    expect(page.locator("#chart-eval")).to_have_attribute("data-points", "3")
    # The unigram baseline the server measured when it prepared the text: a labelled dashed line on the held-out
    # chart, and in words under it; the newest checkpoint's accuracy beside its loss.
    expect(page.locator("#chart-eval")).to_have_attribute("data-reference", str(stored.loss))
    expect(page.locator("#chart-eval")).to_contain_text("baseline: knows only token frequencies")
    baseline = page.locator("#eval-baseline")
    expect(baseline).to_be_visible()
    expect(baseline).to_contain_text("knows only token frequencies")
    expect(baseline.locator(".baseline-loss")).to_have_text(shown(stored.loss, 3))
    expect(baseline.locator(".baseline-top5")).to_have_text(shown(100 * stored.top5, 1) + " %")
    expect(page.locator("#eval-stat-loss")).to_have_text("5.1")
    expect(page.locator("#eval-stat-top1")).to_have_text("9 %")
    expect(page.locator("#eval-stat-top5")).to_have_text("37.5 %")
    expect(page.locator("#loss-baseline")).to_be_hidden()  # ALBERT's baseline belongs to the held-out loss
    expect(page.locator("#model-download")).to_be_visible()
    expect(page.locator("#model-step")).to_contain_text("step 9")
    expect(page.locator("#model-link")).to_have_attribute("href", "/api/experiments/browser-albert/model")
    with page.expect_download() as download:
        page.click("#model-link")
    saved = tmp_path / "model.zip"
    download.value.save_as(saved)
    with zipfile.ZipFile(saved) as archive:
        assert json.loads(archive.read("config.json")) == {"epoch": 9}
    assert dialogs == []
