"""The import rules of swarmhub's packages, read from the source (docs/development.md, "How the code is laid out"):
no import cycle between modules; the shared contract (``swarmhub.common``) imports nothing else of swarmhub; the
worker never imports the server; only the server's peer processes import the worker's training and swarm code;
routes reach no swarm internals and not the metric store; domain packages never import the HTTP layer; no module
imports another module's private (``_name``) names; and the two sides keep their modules in packages. Imports
under ``if TYPE_CHECKING:`` never run and are left out; imports inside functions count, because they run."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Source folder -> the import package it installs as (pyproject.toml's package-dir).
FOLDERS = {
    "swarmhub": "swarmhub",
    "server": "swarmhub.server",
    "worker": "swarmhub.worker",
    "web": "swarmhub.web",
    "migrations": "swarmhub.migrations",
}


def modules() -> dict[str, Path]:
    found = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "node_modules" in path.parts:
                continue
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def _runs(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in (child, *_runs(child)))
            continue
        yield node
        yield from _runs(node)


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, str | None]]:
    """(module imported, name taken from it or None) for each swarmhub import in ``name``'s source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in _runs(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((alias.name, None) for alias in node.names if alias.name.startswith("swarmhub"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            if not source.startswith("swarmhub"):
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                yield (submodule, None) if submodule in known else (source, alias.name)


def graph() -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """Module -> the modules it imports; and every (importer, module, private name) import."""
    known = modules()
    edges: dict[str, set[str]] = {name: set() for name in known}
    private = []
    for name, path in known.items():
        for target, taken in imports(name, path, known):
            while target not in known and "." in target:
                target = target.rpartition(".")[0]  # an attribute of a module, or a name a package re-exports
            if target != name and target in known:
                edges[name].add(target)
            if taken and taken.startswith("_") and not taken.startswith("__"):
                private.append((name, target, taken))
    return edges, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_scan_sees_the_imports_it_checks():
    """The rules below hold of what the scan reads: it must read the imports that are there."""
    edges, _ = graph()
    assert "swarmhub.worker.join.prepare" in edges["swarmhub.worker.cli.main"]  # an absolute import of a module
    assert "swarmhub.worker.errors" in edges["swarmhub.server.commands"]  # absolute
    assert "swarmhub.server.cli" in edges["swarmhub.server.commands"]  # inside a function
    assert "swarmhub.server.metrics.ingestion" not in edges["swarmhub.server.services"]  # under TYPE_CHECKING only
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle():
    edges, _ = graph()
    assert cycles(edges) == []


def test_the_worker_never_imports_the_server():
    """A volunteer's install needs no server code; the server's commands register through the entry-point group
    ``swarmhub.commands`` instead."""
    edges, _ = graph()
    reaching = sorted(
        (module, target)
        for module, targets in edges.items()
        if module.startswith("swarmhub.worker")
        for target in targets
        if target.startswith("swarmhub.server")
    )
    assert reaching == []


def test_no_module_imports_another_module_s_private_names():
    _, private = graph()
    assert private == []


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _imports_where(importer, target) -> list[tuple[str, str]]:
    edges, _ = graph()
    return sorted((m, t) for m, targets in edges.items() if importer(m) for t in targets if target(t))


def test_the_common_contract_imports_nothing_else_of_swarmhub():
    """Both sides import ``swarmhub.common``; it must stay light (no torch, FastAPI or SQLAlchemy through swarmhub)."""
    assert (
        _imports_where(
            lambda m: _within(m, "swarmhub.common"),
            lambda t: not _within(t, "swarmhub.common") and t != "swarmhub",
        )
        == []
    )


def test_only_the_server_s_peer_processes_import_the_worker_s_training_and_swarm_code():
    """The web process imports no hivemind or torch through the worker: only ``swarmhub.server.swarm`` (the peers'
    processes and what starts them) reaches the worker's training and swarm packages."""
    assert (
        _imports_where(
            lambda m: _within(m, "swarmhub.server") and not _within(m, "swarmhub.server.swarm"),
            lambda t: _within(t, "swarmhub.worker.training") or _within(t, "swarmhub.worker.swarm"),
        )
        == []
    )


def test_routes_reach_no_swarm_internals_and_not_the_metric_store():
    assert (
        _imports_where(
            lambda m: _within(m, "swarmhub.server.routes"),
            lambda t: _within(t, "swarmhub.server.swarm") or t == "swarmhub.server.metrics.store",
        )
        == []
    )


DOMAINS = ("core", "accounts", "experiments", "corpus", "metrics", "live", "ledger", "community", "teams", "swarm")


def test_domain_packages_never_import_the_http_layer():
    http = ("swarmhub.server.routes", "swarmhub.server.http", "swarmhub.server.app", "swarmhub.server.cli")
    assert (
        _imports_where(
            lambda m: any(_within(m, f"swarmhub.server.{d}") for d in (*DOMAINS, "models")),
            lambda t: any(_within(t, h) for h in http),
        )
        == []
    )


@pytest.mark.parametrize("folder", ["server", "worker"])
def test_each_side_keeps_its_modules_in_packages(folder: str):
    """Beside its packages, each side keeps only its entry points and the few modules everything shares."""
    flat = sorted(p.name for p in (ROOT / folder).glob("*.py"))
    assert len(flat) <= 8, flat
    for package in sorted(p for p in (ROOT / folder).iterdir() if (p / "__init__.py").is_file()):
        assert ast.get_docstring(ast.parse((package / "__init__.py").read_text())), f"{package} says what it owns"
