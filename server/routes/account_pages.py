"""Account pages: sign-up, login and logout, the account's API tokens and browser sessions, and the device
login a volunteer's CLI asks for. Forms post back here with a CSRF token; services do the work."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from fastapi import Request
from fastapi.responses import Response
from pydantic import ValidationError

from swarmhub.server.accounts import device
from swarmhub.server.accounts import users as accounts
from swarmhub.server.community import volunteers
from swarmhub.server.core.errors import AppError
from swarmhub.server.http import ratelimit
from swarmhub.server.http.deps import CSRF, DB, SESSION_COOKIE, AppSettings, PageUser, RequiredPageUser
from swarmhub.server.http.ratelimit import limited
from swarmhub.server.http.views import render
from swarmhub.server.routes.page_helpers import WebSess, form_errors, router, see_other


def _safe_next(target: str | None) -> str:
    """Only same-site paths: an open redirect after login would hand our users to a phishing page."""
    if not target or not target.startswith("/") or target.startswith("//") or urlparse(target).netloc:
        return "/"
    return target


@router.get("/signup")
def signup_page(request: Request, user: PageUser, web: WebSess) -> Response:
    return render(request, "signup.html", {"values": {}, "errors": {}}, user=user, web=web)


def _login_response(session: DB, user: Any, settings: AppSettings, target: str) -> Response:
    cookie, _ = accounts.start_session(session, user, settings.session_days)
    response = see_other(_safe_next(target))
    response.set_cookie(
        SESSION_COOKIE,
        cookie,
        httponly=True,
        samesite="lax",
        secure=settings.cookie_secure,
        max_age=settings.session_days * 86400,
        path="/",
    )
    return response


@router.post("/signup", dependencies=[CSRF, limited("signup")])
async def signup(request: Request, session: DB, settings: AppSettings, web: WebSess) -> Response:
    form = await request.form()
    values = {"username": str(form.get("username", ""))}
    try:
        data = accounts.Signup(username=values["username"], password=str(form.get("password", "")))
        user = accounts.create_user(session, data.username, data.password)
    except ValidationError as exc:
        return render(request, "signup.html", {"values": values, "errors": form_errors(exc)}, web=web, status_code=422)
    except AppError as exc:
        errors = {exc.field or "form": exc.message}
        return render(
            request, "signup.html", {"values": values, "errors": errors}, web=web, status_code=exc.status_code
        )
    return _login_response(session, user, settings, str(form.get("next", "/")))


@router.get("/login")
def login_page(request: Request, user: PageUser, web: WebSess, next: str = "/") -> Response:
    return render(request, "login.html", {"values": {}, "errors": {}, "next": _safe_next(next)}, user=user, web=web)


@router.post("/login", dependencies=[CSRF, limited("login")])
async def login(request: Request, session: DB, settings: AppSettings, web: WebSess) -> Response:
    form = await request.form()
    values = {"username": str(form.get("username", ""))}
    target = _safe_next(str(form.get("next", "/")))
    try:
        credentials = accounts.Login(username=values["username"], password=str(form.get("password", "")))
    except ValidationError as exc:
        context = {"values": values, "errors": form_errors(exc), "next": target}
        return render(request, "login.html", context, web=web, status_code=422)
    try:
        user = accounts.authenticate(session, credentials.username, credentials.password)
    except AppError as exc:
        context = {"values": values, "errors": {"password": exc.message}, "next": target}
        return render(request, "login.html", context, web=web, status_code=401)
    return _login_response(session, user, settings, target)


@router.post("/logout", dependencies=[CSRF])
def logout(session: DB, web: WebSess) -> Response:
    if web is not None:
        accounts.end_session(session, web)
    response = see_other("/")
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


# The lifetimes the account page offers for a new token, in days ("0": until revoked)
TOKEN_LIFETIMES = ("0", "30", "90", "365")


@router.get("/account")
def account(request: Request, session: DB, user: RequiredPageUser, web: WebSess) -> Response:
    context = {"tokens": accounts.user_tokens(session, user), "new_token": None}
    return render(request, "account.html", context, user=user, web=web)


@router.post("/account/tokens", dependencies=[CSRF, limited("token-issue")])
async def create_token(request: Request, session: DB, user: RequiredPageUser, web: WebSess) -> Response:
    form = await request.form()
    try:
        named = accounts.TokenCreate(name=str(form.get("name", "")).strip()[:100] or "token")
    except ValidationError as exc:
        context: dict[str, Any] = {"tokens": accounts.user_tokens(session, user), "new_token": None}
        context["errors"] = form_errors(exc)
        return render(request, "account.html", context, user=user, web=web, status_code=422)
    scope = str(form.get("scope", accounts.VOLUNTEER))
    days = str(form.get("expires_in_days", "") or "0")
    errors = {}
    if scope not in accounts.SCOPES:
        errors["scope"] = "choose volunteer or organizer"
    if days not in TOKEN_LIFETIMES:
        errors["expires_in_days"] = "choose one of the lifetimes offered"
    if errors:
        context = {"tokens": accounts.user_tokens(session, user), "new_token": None, "errors": errors}
        return render(request, "account.html", context, user=user, web=web, status_code=422)
    value, _ = accounts.issue_token(session, user, named.name, scope, int(days) or None)
    context = {"tokens": accounts.user_tokens(session, user), "new_token": value}
    response = render(request, "account.html", context, user=user, web=web)
    response.headers["Cache-Control"] = "no-store"  # the token is shown once and must not be cached
    return response


@router.post("/account/sign-out-everywhere", dependencies=[CSRF])
def sign_out_everywhere(session: DB, user: RequiredPageUser) -> Response:
    """End every browser session of this account, this one included (API tokens stay: revoke them above)."""
    accounts.end_all_sessions(session, user)
    response = see_other("/login")
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


@router.post("/account/profile", dependencies=[CSRF])
async def profile_visibility(request: Request, session: DB, user: RequiredPageUser) -> Response:
    """Hide the public profile (``/u/{username}`` and its JSON answer 404), or show it again."""
    form = await request.form()
    volunteers.set_hidden(session, user, form.get("profile_hidden") == "on")
    return see_other("/account#profile")


@router.post("/account/tokens/{token_id}/revoke", dependencies=[CSRF])
def revoke_token(token_id: int, session: DB, user: RequiredPageUser) -> Response:
    for token in accounts.user_tokens(session, user):
        if token.id == token_id:
            accounts.revoke_token(session, token)
    return see_other("/account")


@router.get("/device")
def device_page(request: Request, session: DB, user: RequiredPageUser, web: WebSess, user_code: str = "") -> Response:
    grant = None
    errors: dict[str, str] = {}
    if user_code:
        ratelimit.check(request, "device-entry")  # codes are short: guessing them must be slow
        try:
            grant = device.pending(session, user_code)
        except AppError as exc:
            errors["user_code"] = exc.message
    context = {"user_code": user_code[:16], "grant": grant, "errors": errors, "done": None, "scopes": accounts.SCOPES}
    return render(request, "device.html", context, user=user, web=web)


@router.post("/device", dependencies=[CSRF, limited("device-entry")])
async def device_decide(request: Request, session: DB, user: RequiredPageUser, web: WebSess) -> Response:
    form = await request.form()
    user_code = str(form.get("user_code", ""))[:16]
    decision = str(form.get("decision", ""))
    if decision not in ("approve", "deny"):  # the code-entry step: show what is being approved
        return see_other(f"/device?user_code={user_code}")
    days = str(form.get("expires_in_days", "") or "0")
    if days not in TOKEN_LIFETIMES:
        errors = {"expires_in_days": "choose one of the lifetimes offered"}
        try:
            grant = device.pending(session, user_code)
        except AppError as exc:
            grant, errors = None, {"user_code": exc.message}
        context = {"user_code": user_code, "grant": grant, "errors": errors, "done": None, "scopes": accounts.SCOPES}
        return render(request, "device.html", context, user=user, web=web, status_code=422)
    try:
        device.decide(session, user_code, user, approve=decision == "approve", token_days=int(days) or None)
    except AppError as exc:
        context = {"user_code": user_code, "grant": None, "errors": {"user_code": exc.message}, "done": None}
        return render(request, "device.html", context, user=user, web=web, status_code=exc.status_code)
    context = {"user_code": user_code, "grant": None, "errors": {}, "done": decision}
    return render(request, "device.html", context, user=user, web=web)
