"""The worker's HTTP client for the swarmhub server, and the one error type the CLI renders.

Every failure becomes a :class:`WorkerError` whose message tells the volunteer what to do next, and whose
exit code is one of these (documented in docs/volunteers.md and reused by every command):

====  ==========================================================================================
code  meaning
====  ==========================================================================================
0     ok
1     unexpected error (a bug: please report it)
2     usage (bad option or argument, no server configured)
3     authentication: not logged in, token rejected, login denied or expired
4     not found: unknown experiment (or a task this install lacks)
5     server unreachable or server error (also: the swarm's bootstrap peers did not answer)
6     experiment not accepting volunteers (not running, or stopped by its organizer while joined)
7     this machine's clock is too far off the server's (tokens and swarm records expire by each peer's clock)
8     removed from the experiment by its organizer
130   interrupted by Ctrl-C
143   terminated by SIGTERM
====  ==========================================================================================
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

from swarmhub import __version__
from swarmhub.common.choice import JoinableExperiment
from swarmhub.common.protocol import (
    JOIN_REPORT_FIELDS,
    DenyListPublic,
    DeviceCode,
    ExperimentDetail,
    ExperimentSummary,
    JoinRequest,
    JoinResponse,
    Me,
    ProbeInfo,
    ReachabilityResult,
    ShardTurn,
    SwarmToken,
    SwarmTokenRequest,
    TokenResponse,
    UploadResult,
    WorkerInstall,
)
from swarmhub.worker.errors import MAX_CLOCK_SKEW_SECONDS as MAX_CLOCK_SKEW_SECONDS
from swarmhub.worker.errors import ExitCode as ExitCode
from swarmhub.worker.errors import WorkerError as WorkerError
from swarmhub.worker.errors import check_clock as check_clock
from swarmhub.worker.errors import normalize_server_url as normalize_server_url
from swarmhub.worker.errors import not_accepting as not_accepting
from swarmhub.worker.errors import not_logged_in as not_logged_in
from swarmhub.worker.errors import removed as removed
from swarmhub.worker.errors import token_rejected as token_rejected
from swarmhub.worker.errors import unknown_experiment as unknown_experiment
from swarmhub.worker.errors import upgrade_required as upgrade_required

T = TypeVar("T")

# How long `join` waits for an experiment's swarm peer to start (HTTP 503): a fresh peer imports torch and hivemind
# and starts its p2pd, which took over 60 s on a busy 2-core server.
JOIN_RETRY_SECONDS = 180.0
# The server may hold a join while it starts the swarm peer: a longer read timeout than other calls.
JOIN_TIMEOUT = httpx.Timeout(15.0, read=60.0)
DATA_TIMEOUT = httpx.Timeout(15.0, read=120.0)  # one corpus file (a shard is a few MB at most)
USER_AGENT = f"swarmhub-worker/{__version__}"  # what the `swarmhub` commands send


def _detail(response: httpx.Response) -> str:
    """The human part of an error body: ``{"detail": "..."}``, FastAPI's 422 list, or ``{"error": ...}``."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:200]
    if isinstance(body, dict):
        detail = body.get("detail", body.get("error", ""))
        if isinstance(detail, list):
            return "; ".join(str(item.get("msg", item)) if isinstance(item, dict) else str(item) for item in detail)
        return str(detail)
    return str(body)[:200]


def _refuses_only_unknown(response: httpx.Response, names: tuple[str, ...]) -> bool:
    """A 422 whose every error is a body field among ``names`` that the server does not know (FastAPI's list)."""
    try:
        errors = response.json().get("detail")
    except (ValueError, AttributeError):
        return False
    return (
        isinstance(errors, list)
        and bool(errors)
        and all(
            isinstance(err, dict)
            and err.get("type") == "extra_forbidden"
            and isinstance(err.get("loc"), list)
            and len(err["loc"]) == 2
            and err["loc"][1] in names
            for err in errors
        )
    )


def _retry_after(response: httpx.Response, default: float = 2.0) -> float:
    try:
        return min(max(float(response.headers.get("retry-after", default)), 0.5), 10.0)
    except ValueError:
        return default


