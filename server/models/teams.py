"""Teams: volunteers who add up their verified samples under one name, and who belongs to which (one team at a
time, per volunteer)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Index, String, func, text
from sqlalchemy.orm import Mapped, mapped_column, relationship

from swarmhub.server.models.accounts import User
from swarmhub.server.models.base import Base, UTCDateTime, utcnow

MEMBER = "member"
ADMIN = "admin"  # may remove members and promote them to admin; the founder may also remove admins


class Team(Base):
    """A team; its name is also its address (``/teams/{name}``), unique whatever the case, as usernames are."""

    __tablename__ = "teams"
    __table_args__ = (Index("uq_teams_name_lower", func.lower(text("name")), unique=True),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(32), unique=True)
    description: Mapped[str] = mapped_column(String(500), default="")
    # The founder: passes to the oldest admin (else the oldest member) when they leave. NULL only while the
    # founder's account is being deleted.
    founder_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    # Who created it, for the per-account creation quota; never passes on.
    creator_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    founder: Mapped[User | None] = relationship(foreign_keys=[founder_id], lazy="joined")


class TeamFounding(Base):
    """One team founded by an account, kept when the team itself is deleted (by its last member leaving, or by an
    administrator): the per-account creation quota counts these, so founding, leaving and founding again is no way
    around it."""

    __tablename__ = "team_foundings"

    id: Mapped[int] = mapped_column(primary_key=True)
    creator_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class TeamMember(Base):
    """A volunteer's membership: ``user_id`` is the primary key, so the database itself keeps a volunteer in at
    most one team at a time."""

    __tablename__ = "team_members"

    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    role: Mapped[str] = mapped_column(String(16), default=MEMBER)
    joined_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    user: Mapped[User] = relationship(lazy="joined")
