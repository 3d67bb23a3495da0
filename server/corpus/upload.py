"""Checks a corpus as it arrives: an upload or a file on the server becomes plain text, or a ``CorpusError``
that says what to do instead (the refusal every corpus module raises)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class CorpusError(ValueError):
    """A corpus or its settings that cannot be used; ``message`` says what to do, ``field`` which input is wrong
    ("file", "corpus", "name" or one of ``prepare``'s argument names)."""

    def __init__(self, message: str, *, field: str = "file"):
        super().__init__(message)
        self.message = message
        self.field = field


def size_text(n: int) -> str:
    """``64 MiB``, ``292.97 KiB``, ``512 bytes``: binary units, as the server's limits are set (its ``*_MB``
    settings count MiB), so that a size and a limit are always stated alike."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f}".rstrip("0").rstrip(".") + f" {unit}"
    return f"{n:,} bytes"


def over_limit(size: int, limit: int) -> tuple[str, str]:
    """A size and the limit it passes, as texts that differ (in bytes where the units would round them alike)."""
    have, most = size_text(size), size_text(limit)
    return (f"{size:,} bytes", f"{limit:,} bytes") if have == most else (have, most)


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
        have, most = over_limit(len(data), max_bytes)
        raise CorpusError(f"{name} is {have}, larger than the limit of {most}: upload a smaller one.")
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
            have, most = over_limit(size, max_bytes)
            raise CorpusError(f"{path} is {have}, larger than the limit of {most}.")
        data = path.read_bytes()
    except OSError as error:
        raise CorpusError(f"Cannot read {path}: {error.strerror or error}.") from None
    return read_upload(data, max_bytes=max_bytes, filename=str(path))


def normalize_newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")
