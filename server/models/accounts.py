"""Accounts: users, their browser sessions and API tokens, and device logins in progress."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Index, Integer, String, false, func, text
from sqlalchemy.orm import Mapped, mapped_column, relationship

from swarmhub.server.models.base import Base, UTCDateTime, utcnow


class User(Base):
    __tablename__ = "users"
    # unique whatever the case, in the database itself (migration 0016)
    __table_args__ = (Index("uq_users_username_lower", func.lower(text("username")), unique=True),)

    id: Mapped[int] = mapped_column(primary_key=True)
    username: Mapped[str] = mapped_column(String(32), unique=True)
    password_hash: Mapped[str] = mapped_column(String(255))
    is_admin: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # The volunteer hid their public page (/u/{username}); leaderboards still count their work, without a link.
    # The database's default only: an insert that does not name it (rows written as of an older revision) works.
    profile_hidden: Mapped[bool] = mapped_column(server_default=false())


class WebSession(Base):
    """A browser login. Only the SHA-256 of the cookie value is stored; logout deletes the row."""

    __tablename__ = "web_sessions"

    id: Mapped[int] = mapped_column(primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    csrf_token: Mapped[str] = mapped_column(String(64))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)

    user: Mapped[User] = relationship(lazy="joined")


class ApiToken(Base):
    """A CLI bearer token. Only its SHA-256 is stored; the value is shown once."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(12))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # "volunteer" (join, report, read) or "organizer" (also create and run experiments): accounts.SCOPES
    scope: Mapped[str] = mapped_column(String(16), server_default="organizer")
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)  # None: until revoked
    last_used_address: Mapped[str | None] = mapped_column(String(64))  # the client address of that last use

    user: Mapped[User] = relationship(lazy="joined")


class DeviceAuthorization(Base):
    """RFC 8628 device authorization grant in progress."""

    __tablename__ = "device_authorizations"

    id: Mapped[int] = mapped_column(primary_key=True)
    device_code_hash: Mapped[str] = mapped_column(String(64), unique=True)
    user_code: Mapped[str] = mapped_column(String(9), unique=True)
    client_name: Mapped[str] = mapped_column(String(100))
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending/approved/denied/consumed
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    interval: Mapped[int] = mapped_column(Integer, default=5)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_polled_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    scope: Mapped[str] = mapped_column(String(16), server_default="volunteer")  # what the token will be able to do
    client_address: Mapped[str | None] = mapped_column(String(64))  # the address that asked, for the approval page
    token_days: Mapped[int | None] = mapped_column(Integer)  # the approver's choice of lifetime; None: until revoked

    user: Mapped[User | None] = relationship(lazy="joined")
