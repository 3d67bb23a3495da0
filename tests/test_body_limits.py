"""Request bodies are bounded before anything reads them (``server/http/body_limit.py``).

Against a real server process (`swarmhub server`, uvicorn): 200 MB sent to the log-in route and to the corpus
upload, with a Content-Length and without one (chunked), is answered 413 after a few MB at most, and the server's
peak memory stays within 50 MB of what it held idle. Through the TestClient: the limits' edges and the error page.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from .conftest import PASSWORD, csrf_from, make_user
from .processes import running_server, signup
from .support import SMALL

HUGE = 200 * 2**20
CHUNK = 2**16
BOUNDARY = "swarmhub-body-limit"


@dataclass
class Hub:
    url: str
    pid: int
    organizer: dict[str, str]


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    """One server for the module, its corpus uploads capped at 8 MB, with an organizer and an ALBERT experiment."""
    with running_server(tmp_path_factory.mktemp("hub"), swarm_enabled="false", corpus_max_mb="8") as (url, process):
        organizer = {"Authorization": f"Bearer {signup(url, 'olga')}"}
        created = httpx.post(
            f"{url}/api/experiments",
            headers=organizer,
            json={"slug": "text", "title": "Text", "task": "albert-mlm", "task_params": {"size": "tiny"}},
        )
        assert created.status_code == 201, created.text
        yield Hub(url, process.pid, organizer)


def memory_mb(pid: int, field: str) -> float:
    """VmRSS (resident now) or VmHWM (the peak since the last reset) of a process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} for process {pid}")


class Sender:
    """A request body of ``size`` bytes made as it is sent (the test never holds it), counting what left."""

    def __init__(self, size: int, head: bytes = b"", tail: bytes = b""):
        self.size, self.head, self.tail = size, head, tail
        self.sent = 0

    @property
    def length(self) -> int:
        return len(self.head) + self.size + len(self.tail)

    def __iter__(self) -> Iterator[bytes]:
        block = b"word " * (CHUNK // 5)
        full, rest = divmod(self.size, len(block))
        for part in (self.head, *(block for _ in range(full)), block[:rest], self.tail):
            self.sent += len(part)
            yield part


def upload_of(size: int) -> Sender:
    """A multipart form with one text file of ``size`` bytes, as a browser or `curl -F` sends it."""
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="huge.txt"\r\n'
        "Content-Type: text/plain\r\n\r\n"
    ).encode()
    return Sender(size, head, f"\r\n--{BOUNDARY}--\r\n".encode())


@pytest.mark.parametrize("with_length", [True, False], ids=["content-length", "chunked"])
@pytest.mark.parametrize(
    ("route", "expected"),
    [
        ("/api/auth/token", {"detail": "request body over 1 MiB (SWARMHUB_BODY_MAX_MB)", "field": "body"}),
        ("/api/experiments/text/corpus", None),
    ],
    ids=["login", "corpus"],
)
def test_a_huge_body_is_refused_before_it_is_read(hub, route, expected, with_length):
    upload = route.endswith("/corpus")
    body = upload_of(HUGE) if upload else Sender(HUGE)
    headers = {
        **(hub.organizer if upload else {}),
        "Content-Type": f"multipart/form-data; boundary={BOUNDARY}" if upload else "application/json",
    }
    if with_length:
        headers["Content-Length"] = str(body.length)  # else httpx sends it chunked
    idle = memory_mb(hub.pid, "VmRSS")
    Path(f"/proc/{hub.pid}/clear_refs").write_text("5")  # VmHWM starts again from what the server holds now

    method = "PUT" if upload else "POST"
    response = httpx.request(method, f"{hub.url}{route}", content=body, headers=headers, timeout=60)

    assert response.status_code == 413, response.text
    if upload:
        size = "200 MiB" if with_length else "over 8 MiB"
        expected = {
            "detail": f"the upload is {size}; this server takes training text up to 8 MiB (SWARMHUB_CORPUS_MAX_MB)",
            "field": "file",
        }
    assert response.json() == expected
    assert response.headers["connection"] == "close"  # the rest of the body is not read: the client stops
    assert body.sent < 40 * 2**20
    assert memory_mb(hub.pid, "VmHWM") - idle < 50


def test_a_normal_login_and_upload_still_work(hub, docstrings):
    login = httpx.post(f"{hub.url}/api/auth/token", json={"username": "olga", "password": PASSWORD})
    assert login.status_code == 200 and login.json()["username"] == "olga"
    files = {"file": ("docs.txt", docstrings, "text/plain")}
    upload = httpx.put(f"{hub.url}/api/experiments/text/corpus", headers=hub.organizer, files=files, data=SMALL)
    assert upload.status_code == 200, upload.text
    assert upload.json()["bytes"] == len(docstrings)


def test_the_limit_is_where_the_setting_puts_it(client, db, settings):
    make_user(db)
    login = b'{"username": "alice", "password": "wrong password"}'
    at_limit = login + b" " * (2**20 - len(login))  # 1 MiB of valid JSON

    def status(body: bytes) -> int:
        return client.post("/api/auth/token", content=body, headers={"Content-Type": "application/json"}).status_code

    assert status(at_limit) == 401  # read and checked as any log-in
    assert status(at_limit + b" ") == 413
    settings.body_max_mb = 2
    assert status(at_limit + b" ") == 401


def test_a_page_gets_the_error_page(client, db):
    """Outside /api the refusal is the site's error page, as every other error."""
    make_user(db)
    token = csrf_from(client.get("/login").text)
    response = client.post("/login", data={"username": "alice", "password": "x" * 2**21, "csrf_token": token})
    assert response.status_code == 413
    assert response.headers["content-type"].startswith("text/html")
    assert "request body over 1 MiB (SWARMHUB_BODY_MAX_MB)" in response.text
