"""Lists served in pages by cursor (the leaderboard, teams, their members and experiments): the body stays the list
that dashboards and scripts read, and the way to the next page is in headers, ``Next-Cursor`` and ``Link``
(rel="next", RFC 8288), both absent on the last page."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from fastapi import Request, Response

# The OpenAPI ``responses`` of a route that pages this way.
NEXT_PAGE: dict[int | str, dict[str, Any]] = {
    200: {
        "headers": {
            "Next-Cursor": {"description": "Pass as ?cursor= for the next page; absent on the last page"},
            "Link": {"description": 'The next page\'s address, rel="next" (RFC 8288); absent on the last page'},
        }
    }
}


def link_next(request: Request, response: Response, limit: int, next_cursor: str | None) -> None:
    """Set ``Next-Cursor`` and ``Link`` for the page after this one, where there is one."""
    if next_cursor is not None:
        response.headers["Next-Cursor"] = next_cursor
        query = urlencode({"limit": limit, "cursor": next_cursor})
        response.headers["Link"] = f'<{request.url.path}?{query}>; rel="next"'
