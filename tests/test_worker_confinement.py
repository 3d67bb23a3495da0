"""The worker trusts no server with the volunteer's machine.

- A hostile server (a small ASGI app on 127.0.0.1) answers what the real `swarmhub join` asks before it
  downloads the corpus, then sends a manifest with names that lead out of the cache: `join` exits with one line
  that names what the server sent, and nothing is written outside the cache.
- Plain http to another machine is refused before any connection unless `--insecure` is given.
- Nothing in worker/ or server/ unpickles: every `torch.load` passes `weights_only=True`, no pickle-family import.
"""

from __future__ import annotations

import ast
import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from swarmhub.common.protocol import SWARM_PROTOCOL
from swarmhub.worker.client import ApiClient, ExitCode, WorkerError
from swarmhub.worker.tasks.data import RemoteCorpus
from swarmhub.worker.tasks.safe_paths import UnsafePath, confined, file_name_problem, write_file
from swarmhub.worker.transport import on_this_machine, require_encryption

from .conftest import LiveServer

SWARMHUB = [sys.executable, "-m", "swarmhub.worker.cli.main"]
SLUG = "hostile-run"
TEXT_SHA = hashlib.sha256(b"the corpus").hexdigest()
PAYLOAD = b"written by the server"  # every file it serves: it matches the manifest, so only confinement stops it
PAYLOAD_SHA = hashlib.sha256(PAYLOAD).hexdigest()
REPO = Path(__file__).resolve().parents[1]


def manifest(shards: list[str], text_sha256: str = TEXT_SHA) -> dict[str, Any]:
    return {
        "format": 1,
        "text_sha256": text_sha256,
        "files": {"tokenizer.json": {"sha256": PAYLOAD_SHA, "bytes": len(PAYLOAD)}},
        "shards": [{"name": name, "sha256": PAYLOAD_SHA, "bytes": len(PAYLOAD), "sequences": 1} for name in shards],
    }


class Hostile:
    """A server that answers `join` faithfully, then serves whatever manifest the test sets."""

    def __init__(self) -> None:
        self.manifest: dict[str, Any] = manifest(["shards/00000.npy"])
        self.data_path: str | None = None  # None: the experiment's own data path
        self.downloads: list[str] = []
        self.shard_turn: Any = {"index": 0}
        self.app = Starlette(
            routes=[
                Route("/api/me", self.me),
                Route("/api/experiments/{slug}", self.experiment),
                Route("/api/experiments/{slug}/join", self.join, methods=["POST"]),
                Route("/api/experiments/{slug}/data/manifest", self.data_manifest),
                Route("/api/experiments/{slug}/data/files/{name:path}", self.data_file),
                Route("/api/experiments/{slug}/data/next-shard", self.next_shard, methods=["POST"]),
                Route("/elsewhere/{rest:path}", self.elsewhere, methods=["GET", "POST"]),
            ]
        )

    async def me(self, request: Request) -> Response:
        return JSONResponse({"username": "volunteer", "is_admin": False})

    async def experiment(self, request: Request) -> Response:
        fields = {"title": "Hostile", "description": "", "status": "running", "owner": "host", "task": "albert-mlm"}
        return JSONResponse({"slug": request.path_params["slug"], "created_at": "2026-12-02T00:00:00Z", **fields})

    async def join(self, request: Request) -> Response:
        slug = request.path_params["slug"]
        token = {"username": "volunteer", "public_key": "k", "expiration_time": "2099-01-01", "signature": "s"}
        return JSONResponse(
            {
                "experiment": {"slug": slug, "title": "Hostile", "task": "albert-mlm", "task_params": {"size": "tiny"}},
                "run_id": slug,
                "initial_peers": [],
                "worker_id": "w1",
                "username": "volunteer",
                "report_path": f"/api/experiments/{slug}/report",
                "swarm_token": token,
                "token_path": f"/api/experiments/{slug}/swarm-token",
                "experiment_public_key": "k",
                "server_time": time.time(),
                "data_path": self.data_path or f"/api/experiments/{slug}/data",
                "swarm_protocol": SWARM_PROTOCOL,  # it passes as a hub of this version, to reach the corpus
            }
        )

    async def data_manifest(self, request: Request) -> Response:
        return JSONResponse(self.manifest)

    async def data_file(self, request: Request) -> Response:
        self.downloads.append(request.path_params["name"])
        return Response(PAYLOAD)

    async def next_shard(self, request: Request) -> Response:
        return JSONResponse(self.shard_turn)

    async def elsewhere(self, request: Request) -> Response:
        self.downloads.append(str(request.url))
        return JSONResponse(self.manifest)


