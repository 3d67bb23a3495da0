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

The web server imports this module: it uses the tokenizers library, numpy and the standard library, never torch,
hivemind or transformers.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import sysconfig
import tempfile
import warnings
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

FORMAT = 1
SPECIAL_TOKENS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
# The trainer gives special tokens the first ids in this order; workers and the eval loop rely on them.
SPECIAL_IDS = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
SHUFFLE_SEED = 0
ENCODE_BATCH = 2000  # paragraphs per encode_batch call: bounds the Encoding objects alive at once

LIMITS = {
    "vocab_size": (100, 128_000),
    "seq_length": (16, 4096),
    "shard_sequences": (1, 1_000_000),
    "max_eval_sequences": (1, 1_000_000),
}

# -- refusals -------------------------------------------------------------------------------------------------


class CorpusError(ValueError):
    """A corpus or its settings that cannot be used; ``message`` says what to do, ``field`` which input is wrong
    ("file", "corpus", "name" or one of ``prepare``'s argument names)."""

    def __init__(self, message: str, *, field: str = "file"):
        super().__init__(message)
        self.message = message
        self.field = field


def size_text(n: int) -> str:
    """``10 MB``, ``300 KB``, ``512 bytes`` (decimal units, as browsers and file managers show sizes)."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if n >= scale:
            return f"{n / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{n} bytes"


# -- uploads --------------------------------------------------------------------------------------------------

# Leading bytes of files that people upload by mistake instead of text.
MAGIC = (
    (b"PK\x03\x04", "a zip archive (.zip, .docx, .xlsx, .odt, .epub)"),
    (b"PK\x05\x06", "a zip archive"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"BZh", "a bzip2 archive"),
    (b"\xfd7zXZ\x00", "an xz archive"),
    (b"(\xb5/\xfd", "a zstd archive"),
    (b"7z\xbc\xaf'\x1c", "a 7-zip archive"),
    (b"Rar!\x1a\x07", "a rar archive"),
    (b"%PDF-", "a PDF document"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "an old Microsoft Office document (.doc, .xls)"),
    (b"{\\rtf", "an RTF document"),
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF87a", "a GIF image"),
    (b"GIF89a", "a GIF image"),
    (b"\x7fELF", "a program (ELF)"),
    (b"SQLite format 3\x00", "an SQLite database"),
    (b"\x93NUMPY", "a numpy array"),
    (b"\xff\xfe", "UTF-16 text"),
    (b"\xfe\xff", "UTF-16 text"),
)
# Control bytes other than tab, newline, form feed and carriage return. Text has almost none.
CONTROL_BYTES = bytes([*range(0, 9), 11, *range(14, 32), 127])
MAX_CONTROL_SHARE = 0.02
UTF8_BOM = b"\xef\xbb\xbf"


class Readable(Protocol):
    async def read(self, size: int = -1) -> bytes: ...


async def read_bounded(upload: Readable, max_bytes: int, *, chunk_size: int = 1 << 20) -> bytes:
    """Read an upload (a Starlette ``UploadFile``) in chunks, refusing it as soon as it passes ``max_bytes``:
    the rest of a too-large file is never read into memory."""
    received = bytearray()
    while True:
        chunk = await upload.read(min(chunk_size, max_bytes + 1 - len(received)))
        if not chunk:
            return bytes(received)
        received += chunk
        if len(received) > max_bytes:
            raise CorpusError(f"The file is larger than the limit of {size_text(max_bytes)}: upload a smaller one.")


def read_upload(data: bytes, *, max_bytes: int, filename: str = "") -> str:
    """The text of an uploaded corpus, with ``\\n`` newlines and no byte order mark; ``CorpusError`` if it is
    empty, larger than ``max_bytes``, binary or not UTF-8."""
    name = f"{filename!r}" if filename else "The file"
    if len(data) > max_bytes:
        raise CorpusError(
            f"{name} is {size_text(len(data))}, larger than the limit of {size_text(max_bytes)}: upload a smaller one."
        )
    if not data.removeprefix(UTF8_BOM).strip():
        raise CorpusError(f"{name} is empty: upload a text file with the corpus in it.")
    for magic, kind in MAGIC:
        if data.startswith(magic):
            if kind == "UTF-16 text":
                raise CorpusError(f"{name} looks like UTF-16 text: save it as UTF-8 and upload it again.")
            raise CorpusError(f"{name} looks like {kind}: upload plain text (UTF-8).")
    nul = data.find(b"\x00")
    if nul >= 0:
        raise CorpusError(
            f"{name} looks binary (a NUL byte at offset {nul}; UTF-16 text has them too): upload plain text (UTF-8)."
        )
    control = len(data) - len(data.translate(None, CONTROL_BYTES))
    if control > MAX_CONTROL_SHARE * len(data):
        raise CorpusError(
            f"{name} looks binary ({control / len(data):.0%} of its bytes are control characters): "
            "upload plain text (UTF-8)."
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        start = error.start + (len(UTF8_BOM) if data.startswith(UTF8_BOM) else 0)
        line = data.count(b"\n", 0, start) + 1
        raise CorpusError(
            f"{name} is not UTF-8: the byte 0x{data[start]:02X} at offset {start} (line {line}) is not valid UTF-8. "
            "Save the file as UTF-8 and upload it again."
        ) from None
    text = normalize_newlines(text)
    if not text.strip():
        raise CorpusError(f"{name} is empty: upload a text file with the corpus in it.")
    return text


def read_file(path: Path, *, max_bytes: int) -> str:
    """The text of a corpus file on the server, checked like an upload (its size before it is read)."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise CorpusError(f"{path} is {size_text(size)}, larger than the limit of {size_text(max_bytes)}.")
        data = path.read_bytes()
    except OSError as error:
        raise CorpusError(f"Cannot read {path}: {error.strerror or error}.") from None
    return read_upload(data, max_bytes=max_bytes, filename=str(path))


