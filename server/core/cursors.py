"""Page cursors: a row's sort key as opaque text (URL-safe base64 of its JSON array, unpadded), which clients only
hand back. Each paged list (the leaderboard, the team standings, a team's members) defines its key as a NamedTuple
and codes it with these two functions."""

from __future__ import annotations

import base64
from typing import TypeVar

from pydantic import TypeAdapter, ValidationError

from swarmhub.server.core.errors import BadRequest

T = TypeVar("T")


def encode(adapter: TypeAdapter[T], value: T) -> str:
    return base64.urlsafe_b64encode(adapter.dump_json(value)).decode().rstrip("=")


def decode(adapter: TypeAdapter[T], text: str, field: str, message: str) -> T:
    """The key ``text`` encodes; a 400 naming ``field`` with ``message`` for anything a page did not return."""
    try:
        return adapter.validate_json(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (ValueError, ValidationError):  # a base64 error is a ValueError
        raise BadRequest(message, field=field) from None
