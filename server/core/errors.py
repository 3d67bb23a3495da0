"""One error family, one renderer: JSON ``{"detail": ...}`` under /api, an HTML page elsewhere."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class AppError(Exception):
    status_code = 400

    def __init__(self, message: str, *, field: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.field = field
        self.headers = headers

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"detail": self.message}
        if self.field:
            body["field"] = self.field
        return body


class BadRequest(AppError):
    status_code = 400


class NotAuthenticated(AppError):
    status_code = 401


class Forbidden(AppError):
    status_code = 403


class NotFound(AppError):
    status_code = 404


class Conflict(AppError):
    status_code = 409


class TooLarge(AppError):
    status_code = 413


class TooManyRequests(AppError):
    status_code = 429


class UpgradeRequired(AppError):
    status_code = 426


class Unavailable(AppError):
    status_code = 503


class Removed(Forbidden):
    """The organizer removed this volunteer; the body says so, so the CLI can tell it from other refusals."""

    def body(self) -> dict[str, Any]:
        return {**super().body(), "removed": True}


class ErrorBody(BaseModel):
    """Every JSON error but request validation (422) has this shape."""

    detail: str
    field: str | None = Field(default=None, description="The request field that is wrong, when one is")
    removed: bool | None = Field(default=None, description="Set when the organizer removed this volunteer")


def documented(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for the error codes a router's routes may answer with."""
    text = {
        400: "Bad request",
        401: "Not signed in, or the token is not valid",
        403: "Not allowed",
        404: "Not found",
        409: "Conflicts with the current state",
        413: "Too large",
        426: "This client is too old: upgrade it",
        429: "Too many requests: see Retry-After",
        503: "Unavailable for now: see Retry-After",
    }
    return {code: {"model": ErrorBody, "description": text[code]} for code in codes}
