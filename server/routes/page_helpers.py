"""What the HTML page routes share: their router, the browser's session, a form's errors, the redirect after a
post. The account pages (``account_pages.py``) and the experiment pages (``experiment_pages.py``) add their routes
to ``router``; ``pages.py`` imports both and is what the app includes."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import RedirectResponse
from pydantic import ValidationError

from swarmhub.server.http.deps import web_session
from swarmhub.server.models import WebSession

router = APIRouter(include_in_schema=False)
WebSess = Annotated[WebSession | None, Depends(web_session)]


def see_other(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)


def form_errors(exc: ValidationError, prefix: str = "") -> dict[str, str]:
    found: dict[str, str] = {}
    for err in exc.errors():
        key = prefix + (str(err["loc"][0]) if err["loc"] else "form")
        found.setdefault(key, str(err["msg"]).removeprefix("Value error, "))
    return found