class ApiClient:
    """Synchronous client for the server's JSON API. Use as a context manager or call :meth:`close`."""

    def __init__(
        self,
        server_url: str,
        token: str | None = None,
        *,
        timeout: float = 15.0,
        user_agent: str = "swarmhub-worker",
    ):
        self.server_url = normalize_server_url(server_url)
        self._token = token
        headers = {"User-Agent": user_agent, "Accept": "application/json"}
        self._http = httpx.Client(base_url=self.server_url, timeout=timeout, headers=headers)
        # When the latest request was sent and its answer received (wall clock): a clock check compares the server's
        # time against that one exchange, never against a wait made of several (a join waiting for a swarm to start)
        self.last_exchange: tuple[float, float] | None = None

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- plumbing -------------------------------------------------------------------------------------

    def _send(
        self, method: str, path: str, *, auth: bool | None = False, token: str | None = None, **kw: Any
    ) -> httpx.Response:
        """``auth=True`` needs a token; ``None`` sends one when there is one (public endpoints show a
        logged-in user more, e.g. their own drafts)."""
        if httpx.URL(path).is_absolute_url:  # paths come from the server too: the token goes nowhere else
            raise WorkerError(
                f"{self.server_url} sent the address {path[:200]!r} where a path belongs: refusing to send your "
                "token anywhere else; tell the experiment's organizer",
                ExitCode.UNREACHABLE,
            )
        headers = dict(kw.pop("headers", {}) or {})
        bearer = token if token is not None else self._token
        if auth or token is not None or (auth is None and bearer):
            if not bearer:
                raise not_logged_in(self.server_url)
            headers["Authorization"] = f"Bearer {bearer}"
        try:
            sent_at = time.time()
            response = self._http.request(method, path, headers=headers, **kw)
            self.last_exchange = (sent_at, time.time())
            return response
        except httpx.TimeoutException as exc:
            raise WorkerError(
                f"{self.server_url} did not answer in time ({type(exc).__name__}): try again later, "
                "or check --server or SWARMHUB_SERVER",
                ExitCode.UNREACHABLE,
            ) from None
        except httpx.TransportError:
            raise WorkerError(
                f"Cannot reach {self.server_url}: is the server running? check --server or SWARMHUB_SERVER",
                ExitCode.UNREACHABLE,
            ) from None

    def _raise_for_status(self, response: httpx.Response, *, slug: str | None = None) -> None:
        status = response.status_code
        if status < 400:
            return
        detail = _detail(response)
        if status == 401:
            raise token_rejected()
        if status == 403 and slug is not None and _body_flag(response, "removed"):
            raise removed(slug)
        if status == 403:
            raise WorkerError(f"Not allowed: {detail or 'forbidden'}", ExitCode.AUTH)
        if status == 404 and slug is not None:
            raise unknown_experiment(slug, self.server_url)
        if status == 426:
            raise upgrade_required(detail)
        if status == 404:
            raise WorkerError(
                f"{self.server_url} has no {response.request.url.path}: is it a swarmhub server? "
                "check --server or SWARMHUB_SERVER",
                ExitCode.UNREACHABLE,
            )
        if status >= 500:
            raise WorkerError(
                f"The server at {self.server_url} failed (HTTP {status}): try again later",
                ExitCode.UNREACHABLE,
            )
        raise WorkerError(
            f"The server refused the request (HTTP {status}: {detail}): "
            "is this swarmhub version compatible? try `swarmhub upgrade`",
            ExitCode.ERROR,
        )

    def _parse(self, model: type[T] | TypeAdapter[T], response: httpx.Response) -> T:
        try:
            if isinstance(model, TypeAdapter):
                return model.validate_json(response.content)
            assert issubclass(model, BaseModel)  # noqa: S101 - narrows the type for mypy
            return model.model_validate_json(response.content)  # type: ignore[return-value]
        except ValidationError:
            raise WorkerError(
                f"Unexpected answer from {self.server_url}{response.request.url.path}: "
                "is it a swarmhub server of a compatible version? try `swarmhub upgrade`",
                ExitCode.UNREACHABLE,
            ) from None

    # -- endpoints ------------------------------------------------------------------------------------

    def device_code(self, client_name: str, scope: str = "volunteer") -> DeviceCode:
        response = self._send("POST", "/api/auth/device/code", json={"client_name": client_name, "scope": scope})
        self._raise_for_status(response)
        return self._parse(DeviceCode, response)

    def device_token(self, device_code: str) -> TokenResponse | str:
        """A token once the user approved, else the RFC 8628 error string (``authorization_pending``...)."""
        response = self._send("POST", "/api/auth/device/token", json={"device_code": device_code})
        if response.status_code == 400:
            try:
                error = response.json().get("error")
            except (ValueError, AttributeError):
                error = None
            if isinstance(error, str):
                return error
        self._raise_for_status(response)
        return self._parse(TokenResponse, response)

    def probe(self) -> ProbeInfo:
        response = self._send("GET", "/api/probe", auth=True)
        self._raise_for_status(response)
        return self._parse(ProbeInfo, response)

    def download_probe(self, size: int) -> int:
        """Download ``size`` bytes from the server; returns how many arrived."""
        response = self._send("GET", "/api/probe/download", auth=True, params={"size": size})
        self._raise_for_status(response)
        return len(response.content)

    def upload_probe(self, size: int) -> UploadResult:
        response = self._send("POST", "/api/probe/upload", auth=True, content=b"\0" * size)
        self._raise_for_status(response)
        return self._parse(UploadResult, response)

    def reachability(self, maddrs: list[str]) -> ReachabilityResult:
        response = self._send("POST", "/api/probe/reachability", auth=True, json={"maddrs": maddrs})
        self._raise_for_status(response)
        return self._parse(ReachabilityResult, response)

    def me(self, token: str | None = None) -> Me:
        response = self._send("GET", "/api/me", auth=True, token=token)
        self._raise_for_status(response)
        return self._parse(Me, response)

    def worker_package(self) -> WorkerInstall:
        """The worker this hub serves (``GET /api/worker``): its wheel, hash and install command."""
        response = self._send("GET", "/api/worker", auth=None)
        self._raise_for_status(response)
        return self._parse(WorkerInstall, response)

    def revoke_token(self) -> None:
        response = self._send("DELETE", "/api/auth/token", auth=True)
        self._raise_for_status(response)

    def experiments(self) -> list[ExperimentSummary]:
        response = self._send("GET", "/api/experiments", auth=None)
        self._raise_for_status(response)
        return self._parse(TypeAdapter(list[ExperimentSummary]), response)

    def joinable(self) -> list[JoinableExperiment]:
        """The running experiments this account may join, most needed first (``GET /api/me/joinable``)."""
        response = self._send("GET", "/api/me/joinable", auth=True)
        self._raise_for_status(response)
        return self._parse(TypeAdapter(list[JoinableExperiment]), response)

    def experiment(self, slug: str) -> ExperimentDetail:
        response = self._send("GET", f"/api/experiments/{quote(slug, safe='')}", auth=None)
        self._raise_for_status(response, slug=slug)
        return self._parse(ExperimentDetail, response)

    def join(
        self,
        slug: str,
        request: JoinRequest,
        *,
        retry_for: float = JOIN_RETRY_SECONDS,
        on_wait: Callable[[float], None] | None = None,
    ) -> JoinResponse:
        """Join an experiment; waits (up to ``retry_for`` s) while the server starts its swarm peer (503), calling
        ``on_wait(retry_for)`` once when it starts waiting."""
        path = f"/api/experiments/{quote(slug, safe='')}/join"
        waited = False
        body = request.model_dump(mode="json", exclude_none=True)  # what it does not report, it leaves out
        deadline = time.monotonic() + retry_for
        while True:
            response = self._send("POST", path, auth=True, json=body, timeout=JOIN_TIMEOUT)
            if response.status_code == 422 and _refuses_only_unknown(response, JOIN_REPORT_FIELDS):
                # A server older than these optional fields forbids unknown ones: join without them.
                body = {name: value for name, value in body.items() if name not in JOIN_REPORT_FIELDS}
                continue
            starting = response.status_code == 503 and "retry-after" in response.headers  # else it never will
            if starting and time.monotonic() < deadline:
                if on_wait is not None and not waited:
                    on_wait(retry_for)
                waited = True
                time.sleep(min(_retry_after(response), max(deadline - time.monotonic(), 0.1)))
                continue
            break
        if response.status_code == 409:
            try:  # the 409's detail is free text: ask for the status to name it exactly
                status = self.experiment(slug).status.value
            except WorkerError:
                status = "not running"
            raise not_accepting(slug, status)
        if response.status_code == 503 and not starting:
            raise WorkerError(f"The server cannot run {slug!r} now: {_detail(response)}", ExitCode.UNREACHABLE)
        if response.status_code == 503:
            raise WorkerError(
                f"The swarm of {slug!r} did not start within {retry_for:.0f} s: try again in a few minutes, or ask the"
                " experiment's organizer whether its server is up",
                ExitCode.UNREACHABLE,
            )
        self._raise_for_status(response, slug=slug)
        return self._parse(JoinResponse, response)

    def swarm_token(self, join: JoinResponse, public_key: str) -> SwarmToken:
        """A fresh swarm token for this peer's key (the authorizer calls it before the current one expires)."""
        body = SwarmTokenRequest(peer_public_key=public_key).model_dump(mode="json")
        response = self._send("POST", join.token_path, auth=True, json=body)
        if response.status_code == 409:
            raise not_accepting(join.experiment.slug, "not running")
        self._raise_for_status(response, slug=join.experiment.slug)
        return self._parse(SwarmToken, response)

    def denylist(self, slug: str) -> set[str]:
        """Usernames removed from the experiment: every peer refuses their requests."""
        response = self._send("GET", f"/api/experiments/{quote(slug, safe='')}/denylist", auth=True)
        self._raise_for_status(response, slug=slug)
        return set(self._parse(DenyListPublic, response).usernames)

    # -- the experiment's corpus (tasks that train on one) ------------------------------------------------

    def data_manifest(self, slug: str, data_path: str) -> dict[str, Any]:
        response = self._send("GET", f"{data_path}/manifest", auth=True, timeout=DATA_TIMEOUT)
        self._raise_data_status(response, slug)
        body = response.json()
        if not isinstance(body, dict) or not isinstance(body.get("shards"), list):
            raise WorkerError(f"Unexpected corpus manifest from {self.server_url}: try again later", ExitCode.ERROR)
        return body

    def data_file(self, slug: str, data_path: str, name: str) -> bytes:
        response = self._send("GET", f"{data_path}/files/{quote(name, safe='/')}", auth=True, timeout=DATA_TIMEOUT)
        self._raise_data_status(response, slug)
        return response.content

    def next_shard(self, slug: str, data_path: str) -> int:
        response = self._send("POST", f"{data_path}/next-shard", auth=True)
        self._raise_data_status(response, slug)
        return self._parse(ShardTurn, response).index

    def _raise_data_status(self, response: httpx.Response, slug: str) -> None:
        if response.status_code == 409:  # not running, or no text yet
            raise WorkerError(f"{slug!r} serves no training text now ({_detail(response)})", ExitCode.NOT_ACCEPTING)
        self._raise_for_status(response, slug=slug)


def _body_flag(response: httpx.Response, name: str) -> bool:
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and body.get(name) is True


def report_url(server_url: str, join: JoinResponse) -> str:
    """The websocket URL for metric reports: http->ws, https->wss, plus the join's path and worker id."""
    base = normalize_server_url(server_url)
    scheme, rest = base.split("://", 1)
    ws_scheme = "wss" if scheme == "https" else "ws"
    path = join.report_path if join.report_path.startswith("/") else "/" + join.report_path
    separator = "&" if "?" in path else "?"
    return f"{ws_scheme}://{rest}{path}{separator}worker_id={quote(join.worker_id, safe='')}"
