"""A volunteer's public page (``/u/{username}``): what they helped train, from the ledger's running totals."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from swarmhub.server.community import volunteers
from swarmhub.server.http.deps import DB, PageUser
from swarmhub.server.http.views import render
from swarmhub.server.routes.page_helpers import WebSess, router


@router.get("/u/{username}")
def profile_page(request: Request, username: str, session: DB, user: PageUser, web: WebSess) -> Response:
    """The same 404 page for a name no one has and for a hidden profile."""
    context = {"profile": volunteers.profile(session, username), "own": user is not None and user.username == username}
    return render(request, "profile.html", context, user=user, web=web)