@pytest.fixture(scope="module")
def hostile() -> Iterator[tuple[Hostile, LiveServer]]:
    server = Hostile()
    with LiveServer(server.app) as live:
        yield server, live


def volunteer(tmp: Path, server: str | None) -> dict[str, str]:
    """A volunteer's environment: folders under ``tmp``; logged in to ``server`` through SWARMHUB_TOKEN."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("SWARMHUB_")}
    env.update({f"SWARMHUB_{name.upper()}_DIR": str(tmp / name) for name in ("config", "state", "cache")})
    return env if server is None else {**env, "SWARMHUB_SERVER": server, "SWARMHUB_TOKEN": "shb_volunteer"}


def corpus_folder(tmp: Path, live: LiveServer) -> Path:
    return tmp / "cache" / "corpora" / f"127.0.0.1_{live.port}" / SLUG / TEXT_SHA[:16]


def join(tmp: Path, url: str) -> subprocess.CompletedProcess[str]:
    command = [*SWARMHUB, "join", SLUG, "--device", "cpu", "--client-mode"]
    return subprocess.run(command, env=volunteer(tmp, url), capture_output=True, text=True, timeout=25)


def refused_in_one_line(done: subprocess.CompletedProcess[str], sent: str) -> str:
    assert done.returncode == ExitCode.UNREACHABLE, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("Error: ") and repr(sent) in line, line
    return line


# -- a hostile server's manifest ------------------------------------------------------------------------------


@pytest.mark.parametrize("turn", [{"index": "../x"}, {"index": -1}, {"index": 2**40}, {}, ["0"]])
def test_a_malformed_shard_turn_is_refused_in_one_line(hostile, turn):
    """The next shard's index comes from the server: anything but a small whole number is refused, never used."""
    server, live = hostile
    server.shard_turn = turn
    client = ApiClient(live.url, "shb_volunteer")
    try:
        with pytest.raises(WorkerError) as refused:
            client.next_shard(SLUG, f"/api/experiments/{SLUG}/data")
        assert refused.value.exit_code == ExitCode.UNREACHABLE and "Unexpected answer" in str(refused.value)
        server.shard_turn = {"index": 3}
        assert client.next_shard(SLUG, f"/api/experiments/{SLUG}/data") == 3
    finally:
        server.shard_turn = {"index": 0}
        client.close()


@pytest.mark.parametrize(
    "hostile_name",
    ["../../x", "ABSOLUTE/x", "sub/../../../x", "shards\\..\\..\\x"],
    ids=["dot-dot", "absolute", "dot-dot-inside", "backslash"],
)
def test_join_refuses_a_file_name_that_leaves_the_cache(hostile, tmp_path, hostile_name):
    server, live = hostile
    name = hostile_name.replace("ABSOLUTE", str(tmp_path / "elsewhere"))
    server.manifest, server.data_path, server.downloads = manifest(["shards/00000.npy", name]), None, []
    folder = corpus_folder(tmp_path, live)
    targets = [tmp_path / "elsewhere" / "x", (folder / name.replace("\\", "/")).resolve(), folder.parent / "x"]

    line = refused_in_one_line(join(tmp_path, live.url), name)
    assert "unsafe file name" in line and "refusing to write outside the cache" in line
    assert line.endswith("tell the experiment's organizer")
    assert not any(target.exists() for target in targets)
    assert server.downloads == []


def test_join_refuses_a_corpus_folder_that_leaves_the_cache(hostile, tmp_path):
    server, live = hostile
    server.manifest, server.data_path, server.downloads = manifest(["shards/00000.npy"], "../../../x"), None, []

    line = refused_in_one_line(join(tmp_path, live.url), "../../../x")
    assert "unsafe corpus folder name" in line
    assert not (tmp_path / "cache" / "corpora" / "x").exists() and not (tmp_path / "cache" / "x").exists()
    assert server.downloads == []


@pytest.mark.parametrize("link", ["evil.npy", "shards"], ids=["file-link", "folder-link"])
def test_join_never_writes_through_a_symlink_in_the_cache(hostile, tmp_path, link):
    server, live = hostile
    outside = tmp_path / "outside"
    outside.mkdir()
    folder = corpus_folder(tmp_path, live)
    folder.mkdir(parents=True)
    (folder / link).symlink_to(outside / "evil.npy" if link == "evil.npy" else outside)
    server.manifest, server.data_path, server.downloads = manifest(["evil.npy", "shards/00000.npy"]), None, []

    line = refused_in_one_line(join(tmp_path, live.url), link if link == "evil.npy" else "shards/00000.npy")
    assert f"{folder / link} in the cache is a symlink" in line and "delete" in line
    assert list(outside.iterdir()) == []
    assert server.downloads == []


