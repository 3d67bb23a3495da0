"""An experiment's text corpus: checked when it arrives, a tokenizer trained on it, the text cut into shards.

The organizer uploads a text file (``read_bounded`` then ``read_upload``), names one the server can read
(``read_file``) or picks a built-in one (``BUILTIN_CORPORA``, ``builtin_text``). ``prepare`` turns the text into a
folder that workers download file by file::

    manifest.json            what is here, with each file's sha256 (``load_manifest``)
    tokenizer.json           a WordPiece tokenizer (the tokenizers library), loadable by
    tokenizer_config.json      ``transformers.AutoTokenizer.from_pretrained(folder)``
    special_tokens_map.json
    shards/00000.npy ...     training sequences, int32 arrays of shape (n, seq_length), shuffled
    eval.npy                 held-out sequences, from paragraphs that no training sequence contains

Every row is ``[CLS] tokens [SEP]`` padded with ``[PAD]`` (id 0) only after the ``[SEP]`` of the last row of a
split. The route serves a file by the name a worker asks for through ``file_path``, which knows only the manifest's
names.

This module prepares and serves the folder; the checks of an upload (``upload.py``), the built-in
corpora (``builtin.py``) and the tokenizer (``tokenizer.py``) have their own modules, whose names
are reachable from here too.

The web server imports this module: it uses the tokenizers library, numpy and the standard library, never torch,
hivemind or transformers.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from swarmhub.server.corpus.builtin import (
    BUILTIN_CORPORA,
    BUILTIN_MAX_BYTES,
    SKIPPED_DIRS,
    bounded,
    builtin_text,
    python_docstrings,
    source_order,
    stdlib_sources,
)
from swarmhub.server.corpus.tokenizer import (
    CLS,
    ENCODE_BATCH,
    MASK,
    PAD,
    SEP,
    SPECIAL_IDS,
    SPECIAL_TOKENS,
    UNK,
    encode,
    new_tokenizer,
    pack,
    tokenizer_config,
    train_tokenizer,
)
from swarmhub.server.corpus.upload import (
    CONTROL_BYTES,
    MAGIC,
    MAX_CONTROL_SHARE,
    UTF8_BOM,
    CorpusError,
    Readable,
    normalize_newlines,
    read_bounded,
    read_file,
    read_upload,
    size_text,
)

__all__ = [
    "BUILTIN_CORPORA",
    "BUILTIN_MAX_BYTES",
    "CLS",
    "CONTROL_BYTES",
    "ENCODE_BATCH",
    "FORMAT",
    "LIMITS",
    "MAGIC",
    "MASK",
    "MAX_CONTROL_SHARE",
    "PAD",
    "SEP",
    "SHUFFLE_SEED",
    "SKIPPED_DIRS",
    "SPECIAL_IDS",
    "SPECIAL_TOKENS",
    "UNK",
    "UTF8_BOM",
    "CorpusError",
    "Readable",
    "bounded",
    "build",
    "builtin_text",
    "check_settings",
    "encode",
    "file_facts",
    "file_names",
    "file_path",
    "held_out",
    "load_manifest",
    "new_tokenizer",
    "normalize_newlines",
    "pack",
    "prepare",
    "python_docstrings",
    "read_bounded",
    "read_file",
    "read_upload",
    "size_text",
    "source_order",
    "split_paragraphs",
    "stdlib_sources",
    "swap_in",
    "tokenizer_config",
    "too_small",
    "train_tokenizer",
    "write_json",
]

FORMAT = 1
SHUFFLE_SEED = 0

LIMITS = {
    "vocab_size": (100, 128_000),
    "seq_length": (16, 4096),
    "shard_sequences": (1, 1_000_000),
    "max_eval_sequences": (1, 1_000_000),
}


# -- preparing a corpus ---------------------------------------------------------------------------------------


def prepare(
    text: str,
    folder: Path,
    *,
    vocab_size: int = 8000,
    seq_length: int = 128,
    shard_sequences: int = 256,
    eval_fraction: float = 0.02,
    max_eval_sequences: int = 256,
    source: str = "",
) -> dict[str, Any]:
    """Train a tokenizer on ``text``, cut it into shards and write them to ``folder``; returns the manifest.

    Paragraphs (text between blank lines; lines, when the text has too few blank lines) are the unit of the
    held-out split: about ``eval_fraction`` of them, evenly spaced, give ``eval.npy`` (at most
    ``max_eval_sequences`` rows; held-out paragraphs past that go back to training), and no training sequence
    contains a held-out paragraph's text. The tokenizer learns from the training paragraphs only.

    The folder appears complete or not at all: it is built in a sibling temporary folder that then takes its
    place. If anything fails, a folder already at ``folder`` is left as it was. Preparing the same folder twice at
    once is the caller's to prevent. Runs for seconds to minutes: call it from a worker thread or a job, not in
    the event loop. Raises ``CorpusError`` for bad settings or a corpus too small to use.
    """
    check_settings(vocab_size, seq_length, shard_sequences, eval_fraction, max_eval_sequences)
    text = normalize_newlines(text)
    if not text.strip():
        raise CorpusError("The corpus is empty: give it some text.")
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".building", dir=folder.parent))
    try:
        building.chmod(0o755)  # mkdtemp makes it private; the corpus is served to every volunteer
        manifest = build(
            text, building, vocab_size, seq_length, shard_sequences, eval_fraction, max_eval_sequences, source
        )
        swap_in(building, folder)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return manifest


def check_settings(
    vocab_size: int, seq_length: int, shard_sequences: int, eval_fraction: float, max_eval_sequences: int
) -> None:
    given = {
        "vocab_size": vocab_size,
        "seq_length": seq_length,
        "shard_sequences": shard_sequences,
        "max_eval_sequences": max_eval_sequences,
    }
    for field, value in given.items():
        low, high = LIMITS[field]
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise CorpusError(f"{field} must be a whole number from {low} to {high}, not {value!r}.", field=field)
    if not isinstance(eval_fraction, int | float) or not 0 < eval_fraction <= 0.5:
        raise CorpusError(
            f"eval_fraction must be above 0 and at most 0.5, not {eval_fraction!r}.", field="eval_fraction"
        )


def swap_in(building: Path, folder: Path) -> None:
    """Put the finished folder in place. A directory cannot be renamed over a non-empty one, so an older corpus
    moves aside first and goes once the new one is in; a reader in between finds no folder, never a half one."""
    if not folder.exists():
        os.replace(building, folder)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".old", dir=folder.parent))
    os.replace(folder, old / folder.name)
    try:
        os.replace(building, folder)
    except BaseException:
        os.replace(old / folder.name, folder)
        shutil.rmtree(old, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)


def split_paragraphs(text: str, min_count: int) -> list[str]:
    paragraphs = [part.strip() for part in re.split(r"\n[ \t\f\v]*\n", text)]
    paragraphs = [part for part in paragraphs if part]
    if len(paragraphs) < min_count:  # one document per line, as many corpora are laid out
        lines = [line.strip() for line in text.splitlines()]
        paragraphs = max(paragraphs, [line for line in lines if line], key=len)
    return paragraphs


def held_out(count: int, eval_fraction: float) -> list[int]:
    """Evenly spaced indices of about ``eval_fraction`` of ``count`` paragraphs, at least one."""
    n = min(count - 1, max(1, round(count * eval_fraction)))
    return sorted({int((j + 0.5) * count / n) for j in range(n)})


def too_small(what: str, have_tokens: int, need_tokens: int, have_bytes: int, seq_length: int) -> CorpusError:
    per_token = have_bytes / have_tokens if have_tokens else 5.0
    more = max(1, round((need_tokens - have_tokens) * per_token / 0.9))  # the held-out part takes some of it
    return CorpusError(
        f"The corpus is too small: its {what} part makes {have_tokens} tokens, and one sequence of "
        f"{seq_length} tokens needs {need_tokens}. Add about {size_text(more)} more text, "
        "in paragraphs separated by blank lines."
    )


def build(
    text: str,
    folder: Path,
    vocab_size: int,
    seq_length: int,
    shard_sequences: int,
    eval_fraction: float,
    max_eval_sequences: int,
    source: str,
) -> dict[str, Any]:
    paragraphs = split_paragraphs(text, min_count=round(1 / eval_fraction))
    if len(paragraphs) < 2:
        raise CorpusError(
            "The corpus is one paragraph: it needs at least two, separated by a blank line, so that one can be "
            "held out to measure the model on text it has not trained on."
        )
    candidates = held_out(len(paragraphs), eval_fraction)
    excluded = {paragraphs[i] for i in candidates}
    tokenizer = train_tokenizer([p for p in paragraphs if p not in excluded], vocab_size)
    ids = encode(tokenizer, paragraphs)

    body = seq_length - 2
    evaluated, eval_tokens = [], 0
    for i in candidates:
        if eval_tokens >= max_eval_sequences * body:
            break
        evaluated.append(i)
        eval_tokens += len(ids[i])
    eval_texts = {paragraphs[i] for i in evaluated}
    train = [i for i, paragraph in enumerate(paragraphs) if paragraph not in eval_texts]
    train_tokens = sum(len(ids[i]) for i in train)
    if train_tokens < body:
        train_bytes = sum(len(paragraphs[i].encode()) for i in train)
        raise too_small("training", train_tokens, body, train_bytes, seq_length)
    if eval_tokens == 0:
        raise too_small("held-out", 0, 1, 0, seq_length)

    training = pack([ids[i] for i in train], seq_length)
    training = training[np.random.default_rng(SHUFFLE_SEED).permutation(len(training))]
    evaluation = pack([ids[i] for i in evaluated], seq_length)[:max_eval_sequences]

    tokenizer.save(str(folder / "tokenizer.json"))
    write_json(folder / "tokenizer_config.json", tokenizer_config(seq_length))
    write_json(folder / "special_tokens_map.json", {f"{key}_token": token for key, token in SPECIAL_TOKENS.items()})
    np.save(folder / "eval.npy", evaluation, allow_pickle=False)
    (folder / "shards").mkdir()
    shards = []
    for number, start in enumerate(range(0, len(training), shard_sequences)):
        name = f"shards/{number:05d}.npy"
        rows = training[start : start + shard_sequences]
        np.save(folder / name, rows, allow_pickle=False)
        shards.append({"name": name, **file_facts(folder / name), "sequences": len(rows)})

    manifest = {
        "format": FORMAT,
        "source": source,
        "bytes": len(text.encode()),
        "text_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "vocab_size": tokenizer.get_vocab_size(),
        "seq_length": seq_length,
        "special_tokens": dict(SPECIAL_IDS),
        "files": {
            name: file_facts(folder / name)
            for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "eval.npy")
        },
        "shards": shards,
        "train_sequences": len(training),
        "eval_sequences": len(evaluation),
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    write_json(folder / "manifest.json", manifest)
    return manifest


def write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def file_facts(path: Path) -> dict[str, Any]:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return {"sha256": digest.hexdigest(), "bytes": path.stat().st_size}


# -- serving a corpus -----------------------------------------------------------------------------------------


def load_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of a prepared corpus; ``CorpusError`` (field "corpus") when there is none."""
    try:
        manifest = json.loads((Path(folder) / "manifest.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CorpusError("This experiment has no prepared corpus.", field="corpus") from None
    except (OSError, ValueError) as error:
        raise CorpusError(f"The corpus's manifest cannot be read: {error}", field="corpus") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CorpusError(
            "The corpus was prepared in a format this server does not read: prepare it again.", field="corpus"
        )
    return manifest


def file_names(manifest: dict[str, Any]) -> list[str]:
    return [*manifest["files"], *(shard["name"] for shard in manifest["shards"])]


def file_path(folder: Path, name: str, manifest: dict[str, Any] | None = None) -> Path:
    """The path of the corpus file called ``name`` (as a URL gives it). Only the manifest's own names are served,
    so no name can reach outside the folder; anything else is a ``CorpusError`` with field "name"."""
    folder = Path(folder)
    manifest = manifest if manifest is not None else load_manifest(folder)
    if name not in file_names(manifest):
        raise CorpusError(f"The corpus has no file {name!r}.", field="name")
    path = folder / name
    if not path.resolve().is_relative_to(folder.resolve()) or not path.is_file():
        raise CorpusError(f"The corpus file {name!r} is missing: prepare the corpus again.", field="name")
    return path
