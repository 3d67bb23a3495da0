"""An experiment's corpus as tasks read it (:class:`swarmhub.worker.tasks.TaskData`).

- :class:`LocalCorpus` reads a prepared corpus folder in place: the server's own peers, and tests.
- :class:`RemoteCorpus` is a volunteer's: it downloads the manifest, the files a task opens and the shards the
  server hands out, checks each against the manifest's sha256, and caches them under the worker's cache folder
  so a restart downloads nothing twice.

Nothing here runs code from the server: the corpus is token ids or image pixels in ``.npy`` files (loaded without
pickle, their dtype and shape checked) and a tokenizer's JSON. Nothing here writes outside the cache either: every
name from the server's manifest is checked up front and again before each write
(:mod:`swarmhub.worker.tasks.safe_paths`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from swarmhub.worker.tasks.safe_paths import confined, corpus_folder, write_file

logger = logging.getLogger(__name__)


class CorpusUnavailable(RuntimeError):
    """The corpus cannot be read or downloaded; the message says what to do."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_sequences(path: Path) -> np.ndarray:
    """A shard or ``eval.npy``: int32 (sequences, seq_length). Never unpickles."""
    array = _load(path)
    if array.ndim != 2 or array.dtype != np.int32:
        raise CorpusUnavailable(f"{path.name} is not a token array (shape {array.shape}, {array.dtype})")
    return array


def load_images(path: Path) -> np.ndarray:
    """An image shard, ``eval.npy`` or ``bank.npy``: uint8 (images, 3, size, size). Never unpickles."""
    array = _load(path)
    if array.dtype != np.uint8 or array.ndim != 4 or array.shape[1] != 3 or array.shape[2] != array.shape[3]:
        raise CorpusUnavailable(
            f"{path.name} is not an array of square RGB images (shape {array.shape}, {array.dtype}; "
            "uint8 (n, 3, size, size) expected)"
        )
    return array


def load_labels(path: Path) -> np.ndarray:
    """``eval_labels.npy`` or ``bank_labels.npy``: int64 (images,), indices into the manifest's ``classes``."""
    array = _load(path)
    if array.dtype != np.int64 or array.ndim != 1 or (array.size and int(array.min()) < 0):
        raise CorpusUnavailable(f"{path.name} is not an array of labels (shape {array.shape}, {array.dtype})")
    return array


def _load(path: Path) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:  # pickled objects, a cut or foreign file
        raise CorpusUnavailable(f"{path.name} is not a plain numpy array: {exc}") from None


class LocalCorpus:
    """A prepared corpus folder read in place; shards in a seeded order that repeats once all were read."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        try:
            self._manifest = json.loads((self.folder / "manifest.json").read_text())
        except (OSError, ValueError) as exc:
            raise CorpusUnavailable(f"no prepared corpus in {self.folder}: {exc}") from None

    @property
    def manifest(self) -> dict[str, Any]:
        return self._manifest

    def file(self, name: str) -> Path:
        if name not in self._manifest.get("files", {}):
            raise CorpusUnavailable(f"the corpus has no file {name!r}")
        return self.folder / name

    def shards(self, seed: int) -> Iterator[Path]:
        names = [shard["name"] for shard in self._manifest["shards"]]
        rng = np.random.default_rng(seed)
        while True:
            for index in rng.permutation(len(names)):
                yield self.folder / names[int(index)]


class RemoteCorpus:
    """A corpus served by the swarmhub server, cached under ``cache_dir`` (one folder per corpus content).

    ``get(path)`` returns the bytes of a GET relative to the experiment's data path; ``next_shard()`` asks the
    server for the next shard index in the swarm's turn order (None when the server cannot be reached: the
    worker then goes on with shards in its own seeded order, so training never waits on the server).
    """

    def __init__(
        self,
        manifest: dict[str, Any],
        cache_dir: Path,
        get: Callable[[str], bytes],
        next_shard: Callable[[], int | None],
    ):
        self._manifest = manifest
        self._get = get
        self._next_shard = next_shard
        # One cache folder per corpus content: a text corpus names it by its text's sha256, an image corpus by the
        # sha256 over its files' hashes.
        identity = manifest.get("text_sha256", manifest.get("sha256", "corpus"))
        self.folder = corpus_folder(Path(cache_dir), {"text_sha256": identity})
        shards = manifest.get("shards", [])
        for name in [*manifest.get("files", {}), *(s.get("name") if isinstance(s, dict) else s for s in shards)]:
            confined(self.folder, name)  # a hostile name is refused before training starts, not halfway
        self._lock = threading.Lock()

    @property
    def manifest(self) -> dict[str, Any]:
        return self._manifest

    def _fetch(self, name: str, sha256: str) -> Path:
        with self._lock:
            path = confined(self.folder, name)
            if path.exists() and sha256_of(path) == sha256:
                return path
            data = self._get(name)
            if hashlib.sha256(data).hexdigest() != sha256:
                raise CorpusUnavailable(f"{name} from the server does not match its manifest: try again later")
            return write_file(self.folder, name, data)

    def file(self, name: str) -> Path:
        entry = self._manifest.get("files", {}).get(name)
        if entry is None:
            raise CorpusUnavailable(f"the corpus has no file {name!r}")
        return self._fetch(name, entry["sha256"])

    def shards(self, seed: int) -> Iterator[Path]:
        shards = self._manifest["shards"]
        rng = np.random.default_rng(seed)
        fallback: list[int] = []
        while True:
            index = self._next_shard()
            if index is None or not 0 <= index < len(shards):
                if not fallback:
                    fallback = [int(i) for i in rng.permutation(len(shards))]
                index = fallback.pop()
            shard = shards[index]
            yield self._fetch(shard["name"], shard["sha256"])


def corpus_of(server_url: str, token: str, slug: str, cache_dir: Path, data_path: str | None = None) -> Any:
    """The experiment's corpus as the server hands it out: its manifest now, shards and the next shard's
    number on demand (``swarmhub join`` and ``swarmhub doctor``)."""
    from swarmhub.worker.client import USER_AGENT, ApiClient, WorkerError

    path = data_path or f"/api/experiments/{slug}/data"  # slug: checked against SLUG_RE by the commands
    with ApiClient(server_url, token, user_agent=USER_AGENT) as api:
        manifest = api.data_manifest(slug, path)

    def get(name: str) -> bytes:
        with ApiClient(server_url, token, user_agent=USER_AGENT) as api:
            return api.data_file(slug, path, name)

    def next_shard() -> int | None:
        try:
            with ApiClient(server_url, token, user_agent=USER_AGENT) as api:
                return api.next_shard(slug, path)
        except WorkerError as exc:  # training goes on with shards in this worker's own order
            logger.warning("could not ask the server for the next shard: %s", exc.message)
            return None

    return RemoteCorpus(manifest, cache_dir, get, next_shard)