def test_join_sends_the_token_nowhere_but_the_server(hostile, tmp_path):
    """The paths in a join's answer stay paths on the server: an address there is refused, not requested."""
    server, live = hostile
    server.manifest, server.downloads = manifest(["shards/00000.npy"]), []
    server.data_path = f"http://localhost:{live.port}/elsewhere"  # the same server under another name

    line = refused_in_one_line(join(tmp_path, live.url), server.data_path + "/manifest")
    assert line.startswith(f"Error: {live.url} sent the address ") and "tell the experiment's organizer" in line
    assert server.downloads == []


# -- the confinement helper on its own ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        *[(name, None) for name in ("tokenizer.json", "shards/00000.npy")],
        *[(name, "an absolute path") for name in ("/etc/passwd", "C:/Windows/x", "\\\\host\\x")],
        *[(name, "'..' leads out of its folder") for name in ("../x", "a/../../x", "..")],
        ("a\\b", "a backslash is no separator here"),
        *[(name, "not a plain file name") for name in ("a//b", "./x", ".hidden", "x\x00y", "a b", "shards/")],
        *[(name, "not a file name") for name in ("", 3, None)],
    ],
)
def test_file_name_rules(name, problem):
    assert file_name_problem(name) == problem


def test_a_symlink_planted_after_start_is_not_written_through(tmp_path):
    """The names are checked once when the corpus opens and again at each download."""
    outside = tmp_path / "outside"
    outside.mkdir()
    corpus = RemoteCorpus(manifest(["shards/00000.npy"]), tmp_path / "cache", lambda name: PAYLOAD, lambda: None)
    (corpus.folder / "tokenizer.json").symlink_to(outside / "tokenizer.json")
    with pytest.raises(UnsafePath, match="is a symlink"):
        corpus.file("tokenizer.json")
    (corpus.folder / "shards").symlink_to(outside)
    with pytest.raises(UnsafePath, match="is a symlink"):
        next(corpus.shards(seed=0))
    with pytest.raises(UnsafePath, match="is a symlink"):
        write_file(corpus.folder, "shards/00000.npy", PAYLOAD)
    assert list(outside.iterdir()) == []

    (corpus.folder / "tokenizer.json").unlink()
    (corpus.folder / "shards").unlink()
    assert corpus.file("tokenizer.json").read_bytes() == PAYLOAD  # removed: the download goes on
    assert next(corpus.shards(seed=0)) == confined(corpus.folder, "shards/00000.npy")
    assert sorted(p.name for p in corpus.folder.rglob("*")) == ["00000.npy", "shards", "tokenizer.json"]


# -- plain http ----------------------------------------------------------------------------------------------

# The real CLI in a process whose every connection starts, and ends, at getaddrinfo: each attempt is recorded.
NO_NETWORK = """
import os, socket, sys
def refuse(host, port, *args, **kwargs):
    with open(os.environ["CONNECT_LOG"], "a") as log:
        log.write(f"{host} {port}\\n")
    raise socket.gaierror(socket.EAI_NONAME, "no network in this test")
socket.getaddrinfo = refuse
from swarmhub.worker.cli.main import main
main(sys.argv[1:], prog_name="swarmhub")
"""


def offline(tmp: Path, *args: str, server: str | None = None) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    log = tmp / "connections.log"
    env = {**volunteer(tmp, server), "CONNECT_LOG": str(log)}
    command = [sys.executable, "-c", NO_NETWORK, *args]
    done = subprocess.run(command, env=env, input="shb_volunteer\n", capture_output=True, text=True, timeout=25)
    log.touch()
    return done, log.read_text().splitlines()


@pytest.mark.parametrize(
    ("args", "server"),
    [
        (["login", "--server", "http://10.1.2.3", "--with-token"], None),
        (["join", SLUG], "http://example.org"),
        (["experiments"], "http://10.1.2.3:8000"),
        (["whoami"], "http://example.org"),
    ],
    ids=["login", "join", "experiments", "whoami"],
)
def test_plain_http_to_another_machine_is_refused_before_connecting(tmp_path, args, server):
    done, connections = offline(tmp_path, *args, server=server)
    assert done.returncode == ExitCode.USAGE, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("Error: Refusing plain http to ")
    assert "unencrypted" in line and "--insecure" in line and "https://" in line
    assert connections == []
    assert not (tmp_path / "config" / "credentials.json").exists()


