"""Rendering pages: the Jinja2 environment, the CSRF cookie for visitors, and the error page."""

from __future__ import annotations

from importlib.resources import files
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from swarmhub.server.http.deps import CSRF_COOKIE, csrf_token_for
from swarmhub.server.http.worker_package import install_info
from swarmhub.server.live.snapshots import base_url
from swarmhub.server.services import services

templates = Jinja2Templates(directory=str(files("swarmhub.web") / "templates"))


def render(
    request: Request,
    name: str,
    context: dict[str, Any] | None = None,
    *,
    user: Any = None,
    web: Any = None,
    status_code: int = 200,
) -> HTMLResponse:
    csrf = csrf_token_for(request, web)
    worker = install_info(services(request.app).worker_package, base_url(request, services(request.app).settings))
    response = templates.TemplateResponse(
        request,
        name,
        {"user": user, "csrf_token": csrf, "worker": worker, **(context or {})},
        status_code=status_code,
    )
    new = getattr(request.state, "new_csrf", None)
    if new:
        settings = services(request.app).settings
        response.set_cookie(CSRF_COOKIE, new, httponly=True, samesite="strict", secure=settings.cookie_secure, path="/")
    return response


def render_error(request: Request, status_code: int, message: str) -> HTMLResponse:
    return templates.TemplateResponse(
        request,
        "error.html",
        {"user": None, "csrf_token": "", "status_code": status_code, "message": message},
        status_code=status_code,
    )
