"""An uploaded archive of images, read member by member from the file it was spooled to, never whole.

``open_archive`` tells a zip from a tar (plain, gzip, bzip2 or xz) by its leading bytes, not by its name.
``Archive.scan`` reads only the members' headers (a tar's data is streamed past, counted, not kept) and refuses
what could lead outside a folder or take unbounded time, memory or disk before anything is decoded:

- a member whose path is absolute, has a ``..`` part, a backslash or a control character; a symlink, hard link,
  device, FIFO or sparse file; an encrypted zip member; a name that appears twice;
- more than ``MAX_MEMBERS`` members; a member over ``MAX_MEMBER_BYTES``, or all of them over
  ``MAX_TOTAL_BYTES`` uncompressed (the sizes a zip declares, and the bytes a tar's stream really gives);
- a compression ratio over ``MAX_RATIO`` once more than ``RATIO_FLOOR`` bytes come out (zip: each member's
  declared sizes; tar: the compressed bytes read against the bytes they give): a zip bomb;
- a zip whose central directory is over ``MAX_DIRECTORY_BYTES`` or lists over ``MAX_MEMBERS`` entries, checked in
  its end record before Python's ``zipfile`` reads the directory into memory.

``Archive.read`` then yields the chosen members' bytes one at a time, counting the bytes it really reads against
the same limits (a zip's declared sizes may lie). Every refusal is a ``CorpusError`` (field "file") that names
the member and says what to do.
"""

from __future__ import annotations

import re
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Literal

from swarmhub.server.corpus.upload import CorpusError, size_text

MAX_MEMBERS = 100_000  # files and folders in one archive
MAX_MEMBER_BYTES = 64 * 2**20  # one member, uncompressed
MAX_TOTAL_BYTES = 4 * 2**30  # all members, uncompressed
MAX_RATIO = 100  # uncompressed / compressed: images are compressed already; a bomb is thousands
RATIO_FLOOR = 2**20  # a ratio counts only past this many bytes (a small blank BMP compresses well)
# zipfile holds its whole central directory in memory (about 270 bytes an entry): this bounds it to about 100 MB
# whatever entry count the archive claims.
MAX_DIRECTORY_BYTES = 16 * 2**20
CHUNK = 1 << 20

# (leading bytes, offset, what it is, tarfile's streaming mode)
TAR_MAGIC = (
    (b"\x1f\x8b", 0, "gzip", "r|gz"),
    (b"BZh", 0, "bzip2", "r|bz2"),
    (b"\xfd7zXZ\x00", 0, "xz", "r|xz"),
    (b"ustar", 257, "tar", "r|"),
)
ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")  # a zip with members, an empty zip
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
FIX = "make the archive again from a folder of image files (zip -r, or tar czf)"


@dataclass(frozen=True)
class Member:
    """A regular file in the archive: its path as the archive names it (no leading ``./``) and its size."""

    name: str
    size: int


def shown(name: str) -> str:
    """A member's name as a message quotes it: control characters escaped, at most 200 characters."""
    text = repr(name)
    return text if len(text) <= 200 else text[:197] + "..."


def path_problem(name: str) -> str | None:
    """Why an archive path cannot be extracted safely, or None."""
    if not name:
        return "an empty path"
    if name.startswith("/") or re.match(r"[A-Za-z]:", name):
        return "an absolute path"
    if "\\" in name:
        return "a backslash in its path"
    if ".." in name.split("/"):
        return "a '..' in its path, which leads out of the archive's folder"
    if CONTROL.search(name):
        return "a control character in its path"
    return None