def normalize_newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


# -- built-in corpora ------------------------------------------------------------------------------------------

BUILTIN_CORPORA: dict[str, str] = {
    "python-docstrings": "Docstrings of the Python standard library (read from this server's Python)",
}
BUILTIN_MAX_BYTES = 8_000_000
# Folders of the standard library whose docstrings are not the library's own prose.
SKIPPED_DIRS = frozenset({"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__"})


def builtin_text(name: str, *, max_bytes: int = BUILTIN_MAX_BYTES) -> str:
    """The text of a built-in corpus, at most ``max_bytes`` of it (UTF-8), the same on every call."""
    if name not in BUILTIN_CORPORA:
        known = ", ".join(sorted(BUILTIN_CORPORA))
        raise CorpusError(f"There is no built-in corpus {name!r}: choose one of {known}.", field="corpus")
    return "\n\n".join(bounded(python_docstrings(), max_bytes))


def bounded(paragraphs: Iterator[str], max_bytes: int) -> Iterator[str]:
    """The leading paragraphs whose text, joined by blank lines, fits in ``max_bytes``."""
    total = -2
    for paragraph in paragraphs:
        total += len(paragraph.encode()) + 2
        if total > max_bytes:
            return
        yield paragraph


def python_docstrings() -> Iterator[str]:
    """The docstrings of the standard library's source files in sorted path order, one paragraph each (its blank
    lines removed), each distinct docstring once. The files are parsed with ``ast``, never imported: importing
    some standard modules has side effects (``antigravity`` opens a browser)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    seen: set[str] = set()
    for path in stdlib_sources(root):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # invalid escape sequences in old modules
                tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError, UnicodeDecodeError, RecursionError, OSError):
            continue
        for node in source_order(tree):
            if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            docstring = ast.get_docstring(node, clean=True)  # inspect.cleandoc
            if not docstring:
                continue
            paragraph = "\n".join(line.rstrip() for line in docstring.splitlines() if line.strip())
            if paragraph not in seen:
                seen.add(paragraph)
                yield paragraph


def stdlib_sources(root: Path) -> list[Path]:
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [name for name in dirs if name not in SKIPPED_DIRS]
        found += [Path(folder) / name for name in files if name.endswith(".py")]
    return sorted(found, key=lambda path: path.relative_to(root).as_posix())


def source_order(tree: ast.AST) -> Iterator[ast.AST]:
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


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


def new_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.WordPiece(unk_token=SPECIAL_TOKENS["unk"], continuing_subword_prefix="##"))
    # Cased, accents kept: stripping accents would delete the vowel signs of Indic scripts, for example.
    tokenizer.normalizer = normalizers.Sequence(
        [
            normalizers.NFKC(),
            normalizers.BertNormalizer(
                clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=False
            ),
        ]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()  # splits on whitespace and punctuation
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    return tokenizer


def train_tokenizer(paragraphs: list[str], vocab_size: int) -> Tokenizer:
    tokenizer = new_tokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS.values()),
        limit_alphabet=min(1000, vocab_size // 2),
        continuing_subword_prefix="##",
        show_progress=False,
    )
    tokenizer.train_from_iterator(paragraphs, trainer=trainer, length=len(paragraphs))
    for key, token in SPECIAL_TOKENS.items():
        assert tokenizer.token_to_id(token) == SPECIAL_IDS[key], (token, tokenizer.token_to_id(token))
    cls, sep = SPECIAL_TOKENS["cls"], SPECIAL_TOKENS["sep"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1", special_tokens=[(cls, CLS), (sep, SEP)]
    )
    return tokenizer


def encode(tokenizer: Tokenizer, paragraphs: list[str]) -> list[np.ndarray]:
    ids: list[np.ndarray] = []
    for start in range(0, len(paragraphs), ENCODE_BATCH):
        batch = tokenizer.encode_batch(paragraphs[start : start + ENCODE_BATCH], add_special_tokens=False)
        ids += [np.asarray(encoding.ids, dtype=np.int32) for encoding in batch]
    return ids


def pack(ids: list[np.ndarray], seq_length: int) -> np.ndarray:
    """Consecutive token ids as rows ``[CLS] up to seq_length-2 tokens [SEP]``, across paragraph boundaries; the
    last row is padded after its ``[SEP]``."""
    stream = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int32)
    body = seq_length - 2
    rows = -(-len(stream) // body)
    packed = np.full((rows, seq_length), PAD, dtype=np.int32)
    if rows == 0:
        return packed
    packed[:, 0] = CLS
    full = len(stream) // body
    packed[:full, 1 : body + 1] = stream[: full * body].reshape(full, body)
    packed[:full, body + 1] = SEP
    rest = stream[full * body :]
    if len(rest):
        packed[full, 1 : len(rest) + 1] = rest
        packed[full, len(rest) + 1] = SEP
    return packed


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


def tokenizer_config(seq_length: int) -> dict[str, Any]:
    """What ``transformers.AutoTokenizer`` reads beside tokenizer.json, written here so the server needs no
    transformers."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": seq_length,
        **{f"{key}_token": token for key, token in SPECIAL_TOKENS.items()},
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "token_type_ids", "attention_mask"],
    }


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
