"""The worker's side of the corpus (``swarmhub.worker.tasks.data``) against the real server routes: files download
once and are checked against the manifest, a cache file that went bad is fetched again, a file the server
garbles is refused, and shards come in the server's turn order (the worker's own order when it cannot ask)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from swarmhub.server.corpus import text as corpus
from swarmhub.worker.tasks.data import CorpusUnavailable, LocalCorpus, RemoteCorpus, load_sequences, sha256_of

from .conftest import api_token, make_experiment, make_user


@pytest.fixture
def served(client, db):
    """A running albert-mlm experiment with its text, and a volunteer's token."""
    alice = make_user(db)
    make_user(db, "bob")
    make_experiment(db, alice, slug="albert-run", task="albert-mlm", task_params={"size": "tiny"})
    headers = api_token(client)
    text = corpus.builtin_text("python-docstrings", max_bytes=60_000).encode()
    response = client.put(
        "/api/experiments/albert-run/corpus",
        headers=headers,
        files={"file": ("docs.txt", text)},
        data={"vocab_size": "300", "seq_length": "16"},
    )
    assert response.status_code == 200, response.text
    client.post("/api/experiments/albert-run/status", headers=headers, json={"action": "start"})
    return api_token(client, "bob")


def remote(client, headers, cache: Path, garble: set[str] | None = None) -> tuple[RemoteCorpus, list[str]]:
    fetched: list[str] = []
    base = "/api/experiments/albert-run/data"

    def get(name: str) -> bytes:
        fetched.append(name)
        response = client.get(f"{base}/files/{name}", headers=headers)
        assert response.status_code == 200, response.text
        return response.content[::-1] if garble and name in garble else response.content

    def next_shard() -> int | None:
        return client.post(f"{base}/next-shard", headers=headers).json()["index"]

    manifest = client.get(f"{base}/manifest", headers=headers).json()
    return RemoteCorpus(manifest, cache, get, next_shard), fetched


def test_files_download_once_and_are_checked(client, served, tmp_path):
    data, fetched = remote(client, served, tmp_path / "cache")
    path = data.file("tokenizer.json")
    assert path.is_file() and path.is_relative_to(tmp_path / "cache")
    assert data.file("tokenizer.json") == path
    assert fetched == ["tokenizer.json"]  # the second read came from the cache

    again, fetched_again = remote(client, served, tmp_path / "cache")  # a restarted worker
    again.file("tokenizer.json")
    assert fetched_again == []

    path.write_text("{}")  # the cached copy went bad (a crash mid-write, a disk error)
    again.file("tokenizer.json")
    assert fetched_again == ["tokenizer.json"]
    assert sha256_of(path) == again.manifest["files"]["tokenizer.json"]["sha256"]

    with pytest.raises(CorpusUnavailable, match="has no file"):
        data.file("../../etc/passwd")


def test_a_garbled_download_is_refused_and_not_cached(client, served, tmp_path):
    data, _ = remote(client, served, tmp_path / "cache", garble={"eval.npy"})
    with pytest.raises(CorpusUnavailable, match="does not match its manifest"):
        data.file("eval.npy")
    assert not (data.folder / "eval.npy").exists()


def test_shards_come_in_the_servers_turn_order(client, served, tmp_path):
    data, _ = remote(client, served, tmp_path / "cache")
    names = [shard["name"] for shard in data.manifest["shards"]]
    assert len(names) >= 2
    stream = data.shards(seed=1)
    taken = [next(stream).relative_to(data.folder).as_posix() for _ in names]
    assert sorted(taken) == sorted(names)  # each once before any twice
    rows = load_sequences(next(stream))
    assert rows.dtype == np.int32 and rows.shape[1] == 16


def test_without_the_server_a_worker_reads_every_shard_in_its_own_order(client, served, tmp_path):
    data, _ = remote(client, served, tmp_path / "cache")
    offline = RemoteCorpus(data.manifest, tmp_path / "cache", data._get, lambda: None)
    names = sorted(shard["name"] for shard in data.manifest["shards"])
    stream = offline.shards(seed=7)
    first = [next(stream).relative_to(offline.folder).as_posix() for _ in names]
    assert sorted(first) == names


def test_the_servers_own_peers_read_the_folder_in_place(client, served, settings):
    (folder,) = (settings.data_dir / "corpora").iterdir()
    local = LocalCorpus(folder)
    assert local.file("eval.npy") == folder / "eval.npy"
    stream = local.shards(seed=3)
    names = sorted(shard["name"] for shard in local.manifest["shards"])
    assert sorted(next(stream).relative_to(folder).as_posix() for _ in names) == names
    with pytest.raises(CorpusUnavailable):
        LocalCorpus(folder.parent / "missing")
