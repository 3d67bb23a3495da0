"""Paths the worker builds from names a server sends, confined to the worker's cache folder.

A server names the corpus's folder (``manifest["text_sha256"]``) and its files (the keys of
``manifest["files"]`` and each shard's ``"name"``). The worker trusts no server with its machine: each name
becomes a path only through :func:`corpus_folder` or :func:`confined`, which refuse an absolute path, a ``..``,
a separator where none belongs, anything but plain file names, and every symlink on the way (the worker never
creates one, so a symlink in the cache is someone else's). :func:`write_file` never writes through a symlink.
A refusal is an :class:`UnsafePath`: one line for the volunteer, exit code 5 (a server error).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from swarmhub.worker.client import ExitCode, WorkerError

# One path component: what the server's own corpora use ("tokenizer.json", "shards/00000.npy"). A leading dot
# is refused: it rules out "." and "..", hidden files, and the worker's own ".NAME.*.part" temporary files.
PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
SHA256_PREFIX = re.compile(r"[0-9a-f]{16,64}")
MAX_NAME_LENGTH = 512
ORGANIZER = "tell the experiment's organizer"


class UnsafePath(WorkerError):
    """A name from the server that would lead outside the cache; the message says what was sent."""

    def __init__(self, message: str):
        super().__init__(message, ExitCode.UNREACHABLE)


def unsafe(what: str, value: object, why: str) -> UnsafePath:
    shown = repr(value) if len(repr(value)) <= 200 else repr(value)[:197] + "..."
    return UnsafePath(
        f"the server sent an unsafe {what} {shown} in its corpus manifest: refusing to write outside the cache "
        f"({why}); {ORGANIZER}"
    )


def file_name_problem(name: object) -> str | None:
    """Why ``name`` is not a safe relative file name (``a.json``, ``shards/00000.npy``), or None when it is."""
    if not isinstance(name, str) or not name:
        return "not a file name"
    if len(name) > MAX_NAME_LENGTH:
        return "too long"
    if name.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", name):
        return "an absolute path"
    parts = re.split(r"[/\\]", name)
    if ".." in parts:
        return "'..' leads out of its folder"
    if "\\" in name:
        return "a backslash is no separator here"
    if not all(PLAIN_NAME.fullmatch(part) for part in parts):
        return "not a plain file name"
    return None


def corpus_folder(cache_dir: Path, manifest: dict[str, object]) -> Path:
    """``cache_dir / <the first 16 hex digits of the corpus's sha256>``, created; refused unless confined."""
    sha = manifest.get("text_sha256", "corpus")
    if sha != "corpus" and not (isinstance(sha, str) and SHA256_PREFIX.fullmatch(sha)):
        raise unsafe("corpus folder name", sha, "'text_sha256' must be a sha256 in hex, one folder name")
    root = Path(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    folder = root / str(sha)[:16]
    _refuse_symlink(folder, str(sha)[:16])
    folder.mkdir(exist_ok=True)
    if not folder.resolve().is_relative_to(root.resolve()):  # a race with someone planting a link
        raise unsafe("corpus folder name", sha, f"{folder} leads outside the cache")
    return folder


def confined(folder: Path, name: object) -> Path:
    """``folder / name`` for a file name from the server, checked: no absolute path, no ``..``, plain names
    only, no symlink at or below ``folder``, and the resolved path inside ``folder``. Touches nothing."""
    problem = file_name_problem(name)
    if problem is not None:
        raise unsafe("file name", name, problem)
    assert isinstance(name, str)
    path = folder
    for part in name.split("/"):
        path = path / part
        _refuse_symlink(path, name)
    if not path.resolve().is_relative_to(folder.resolve()):
        raise unsafe("file name", name, f"{path} resolves outside the cache")
    return path


def write_file(folder: Path, name: str, data: bytes) -> Path:
    """Write ``data`` to ``confined(folder, name)`` whole or not at all, never through a symlink."""
    path = confined(folder, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    confined(folder, name)  # again: nothing may have become a symlink while the folders were made
    # mkstemp opens with O_CREAT | O_EXCL, which never follows a symlink; os.replace swaps the name itself.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)  # a cache file is whole or absent
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _refuse_symlink(path: Path, name: str) -> None:
    if path.is_symlink():
        target = os.readlink(path)
        raise UnsafePath(
            f"the server's corpus manifest names {name!r}, and {path} in the cache is a symlink (to {target}): "
            f"refusing to write through it; delete {path} and join again"
        )
