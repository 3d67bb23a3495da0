"""The built-in corpora: text the server reads from its own Python installation, the same on every call."""

from __future__ import annotations

import ast
import os
import sysconfig
import warnings
from collections.abc import Iterator
from pathlib import Path

from swarmhub.server.corpus.upload import CorpusError

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