def test_insecure_gets_past_the_check(tmp_path):
    done, connections = offline(tmp_path, "login", "--server", "http://10.1.2.3", "--with-token", "--insecure")
    assert done.returncode == ExitCode.UNREACHABLE, done.stderr
    assert done.stderr.splitlines() == [
        "Error: Cannot reach http://10.1.2.3: is the server running? check --server or SWARMHUB_SERVER"
    ]
    assert connections == ["10.1.2.3 80"]


@pytest.mark.parametrize("server", ["https://10.1.2.3", "http://127.0.0.1:9", "http://localhost:9", "http://[::1]:9"])
def test_https_and_this_machine_need_no_flag(tmp_path, server):
    done, connections = offline(tmp_path, "experiments", server=server)
    assert done.returncode == ExitCode.UNREACHABLE, done.stderr
    assert done.stderr.startswith(f"Error: Cannot reach {server}")
    assert len(connections) == 1


def test_what_counts_as_this_machine():
    # 0.0.0.0: a connection to it reaches this machine. A name other than localhost may resolve anywhere.
    for host in ("localhost", "LOCALHOST.", "127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1", "0.0.0.0"):
        assert on_this_machine(host), host
    for host in ("10.1.2.3", "example.org", "localhost.example.org", "127.0.0.1.example.org", "::ffff:10.0.0.1", ""):
        assert not on_this_machine(host), host


def test_require_encryption_keeps_the_url_normalized():
    assert require_encryption("https://hub.example.org/") == "https://hub.example.org"
    assert require_encryption("http://example.org/", insecure=True) == "http://example.org"
    assert require_encryption("http://user@127.0.0.1:8000") == "http://user@127.0.0.1:8000"
    with pytest.raises(WorkerError, match="Refusing plain http to example.org"):
        require_encryption("http://127.0.0.1@example.org")


# -- nothing unpickles ---------------------------------------------------------------------------------------

PICKLE_MODULES = {"pickle", "_pickle", "cPickle", "cloudpickle", "dill", "marshal", "shelve", "joblib"}


def unpickling(source: str, filename: str = "<source>") -> list[str]:
    """Every place in ``source`` that may unpickle: a pickle-family import, ``torch.load`` without
    ``weights_only=True``, ``numpy.load`` with ``allow_pickle`` other than False, pandas' ``read_pickle``."""
    tree = ast.parse(source, filename)
    modules: dict[str, str] = {}  # local name -> the module or object it stands for
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                modules[alias.asname or top] = alias.name if alias.asname else top
                if top in PICKLE_MODULES:
                    found.append(f"{filename}:{node.lineno}: imports {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            root = node.module.split(".")[0]
            for alias in node.names:
                modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            if root in PICKLE_MODULES:
                found.append(f"{filename}:{node.lineno}: imports from {node.module}")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = dotted(node.func, modules)
        keywords = {k.arg: k.value for k in node.keywords}
        if name == "torch.load" and not is_constant(keywords.get("weights_only"), True):
            found.append(f"{filename}:{node.lineno}: torch.load without weights_only=True")
        if name == "numpy.load" and "allow_pickle" in keywords and not is_constant(keywords["allow_pickle"], False):
            found.append(f"{filename}:{node.lineno}: numpy.load with allow_pickle")
        if name is not None and name.endswith("read_pickle"):
            found.append(f"{filename}:{node.lineno}: {name}")
        if None in keywords and name in ("torch.load", "numpy.load"):  # **kwargs may say weights_only=False
            found.append(f"{filename}:{node.lineno}: {name} with **kwargs")
    return found


def dotted(node: ast.expr, modules: dict[str, str]) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(modules.get(node.id, node.id))
    return ".".join(reversed(parts))


def is_constant(node: ast.expr | None, value: bool) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def test_nothing_in_worker_or_server_unpickles():
    found = []
    for folder in ("worker", "server"):
        for path in sorted((REPO / folder).rglob("*.py")):
            found += unpickling(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))
    assert found == [], "a server or peer could run code on this machine through:\n" + "\n".join(found)


def test_the_unpickling_scan_finds_each_way_in():
    source = """
import pickle
import torch as th
from dill import loads
from torch import load
import numpy as np

th.load(path)
th.load(path, weights_only=False)
load(path)
np.load(path, allow_pickle=True)
th.load(path, **options)
th.load(path, map_location="cpu", weights_only=True)
np.load(path, allow_pickle=False)
"""
    assert unpickling(source) == [
        "<source>:2: imports pickle",
        "<source>:4: imports from dill",
        "<source>:8: torch.load without weights_only=True",
        "<source>:9: torch.load without weights_only=True",
        "<source>:10: torch.load without weights_only=True",
        "<source>:11: numpy.load with allow_pickle",
        "<source>:12: torch.load without weights_only=True",
        "<source>:12: torch.load with **kwargs",
    ]