def clean_name(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name


class _Counted:
    """A file read through, counting the bytes taken from it (a tar's compressed bytes)."""

    def __init__(self, file: IO[bytes]):
        self.file = file
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        data = self.file.read(size)
        self.count += len(data)
        return data


class Archive:
    """A zip or tar archive in ``file`` (seekable: Starlette's spooled upload, or an open file)."""

    def __init__(self, file: IO[bytes], kind: Literal["zip", "tar"], mode: str, compression: str):
        self.file = file
        self.kind = kind
        self.mode = mode
        self.compression = compression

    # -- the headers ------------------------------------------------------------------------------------------

    def scan(self) -> list[Member]:
        """The archive's regular files, in the archive's order, after every check above; folders are left out."""
        return self._scan_zip() if self.kind == "zip" else self._scan_tar()

    def _scan_zip(self) -> list[Member]:
        entries, directory = _zip_directory(self.file)
        _check_count(entries)
        if directory > MAX_DIRECTORY_BYTES:
            raise CorpusError(
                f"The zip archive's list of files takes {size_text(directory)}, over the "
                f"{size_text(MAX_DIRECTORY_BYTES)} the server reads: give fewer files, or shorter names."
            )
        with self._zip() as archive:
            infos = archive.infolist()
            _check_count(len(infos))
            found, total = [], 0
            for info in infos:
                name = clean_name(info.filename)
                if info.is_dir():
                    _check_path(name.rstrip("/"))
                    continue
                _check_path(name)
                mode = info.external_attr >> 16  # Unix mode bits, where a Unix zip wrote them (0 otherwise)
                if stat.S_IFMT(mode) not in (0, stat.S_IFREG):
                    raise _not_a_file(name, "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file")
                if info.flag_bits & 0x1:
                    raise CorpusError(f"The archive's member {shown(name)} is encrypted: {FIX}, without a password.")
                _check_size(name, info.file_size)
                if info.file_size > RATIO_FLOOR and info.file_size > MAX_RATIO * max(info.compress_size, 1):
                    raise _bomb(name, info.file_size, info.compress_size)
                total += info.file_size
                _check_total(total)
                found.append(Member(name, info.file_size))
        return _unique(found)

    def _scan_tar(self) -> list[Member]:
        found, total, count, name = [], 0, 0, ""
        for member, _, counted in self._tar_members():
            # The stream has now given every member before this one: the ratio so far, before this one's data.
            _check_stream_ratio(name, total, counted.count)
            count += 1
            _check_count(count)
            name = clean_name(member.name)
            _check_path(name.rstrip("/") if member.isdir() else name)
            if member.isdir():
                continue
            if member.issym() or member.islnk():
                kind = "a symbolic link" if member.issym() else "a hard link"
                raise _not_a_file(name, f"{kind} (to {shown(member.linkname)})")
            if not member.isreg() or member.issparse():
                raise _not_a_file(name, "not a regular file (a device, FIFO or sparse file)")
            _check_size(name, member.size)
            total += member.size
            _check_total(total)
            found.append(Member(name, member.size))
        _check_stream_ratio(name, total, counted.count)
        return _unique(found)

    # -- the data ---------------------------------------------------------------------------------------------

    def read(self, wanted: set[str]) -> Iterator[tuple[str, bytes]]:
        """(name, bytes) of each member in ``wanted``, in the archive's order, one held at a time."""
        return self._read_zip(wanted) if self.kind == "zip" else self._read_tar(wanted)

    def _read_zip(self, wanted: set[str]) -> Iterator[tuple[str, bytes]]:
        total = 0
        with self._zip() as archive:
            for info in archive.infolist():
                name = clean_name(info.filename)
                if name in wanted and not info.is_dir():
                    with archive.open(info) as stream:
                        data = _read_member(name, stream)
                    total = _check_total(total + len(data))
                    yield name, data

    def _read_tar(self, wanted: set[str]) -> Iterator[tuple[str, bytes]]:
        total = 0
        for member, archive, counted in self._tar_members():
            name = clean_name(member.name)
            if name in wanted and member.isreg():
                stream = archive.extractfile(member)
                if stream is None:
                    raise _not_a_file(name, "not a regular file")
                data = _read_member(name, stream)
                total = _check_total(total + len(data))
                _check_stream_ratio(name, total, counted.count)
                yield name, data

    def _zip(self) -> zipfile.ZipFile:
        self.file.seek(0)
        try:
            return zipfile.ZipFile(self.file)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as error:
            raise CorpusError(f"The zip archive cannot be read ({error}): {FIX}.") from None

    def _tar_members(self) -> Iterator[tuple[tarfile.TarInfo, tarfile.TarFile, _Counted]]:
        self.file.seek(0)
        counted = _Counted(self.file)
        try:
            # mode: one of TAR_MAGIC's streaming modes (typeshed lists each as a literal)
            with tarfile.open(fileobj=counted, mode=self.mode) as archive:  # type: ignore[call-overload]
                for member in archive:
                    yield member, archive, counted
        except (tarfile.TarError, OSError, EOFError, zlib.error) as error:
            what = "tar archive" if self.compression == "tar" else f"{self.compression}-compressed tar archive"
            raise CorpusError(f"The {what} cannot be read ({error or 'cut short'}): {FIX}.") from None


def open_archive(file: IO[bytes]) -> Archive:
    """The archive in ``file``, by its leading bytes; ``CorpusError`` for anything else."""
    file.seek(0)
    head = file.read(512)
    file.seek(0)
    if head.startswith(ZIP_MAGIC):
        return Archive(file, "zip", "r", "zip")
    for magic, offset, compression, mode in TAR_MAGIC:
        if head[offset : offset + len(magic)] == magic:
            return Archive(file, "tar", mode, compression)
    if not head:
        raise CorpusError("The file is empty: upload an archive of images (.zip, .tar or .tar.gz).")
    if head.startswith((b"\x89PNG", b"\xff\xd8\xff", b"GIF8")) or (head[:4], head[8:12]) == (b"RIFF", b"WEBP"):
        raise CorpusError("The file is one image: upload an archive of images (.zip, .tar or .tar.gz).")
    raise CorpusError(
        "The file is not a zip or tar archive (its first bytes say neither): upload the images in a .zip, .tar or "
        ".tar.gz archive."
    )


def _zip_directory(file: IO[bytes]) -> tuple[int, int]:
    """(entries, bytes) of a zip's central directory as its end record states them (zip64's where it has one)."""
    file.seek(0, 2)
    size = file.tell()
    file.seek(max(0, size - 22 - 65535))  # the end record (22 bytes) and at most a 64 KiB comment after it
    tail = file.read()
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < 22:
        raise CorpusError(f"The zip archive has no end record (it was cut short?): {FIX}.")
    entries = int.from_bytes(tail[at + 10 : at + 12], "little")
    directory = int.from_bytes(tail[at + 12 : at + 16], "little")
    locator = tail[at - 20 : at] if at >= 20 else b""
    if locator.startswith(b"PK\x06\x07"):  # zip64: the real counts are in the record the locator points to
        file.seek(int.from_bytes(locator[8:16], "little"))
        record = file.read(56)
        if record.startswith(b"PK\x06\x06") and len(record) == 56:
            entries = int.from_bytes(record[32:40], "little")
            directory = int.from_bytes(record[40:48], "little")
    file.seek(0)
    return entries, directory


def _read_member(name: str, stream: IO[bytes]) -> bytes:
    parts, size = [], 0
    try:
        while block := stream.read(CHUNK):
            size += len(block)
            _check_size(name, size)  # counted as read: a declared size may lie
            parts.append(block)
    except (zipfile.BadZipFile, tarfile.TarError, OSError, EOFError, zlib.error) as error:
        raise CorpusError(f"The archive's member {shown(name)} cannot be read ({error}): {FIX}.") from None
    return b"".join(parts)


def _check_count(count: int) -> None:
    if count > MAX_MEMBERS:
        raise CorpusError(
            f"The archive has more than {MAX_MEMBERS:,} files and folders: split it, or give fewer images."
        )


def _check_path(name: str) -> None:
    problem = path_problem(name)
    if problem is not None:
        raise CorpusError(f"The archive's member {shown(name)} has {problem}: {FIX}, with relative paths inside it.")


def _check_size(name: str, size: int) -> None:
    if size > MAX_MEMBER_BYTES:
        raise CorpusError(
            f"The archive's member {shown(name)} is over {size_text(MAX_MEMBER_BYTES)} uncompressed, the most one "
            "image may be: leave it out, or make it smaller."
        )


def _check_total(total: int) -> int:
    if total > MAX_TOTAL_BYTES:
        raise CorpusError(
            f"The archive holds over {size_text(MAX_TOTAL_BYTES)} uncompressed, the most the server takes: give "
            "fewer or smaller images."
        )
    return total


def _check_stream_ratio(name: str, produced: int, consumed: int) -> None:
    if produced > RATIO_FLOOR and produced > MAX_RATIO * max(consumed, 1):
        raise _bomb(name, produced, consumed)


def _bomb(name: str, size: int, compressed: int) -> CorpusError:
    return CorpusError(
        f"The archive expands {size_text(compressed)} into {size_text(size)} (by {shown(name)}), over {MAX_RATIO} "
        f"times: images do not compress that much. {FIX[0].upper()}{FIX[1:]}."
    )


def _not_a_file(name: str, what: str) -> CorpusError:
    return CorpusError(f"The archive's member {shown(name)} is {what}: {FIX}, with plain files only.")


def _unique(members: list[Member]) -> list[Member]:
    seen: set[str] = set()
    for member in members:
        if member.name in seen:
            raise CorpusError(f"The archive has {shown(member.name)} twice: {FIX}, with each path once.")
        seen.add(member.name)
    return members
