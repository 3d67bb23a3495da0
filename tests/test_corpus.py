"""The corpus library: uploads refused with a message that says what to do, the built-in corpus, and the prepared
folder (tokenizer, shards, held-out split, manifest) read back the way workers and transformers read it."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from starlette.datastructures import UploadFile
from tokenizers import Tokenizer

from swarmhub.server.corpus import text as corpus
from swarmhub.server.corpus.text import CLS, PAD, SEP, CorpusError

SEQ = 64
SMALL_BUILTIN = 300_000


@pytest.fixture(scope="module")
def docstrings() -> str:
    return corpus.builtin_text("python-docstrings", max_bytes=SMALL_BUILTIN)


@pytest.fixture(scope="module")
def prepared(docstrings: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("prepared") / "corpus"
    manifest = corpus.prepare(
        docstrings, folder, vocab_size=2000, seq_length=SEQ, shard_sequences=100, source="builtin:python-docstrings"
    )
    return folder, manifest


def refusal(data: bytes, max_bytes: int = 10_000_000, filename: str = "") -> str:
    with pytest.raises(CorpusError) as caught:
        corpus.read_upload(data, max_bytes=max_bytes, filename=filename)
    assert caught.value.field == "file"
    return caught.value.message


# -- uploads --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("data", [b"", b"  \n\t\r\n  ", b"\xef\xbb\xbf\n\n", "\u00a0\u2003\n".encode()])
def test_empty_uploads_are_refused(data: bytes):
    assert "is empty: upload a text file" in refusal(data)


def test_an_upload_over_the_limit_names_the_limit():
    message = refusal(b"word " * 500_001, max_bytes=2_500_000, filename="big.txt")
    # sizes that round alike in binary units are stated in bytes
    assert message == "'big.txt' is 2,500,005 bytes, larger than the limit of 2,500,000 bytes: upload a smaller one."
    assert refusal(b"x" * 400_000, max_bytes=300_000).startswith(
        "The file is 390.62 KiB, larger than the limit of 292.97 KiB"
    )


def zipped(text: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("corpus.txt", text)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (zipped("some text\n"), "looks like a zip archive (.zip, .docx, .xlsx, .odt, .epub): upload plain text"),
        (gzip.compress(b"some text\n", mtime=0), "looks like a gzip archive: upload plain text"),
        (b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj", "looks like a PDF document: upload plain text"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "looks like a PNG image: upload plain text"),
        ("some text\n".encode("utf-16"), "looks like UTF-16 text: save it as UTF-8"),
    ],
)
def test_known_binary_formats_are_named(data: bytes, kind: str):
    assert kind in refusal(data, filename="corpus.bin")


def test_binary_data_is_refused():
    assert "looks binary (a NUL byte at offset 5; UTF-16 text has them too): upload plain text" in refusal(
        b"hello\x00world"
    )
    assert "NUL byte at offset 1;" in refusal("some text".encode("utf-16-le"))
    message = refusal(bytes(range(1, 9)) * 20 + b"text")
    assert "looks binary (98% of its bytes are control characters)" in message
    # a few stray control characters in real text are not binary
    assert corpus.read_upload(b"Header\x1b[1m bold\x1b[0m " + b"plain words " * 20, max_bytes=1000)


def test_text_that_is_not_utf8_says_where():
    latin1 = "Caf\u00e9 au lait\nna\u00efve\n".encode("latin-1")
    message = refusal(latin1, filename="notes.txt")
    assert message == (
        "'notes.txt' is not UTF-8: the byte 0xE9 at offset 3 (line 1) is not valid UTF-8. "
        "Save the file as UTF-8 and upload it again."
    )
    # the offset counts bytes of the file as uploaded, byte order mark included
    assert "the byte 0xEF at offset 14 (line 2)" in refusal(b"\xef\xbb\xbfline one\n\xc3\xa9\xef")


def test_a_byte_order_mark_is_dropped_and_newlines_normalised():
    data = "\ufeffline one\r\nline two\rcaf\u00e9\n".encode()
    assert corpus.read_upload(data, max_bytes=100) == "line one\nline two\ncaf\u00e9\n"


class CountingFile(io.BytesIO):
    def __init__(self, data: bytes):
        super().__init__(data)
        self.largest_read = 0

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        self.largest_read = max(self.largest_read, len(chunk))
        return chunk


def test_read_bounded_stops_as_soon_as_the_limit_is_passed():
    data = b"a line of text\n" * 100_000  # 1.5 MB
    upload = UploadFile(CountingFile(data), filename="big.txt")
    with pytest.raises(CorpusError, match="larger than the limit of 97.66 KiB"):
        asyncio.run(corpus.read_bounded(upload, 100_000, chunk_size=16_384))
    assert upload.file.tell() == 100_001  # the rest was never read
    assert upload.file.largest_read == 16_384

    small = UploadFile(io.BytesIO(b"short text\n"), filename="small.txt")
    assert asyncio.run(corpus.read_bounded(small, 11)) == b"short text\n"


def test_read_file_checks_like_an_upload(tmp_path: Path):
    (tmp_path / "ok.txt").write_bytes(b"\xef\xbb\xbfsome text\r\n")
    assert corpus.read_file(tmp_path / "ok.txt", max_bytes=100) == "some text\n"
    with pytest.raises(CorpusError, match="larger than the limit of 5 bytes"):
        corpus.read_file(tmp_path / "ok.txt", max_bytes=5)
    with pytest.raises(CorpusError, match="Cannot read .*missing.txt: No such file or directory"):
        corpus.read_file(tmp_path / "missing.txt", max_bytes=100)


# -- the built-in corpus --------------------------------------------------------------------------------------


def test_the_builtin_corpus_is_the_standard_librarys_docstrings(docstrings: str):
    assert corpus.builtin_text("python-docstrings", max_bytes=SMALL_BUILTIN) == docstrings
    assert SMALL_BUILTIN - 20_000 < len(docstrings.encode()) <= SMALL_BUILTIN
    paragraphs = docstrings.split("\n\n")
    assert len(paragraphs) > 1000
    assert len(set(paragraphs)) == len(paragraphs)
    assert all(paragraph.strip() and "\n\n" not in paragraph for paragraph in paragraphs)
    # the first file in sorted order is __future__.py; its module docstring comes first, cleaned
    assert paragraphs[0].startswith("Record of phased-in incompatible language changes.\nEach line is of the form:")
    with pytest.raises(CorpusError) as caught:
        corpus.builtin_text("wikipedia")
    assert (caught.value.field, caught.value.message) == (
        "corpus",
        "There is no built-in corpus 'wikipedia': choose one of python-docstrings.",
    )


PARSE_ALL = """
import json, sys
from swarmhub.server.corpus import text as corpus
text = corpus.builtin_text("python-docstrings")
heavy = sorted({"torch", "transformers", "hivemind", "antigravity", "this", "idlelib", "tkinter"} & set(sys.modules))
print(json.dumps({"text": text, "loaded": heavy}))
"""


def test_the_whole_builtin_corpus_is_read_without_importing_the_library(docstrings: str):
    """Its own process: it parses every source file of the standard library but imports none of them (the web
    server imports this module, and importing ``antigravity`` opens a browser)."""
    done = subprocess.run([sys.executable, "-c", PARSE_ALL], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["loaded"] == []
    whole = result["text"]
    assert whole.startswith(docstrings + "\n\n")
    assert 1_000_000 < len(whole.encode()) <= corpus.BUILTIN_MAX_BYTES
    assert "Return the absolute version of a path." in whole.split("\n\n")  # posixpath.abspath


# -- the prepared folder ---------------------------------------------------------------------------------------


def rows_of(ids: np.ndarray, seq_length: int) -> list[tuple[int, ...]]:
    """The rows that packing a token stream must give, computed here independently of the library."""
    body = seq_length - 2
    rows = []
    for start in range(0, len(ids), body):
        piece = [CLS, *ids[start : start + body].tolist(), SEP]
        rows.append(tuple(piece + [PAD] * (seq_length - len(piece))))
    return rows


def held_out_paragraphs(tokenizer: Tokenizer, paragraphs: list[str], evaluation: np.ndarray) -> list[int]:
    """Which paragraphs eval.npy holds: its token stream is theirs, in order."""
    stream = np.concatenate([row[1 : np.flatnonzero(row == SEP)[0]] for row in evaluation])
    found, at = [], 0
    encoded = tokenizer.encode_batch(paragraphs, add_special_tokens=False)
    for index, encoding in enumerate(encoded):
        if at < len(stream) and stream[at : at + len(encoding.ids)].tolist() == encoding.ids:
            found.append(index)
            at += len(encoding.ids)
    assert at == len(stream), "eval.npy holds tokens that are no paragraph's"
    return found


def test_sequences_are_cls_tokens_sep_and_pad_only_at_the_end(prepared: tuple[Path, dict]):
    folder, manifest = prepared
    arrays = [np.load(folder / shard["name"], allow_pickle=False) for shard in manifest["shards"]]
    evaluation = np.load(folder / "eval.npy", allow_pickle=False)
    for array in [*arrays, evaluation]:
        assert array.dtype == np.int32 and array.ndim == 2 and array.shape[1] == SEQ
        assert (array[:, 0] == CLS).all()
        assert (array >= 0).all() and (array < manifest["vocab_size"]).all()
        assert ((array == SEP).sum(axis=1) == 1).all() and ((array == CLS).sum(axis=1) == 1).all()
        sep_at = np.argmax(array == SEP, axis=1)
        columns = np.arange(SEQ)
        assert ((array == PAD) == (columns > sep_at[:, None])).all()  # pad exactly after the [SEP]
    padded = np.concatenate(arrays)[:, -1] == PAD
    assert padded.sum() <= 1  # only the last row of the training text, wherever the shuffle put it
    assert (evaluation[:-1, -1] != PAD).all()
    assert [len(array) for array in arrays] == [100] * (len(arrays) - 1) + [manifest["train_sequences"] % 100 or 100]
    assert len(evaluation) == manifest["eval_sequences"] >= 1


def test_training_covers_every_paragraph_not_held_out_exactly_once(docstrings: str, prepared: tuple[Path, dict]):
    folder, manifest = prepared
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    paragraphs = docstrings.split("\n\n")
    evaluation = np.load(folder / "eval.npy", allow_pickle=False)
    held = held_out_paragraphs(tokenizer, paragraphs, evaluation)
    # about 2%, spread over the corpus
    assert round(0.02 * len(paragraphs)) == len(held)
    assert held[0] < len(paragraphs) // 10 and held[-1] > len(paragraphs) * 9 // 10

    train_text = [paragraph for index, paragraph in enumerate(paragraphs) if index not in held]
    stream = np.array([i for e in tokenizer.encode_batch(train_text, add_special_tokens=False) for i in e.ids])
    shards = np.concatenate([np.load(folder / shard["name"], allow_pickle=False) for shard in manifest["shards"]])
    assert sorted(map(tuple, shards.tolist())) == sorted(rows_of(stream, SEQ))
    assert len(shards) == manifest["train_sequences"] == sum(shard["sequences"] for shard in manifest["shards"])
    # shuffled: consecutive text does not sit in consecutive rows
    first_rows = rows_of(stream, SEQ)[:5]
    assert [tuple(row) for row in shards[:5].tolist()] != first_rows


def test_a_held_out_paragraph_is_never_trained_on_even_when_repeated(tmp_path: Path):
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()
    paragraphs = [" ".join(words[i:] + words[:i]) + f" number {i}." for i in range(6)]
    paragraphs[4] = paragraphs[1]  # indices 1, 3 and 5 are held out at eval_fraction 0.5
    folder = tmp_path / "corpus"
    manifest = corpus.prepare("\n\n".join(paragraphs), folder, vocab_size=100, seq_length=16, eval_fraction=0.5)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = [np.array(e.ids) for e in tokenizer.encode_batch(paragraphs, add_special_tokens=False)]
    shards = np.load(folder / "shards/00000.npy", allow_pickle=False)
    assert sorted(map(tuple, shards.tolist())) == sorted(rows_of(np.concatenate([ids[0], ids[2]]), 16))
    evaluation = np.load(folder / "eval.npy", allow_pickle=False)
    assert evaluation.tolist() == [list(row) for row in rows_of(np.concatenate([ids[1], ids[3], ids[5]]), 16)]
    assert manifest["eval_sequences"] == len(evaluation)


def test_the_manifest_lists_every_file_with_its_digest(docstrings: str, prepared: tuple[Path, dict]):
    folder, manifest = prepared
    assert corpus.load_manifest(folder) == manifest
    assert set(manifest) == {
        "format", "source", "bytes", "text_sha256", "vocab_size", "seq_length", "special_tokens", "files",
        "shards", "train_sequences", "eval_sequences", "created_at",
    }  # fmt: skip
    assert manifest["format"] == 1 and manifest["source"] == "builtin:python-docstrings"
    assert manifest["bytes"] == len(docstrings.encode())
    assert manifest["text_sha256"] == hashlib.sha256(docstrings.encode()).hexdigest()
    assert manifest["special_tokens"] == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
    assert manifest["vocab_size"] == 2000 == Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab_size()
    assert manifest["seq_length"] == SEQ
    listed = {**manifest["files"], **{shard["name"]: shard for shard in manifest["shards"]}}
    on_disk = {path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file()}
    assert on_disk == set(listed) | {"manifest.json"}
    for name, facts in listed.items():
        data = (folder / name).read_bytes()
        assert (facts["sha256"], facts["bytes"]) == (hashlib.sha256(data).hexdigest(), len(data)), name
    assert [shard["name"] for shard in manifest["shards"]][:2] == ["shards/00000.npy", "shards/00001.npy"]


def test_transformers_loads_the_tokenizer(prepared: tuple[Path, dict]):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    folder, _ = prepared
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    assert tokenizer.model_max_length == SEQ
    named = {
        kind: (getattr(tokenizer, f"{kind}_token"), getattr(tokenizer, f"{kind}_token_id"))
        for kind in ("pad", "unk", "cls", "sep", "mask")
    }
    assert named == {
        "pad": ("[PAD]", 0),
        "unk": ("[UNK]", 1),
        "cls": ("[CLS]", 2),
        "sep": ("[SEP]", 3),
        "mask": ("[MASK]", 4),
    }
    sentence = "Return the number of items in the list, or None if the size is unknown."
    ids = tokenizer(sentence)["input_ids"]
    assert ids[0] == 2 and ids[-1] == 3 and 1 not in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == sentence
    masked = tokenizer("Return the [MASK] of items.")["input_ids"]
    assert tokenizer.convert_ids_to_tokens(masked) == ["[CLS]", "Return", "the", "[MASK]", "of", "items", ".", "[SEP]"]


# -- refusals and atomicity -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"vocab_size": 50}, "vocab_size must be a whole number from 100 to 128000, not 50."),
        ({"seq_length": 8}, "seq_length must be a whole number from 16 to 4096, not 8."),
        ({"shard_sequences": 0}, "shard_sequences must be a whole number from 1 to 1000000, not 0."),
        ({"eval_fraction": 0.0}, "eval_fraction must be above 0 and at most 0.5, not 0.0."),
        ({"max_eval_sequences": 1.5}, "max_eval_sequences must be a whole number from 1 to 1000000, not 1.5."),
    ],
)
def test_bad_settings_are_refused_by_name(tmp_path: Path, setting: dict, message: str):
    with pytest.raises(CorpusError) as caught:
        corpus.prepare("some text\n\nmore text", tmp_path / "corpus", **setting)
    assert (caught.value.field, caught.value.message) == (next(iter(setting)), message)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_prepare_leaves_the_existing_corpus_as_it_was(prepared: tuple[Path, dict], tmp_path: Path):
    small = "\n\n".join(f"Paragraph {i} says a few words about the weather." for i in range(60))
    folder = tmp_path / "corpus"
    first = corpus.prepare(small, folder, vocab_size=100, seq_length=16)
    before = {path: path.read_bytes() for path in folder.rglob("*") if path.is_file()}

    tiny = "\n\n".join(f"Line {i}." for i in range(30))
    with pytest.raises(CorpusError) as caught:
        corpus.prepare(tiny, folder, vocab_size=100, seq_length=128)
    said = re.fullmatch(
        r"The corpus is too small: its training part makes (\d+) tokens, and one sequence of 128 tokens needs 126\. "
        r"Add about (\d+) bytes more text, in paragraphs separated by blank lines\.",
        caught.value.message,
    )
    assert said and 29 * 3 <= int(said[1]) < 126 and int(said[2]) > 0, caught.value.message
    with pytest.raises(CorpusError, match="The corpus is one paragraph: it needs at least two"):
        corpus.prepare("just one line of text", folder)
    assert {path: path.read_bytes() for path in folder.rglob("*") if path.is_file()} == before
    assert list(tmp_path.iterdir()) == [folder]  # no temporary folder left behind
    assert corpus.load_manifest(folder) == first

    second = corpus.prepare(small, folder, vocab_size=100, seq_length=32)
    assert corpus.load_manifest(folder) == second and second["seq_length"] == 32
    assert list(tmp_path.iterdir()) == [folder]
    assert oct(folder.stat().st_mode & 0o777) == oct(0o755)


def test_file_path_serves_only_the_manifests_names(prepared: tuple[Path, dict], tmp_path: Path):
    folder, manifest = prepared
    assert corpus.file_path(folder, "eval.npy") == folder / "eval.npy"
    assert corpus.file_path(folder, "shards/00001.npy", manifest) == folder / "shards/00001.npy"
    for name in (
        "../x",
        "../corpus/eval.npy",
        "shards/../eval.npy",
        "/etc/passwd",
        "manifest.json",
        "shards/99999.npy",
        "",
    ):
        with pytest.raises(CorpusError) as caught:
            corpus.file_path(folder, name)
        assert (caught.value.field, caught.value.message) == ("name", f"The corpus has no file {name!r}.")
    with pytest.raises(CorpusError) as caught:
        corpus.load_manifest(tmp_path)
    assert (caught.value.field, caught.value.message) == ("corpus", "This experiment has no prepared corpus.")
