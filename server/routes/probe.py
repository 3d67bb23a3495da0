"""Pre-flight probes for ``swarmhub doctor`` and ``swarmhub join``: clock, bandwidth and reachability.

Signed-in volunteers only, bounded in size and time. The reachability probe dials back only the address the
request came from: it cannot be used to make the server connect to other hosts.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from swarmhub.common.protocol import DialResult, ProbeInfo, ReachabilityRequest, ReachabilityResult, UploadResult
from swarmhub.server.core.errors import TooLarge, documented
from swarmhub.server.http.deps import CurrentUser
from swarmhub.server.http.ratelimit import limited_per_account

router = APIRouter(prefix="/api/probe", tags=["probe"], responses=documented(401, 413, 429))

MAX_PROBE_BYTES = 8 * 2**20
DIAL_TIMEOUT = 3.0
_BLOCK = bytes(range(256)) * 4096  # 1 MiB


def _client_host(request: Request) -> str:
    return request.client.host if request.client else ""


@router.get("", response_model=ProbeInfo)
def probe(request: Request, user: CurrentUser) -> ProbeInfo:
    return ProbeInfo(server_time=time.time(), client_host=_client_host(request))


@router.get(
    "/download",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}, "description": "``size`` bytes"}},
)
def download(user: CurrentUser, size: Annotated[int, Query(ge=1, le=MAX_PROBE_BYTES)] = 2**21) -> Response:
    """``size`` bytes to time a download."""
    body = (_BLOCK * (size // len(_BLOCK) + 1))[:size]
    return Response(body, media_type="application/octet-stream", headers={"Cache-Control": "no-store"})


@router.post("/upload", response_model=UploadResult)
async def upload(request: Request, user: CurrentUser) -> UploadResult:
    """Reads the body (at most 8 MiB) and says how long receiving it took."""
    started, received = time.monotonic(), 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > MAX_PROBE_BYTES:
            raise TooLarge(f"an upload probe is at most {MAX_PROBE_BYTES} bytes", field="body")
    return UploadResult(bytes=received, seconds=round(time.monotonic() - started, 6))


def _target(maddr: str, client_host: str) -> tuple[str, int] | str:
    """(host, port) to dial for ``maddr``, or why it will not be dialed."""
    parts = maddr.strip("/").split("/")
    if len(parts) < 4 or parts[0] not in ("ip4", "ip6") or parts[2] != "tcp":
        return "only /ip4/.../tcp/PORT and /ip6/.../tcp/PORT addresses can be probed"
    try:
        host = ipaddress.ip_address(parts[1])
        port = int(parts[3])
    except ValueError:
        return "not an IP address and port"
    if not 0 < port < 65536:
        return "port out of range"
    if host.is_unspecified:  # listening on every interface: dial the address the request came from
        return (client_host, port)
    if client_host and host == ipaddress.ip_address(client_host):
        return (str(host), port)
    return "the server dials only the address your request came from"


def _dial(host: str, port: int) -> str | None:
    try:
        with socket.create_connection((host, port), timeout=DIAL_TIMEOUT):
            return None
    except OSError as exc:
        return exc.strerror or type(exc).__name__


@router.post("/reachability", response_model=ReachabilityResult, dependencies=[limited_per_account("reachability")])
async def reachability(body: ReachabilityRequest, request: Request, user: CurrentUser) -> ReachabilityResult:
    """Dial each announced address back: can other peers open a connection to this worker?"""
    client_host = _client_host(request)
    results = []
    for maddr in body.maddrs:
        target = _target(maddr, client_host)
        if isinstance(target, str):
            results.append(DialResult(maddr=maddr, dialed=None, ok=False, error=target))
            continue
        error = await run_in_threadpool(_dial, *target)
        dialed = f"[{target[0]}]:{target[1]}" if ":" in target[0] else f"{target[0]}:{target[1]}"
        results.append(DialResult(maddr=maddr, dialed=dialed, ok=error is None, error=error))
    return ReachabilityResult(reachable=any(r.ok for r in results), results=results)
