"""Users, browser sessions and API tokens. Service functions take the session first and never commit."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from pydantic import BaseModel, Field, field_validator
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from swarmhub.common.tokens import SERVER_PEER_USERNAME
from swarmhub.server.core import security
from swarmhub.server.core.errors import Conflict, NotAuthenticated
from swarmhub.server.core.security import StoredText
from swarmhub.server.models import ApiToken, User, WebSession, utcnow

USERNAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{1,31}$")


def is_reserved_username(username: str) -> bool:
    """Whether ``username`` is, or reads as, the name in the server's own swarm peers' tokens.

    Usernames are unique regardless of case (``create_user``), and '-' and '_' are easily taken for each other
    or missed on a leaderboard: "SwarmHub", "swarm-hub" and "swarm_hub" are all reserved."""
    return re.sub(r"[-_]", "", username.lower()) == SERVER_PEER_USERNAME


class Signup(BaseModel):
    username: str = Field(min_length=2, max_length=32)
    password: str = Field(min_length=8, max_length=256)

    @field_validator("username")
    @classmethod
    def _username(cls, value: str) -> str:
        if not USERNAME_RE.match(value):
            raise ValueError("use 2-32 letters, digits, '-' or '_', starting with a letter or digit")
        return value


class Login(BaseModel):
    username: StoredText = Field(max_length=32)
    password: str = Field(max_length=256)


class TokenCreate(BaseModel):
    name: StoredText = Field(min_length=1, max_length=100)


def user_named(session: Session, username: str) -> User | None:
    """The user called exactly ``username``, or None."""
    if "\x00" in username:  # no stored name has one, and PostgreSQL refuses one even in a query
        return None
    return session.scalar(select(User).where(User.username == username))


def create_user(session: Session, username: str, password: str, *, is_admin: bool | None = None) -> User:
    """Create a user. The very first user becomes the administrator unless told otherwise."""
    data = Signup(username=username, password=password)
    if is_reserved_username(data.username):
        raise Conflict("that username is reserved for the swarm peers of the server", field="username")
    taken = session.scalar(select(User.id).where(func.lower(User.username) == data.username.lower()))
    if taken is not None:
        raise Conflict("that username is taken", field="username")
    if is_admin is None:
        is_admin = session.scalar(select(func.count(User.id))) == 0
    user = User(username=data.username, password_hash=security.hash_password(data.password), is_admin=is_admin)
    session.add(user)
    session.flush()
    return user


def set_password(session: Session, user: User, password: str) -> tuple[int, int]:
    """A new password, as after a reset: whoever held the old one is out, so every browser session of ``user``
    ends and every API token is revoked. Returns (sessions ended, tokens revoked)."""
    Signup(username=user.username, password=password)
    user.password_hash = security.hash_password(password)
    ended = end_all_sessions(session, user)
    tokens = user_tokens(session, user)
    for token in tokens:
        revoke_token(session, token)
    return ended, len(tokens)


def authenticate(session: Session, username: str, password: str) -> User:
    user = session.scalar(select(User).where(func.lower(User.username) == username.strip().lower()))
    if not security.verify_password(user.password_hash if user else None, password) or user is None:
        raise NotAuthenticated("wrong username or password", field="password")
    return user


def start_session(session: Session, user: User, days: int) -> tuple[str, WebSession]:
    """Returns the cookie value (shown to the browser only) and the stored session."""
    token = security.new_token()
    web = WebSession(
        token_hash=security.token_hash(token),
        csrf_token=security.new_token(),
        user_id=user.id,
        expires_at=utcnow() + timedelta(days=days),
    )
    session.add(web)
    session.flush()
    return token, web


def session_for_cookie(session: Session, cookie: str | None) -> WebSession | None:
    if not cookie:
        return None
    web = session.scalar(select(WebSession).where(WebSession.token_hash == security.token_hash(cookie)))
    if web is None or web.expires_at <= utcnow():
        return None
    return web


def end_session(session: Session, web: WebSession) -> None:
    session.delete(web)


def end_all_sessions(session: Session, user: User) -> int:
    """Sign out everywhere: every browser session of ``user`` ends."""
    result = session.execute(delete(WebSession).where(WebSession.user_id == user.id))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


VOLUNTEER = "volunteer"
ORGANIZER = "organizer"
# What a token of each scope can do, as the approval page, /account and the API's refusals state it.
SCOPES = {
    VOLUNTEER: "join experiments, report training metrics and read what your account can read",
    ORGANIZER: (
        "everything a volunteer token can, and create, edit, start, pause and finish experiments, upload their "
        "training text, roll them back and remove volunteers from them"
    ),
}


def issue_token(
    session: Session, user: User, name: str, scope: str = VOLUNTEER, expires_in_days: int | None = None
) -> tuple[str, ApiToken]:
    """A new API token for ``user`` (its value, shown once, and its row); ``scope`` is one of SCOPES. It expires
    after ``expires_in_days`` when given, and works until revoked otherwise."""
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}")
    value = security.new_token(security.API_TOKEN_PREFIX)
    token = ApiToken(
        user_id=user.id,
        name=name[:100] or "token",
        token_hash=security.token_hash(value),
        prefix=value[:8],
        scope=scope,
        expires_at=utcnow() + timedelta(days=expires_in_days) if expires_in_days else None,
    )
    session.add(token)
    session.flush()
    return value, token


def user_for_token(session: Session, value: str | None, address: str | None = None) -> tuple[User, ApiToken]:
    """The user and row of a valid bearer token; notes when (and from which ``address``) it was last used."""
    if not value:
        raise NotAuthenticated("missing bearer token: run `swarmhub login`")
    token = session.scalar(select(ApiToken).where(ApiToken.token_hash == security.token_hash(value)))
    if token is None or token.revoked_at is not None:
        raise NotAuthenticated("invalid or revoked token: run `swarmhub login` again")
    now = datetime.now(timezone.utc)
    if token.expires_at is not None and token.expires_at <= now:
        raise NotAuthenticated(
            f"this token expired on {token.expires_at:%Y-%m-%d %H:%M} UTC: run `swarmhub login` again"
        )
    address = (address or "")[:64] or None
    # Write at most once a minute (every worker request authenticates), or when the address changed.
    if (
        token.last_used_at is None
        or now - token.last_used_at > timedelta(minutes=1)
        or (address is not None and address != token.last_used_address)
    ):
        token.last_used_at = now
        token.last_used_address = address
    return token.user, token


def revoke_token(session: Session, token: ApiToken) -> None:
    if token.revoked_at is None:
        token.revoked_at = utcnow()


def user_tokens(session: Session, user: User) -> list[ApiToken]:
    stmt = select(ApiToken).where(ApiToken.user_id == user.id, ApiToken.revoked_at.is_(None))
    return list(session.scalars(stmt.order_by(ApiToken.created_at.desc())))
