"""Teams: the shapes of what the API and the pages show, and the rules of a name (see the package)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Generic, NamedTuple, TypeVar
from urllib.parse import quote

from pydantic import BaseModel, Field, TypeAdapter, field_validator

from swarmhub.server.accounts.users import USERNAME_RE
from swarmhub.server.core import cursors
from swarmhub.server.core.security import StoredText

NAME_MAX = 32
DESCRIPTION_MAX = 500
TEAMS_LIMIT = 100  # teams on a page of the standings unless asked otherwise
TEAMS_MAX_LIMIT = 500
MEMBERS_LIMIT = 100  # members on a page of a team's members unless asked otherwise
MEMBERS_MAX_LIMIT = 500
TEAM_EXPERIMENTS_LIMIT = 100  # experiments on a page of a team's experiments unless asked otherwise
TEAM_EXPERIMENTS_MAX_LIMIT = 500


def team_path(name: str) -> str:
    return f"/teams/{quote(name, safe='')}"


class TeamName(BaseModel):
    """A team's name as it is chosen: at creation and when renamed."""

    name: str = Field(min_length=2, max_length=NAME_MAX, description="2-32 letters, digits, '-' or '_'")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not USERNAME_RE.match(value):
            raise ValueError("use 2-32 letters, digits, '-' or '_', starting with a letter or digit")
        return value


class TeamCreate(TeamName):
    description: StoredText = Field(default="", max_length=DESCRIPTION_MAX, description="Plain text")

    @field_validator("description")
    @classmethod
    def _description(cls, value: str) -> str:
        return value.strip()


class MemberAction(BaseModel):
    username: StoredText = Field(min_length=1, max_length=32)


class TeamSummary(BaseModel):
    rank: int = Field(description="Place among all teams by verified samples")
    name: str
    url: str = Field(description="The team's page")
    description: str
    founder: str | None
    members: int
    verified_samples: int = Field(description="Of its current members, over every experiment anyone may see")
    created_at: datetime


class TeamMemberPublic(BaseModel):
    username: str
    role: str = Field(description="member or admin")
    founder: bool
    joined_at: datetime
    verified_samples: int = Field(description="Over every experiment anyone may see")
    profile_url: str


class TeamExperiment(BaseModel):
    slug: str
    title: str
    url: str
    verified_samples: int = Field(description="Of the team's current members in this experiment")
    share: float = Field(description="Fraction of the experiment's verified samples")
    rank: int = Field(description="The team's place among the teams in this experiment")


class TeamPublic(TeamSummary):
    member_list: list[TeamMemberPublic] = Field(
        description="A page of the members with a visible profile, most verified first (then the longest in the "
        "team): at most members_limit of them"
    )
    members_next_cursor: str | None = Field(
        default=None,
        description="Pass as ?members_cursor= here, or as ?cursor= to /api/teams/{name}/members, for the next page "
        "of members; null on the last page",
    )
    hidden_members: int = Field(description="Members who hid their profile: counted, not named")
    experiments: list[TeamExperiment] = Field(
        description="A page of the public experiments the team's members helped, most verified first (then by slug): "
        "at most experiments_limit of them"
    )
    experiments_next_cursor: str | None = Field(
        default=None,
        description="Pass as ?experiments_cursor= here, or as ?cursor= to /api/teams/{name}/experiments, for the "
        "next page of experiments; null on the last page",
    )
    experiments_total: int = Field(description="Public experiments the team's members helped, listed or not")


class ExperimentTeamRow(BaseModel):
    rank: int
    name: str
    url: str
    verified_samples: int = Field(description="Of the team's current members in this experiment")
    contributors: int = Field(description="Members with verified samples in this experiment")
    share: float = Field(description="Fraction of the experiment's verified samples")


class TeamCursor(NamedTuple):
    """A row of the standings (its rank and sort key): a page starts after it, or ends before it. Clients get it
    as opaque text (base64 of the JSON array) and only hand it back."""

    rank: Annotated[int, Field(ge=1, le=2**62)]
    verified: Annotated[int, Field(ge=0, le=2**62)]
    sort_name: Annotated[StoredText, Field(max_length=NAME_MAX)]
    team_id: Annotated[int, Field(ge=0, le=2**62)]

    def encode(self) -> str:
        return cursors.encode(_CURSOR, self)

    @staticmethod
    def decode(text: str, field: str = "cursor") -> TeamCursor:
        """The cursor a page returned; a 400 naming ``field`` for anything else."""
        return cursors.decode(_CURSOR, text, field, "not a cursor these standings returned")


_CURSOR = TypeAdapter(TeamCursor)


class MemberCursor(NamedTuple):
    """A row of a team's member list (its sort key): the next page starts after it. Opaque to clients, as
    :class:`TeamCursor`."""

    verified: Annotated[int, Field(ge=0, le=2**62)]
    joined_at: datetime
    user_id: Annotated[int, Field(ge=0, le=2**62)]

    def encode(self) -> str:
        return cursors.encode(_MEMBER_CURSOR, self)

    @staticmethod
    def decode(text: str, field: str = "members_cursor") -> MemberCursor:
        """The cursor a team's page returned; a 400 naming ``field`` for anything else."""
        return cursors.decode(_MEMBER_CURSOR, text, field, "not a cursor this team's member list returned")


_MEMBER_CURSOR = TypeAdapter(MemberCursor)


class TeamExperimentCursor(NamedTuple):
    """A row of a team's experiments (its sort key): the next page starts after it. Opaque to clients."""

    verified: Annotated[int, Field(ge=0, le=2**62)]
    slug: Annotated[StoredText, Field(max_length=50)]

    def encode(self) -> str:
        return cursors.encode(_TEAM_EXPERIMENT_CURSOR, self)

    @staticmethod
    def decode(text: str, field: str = "experiments_cursor") -> TeamExperimentCursor:
        """The cursor a page of the team's experiments returned; a 400 naming ``field`` for anything else."""
        return cursors.decode(_TEAM_EXPERIMENT_CURSOR, text, field, "not a cursor this team's experiments returned")


_TEAM_EXPERIMENT_CURSOR = TypeAdapter(TeamExperimentCursor)


class ExperimentTeamCursor(NamedTuple):
    """A row of an experiment's teams (its rank and sort key): the next page starts after it. Opaque to clients."""

    rank: Annotated[int, Field(ge=1, le=2**62)]
    verified: Annotated[int, Field(ge=0, le=2**62)]
    sort_name: Annotated[StoredText, Field(max_length=NAME_MAX)]
    team_id: Annotated[int, Field(ge=0, le=2**62)]

    def encode(self) -> str:
        return cursors.encode(_EXPERIMENT_TEAM_CURSOR, self)

    @staticmethod
    def decode(text: str, field: str = "cursor") -> ExperimentTeamCursor:
        """The cursor a page of the experiment's teams returned; a 400 naming ``field`` for anything else."""
        return cursors.decode(_EXPERIMENT_TEAM_CURSOR, text, field, "not a cursor this experiment's teams returned")


_EXPERIMENT_TEAM_CURSOR = TypeAdapter(ExperimentTeamCursor)

T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    """A page of a list by cursor, as the leaderboard's: its rows, and the cursor of the next page (None on the
    last). The API serves ``entries`` as the body and ``next_cursor`` as the ``Next-Cursor`` header."""

    entries: list[T]
    next_cursor: str | None


class TeamPage(BaseModel):
    entries: list[TeamSummary]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null on the last page")
    prev_cursor: str | None = Field(description="Pass as ?before= for the previous page; null on the first page")


class TeamStatsExperiment(BaseModel):
    slug: str
    verified_samples: int = Field(description="Of the team's current members in this experiment")
    share: float = Field(description="Fraction of the experiment's verified samples")
    rank: int = Field(description="The team's place among the teams in this experiment")


class TeamStatsRow(BaseModel):
    rank: int = Field(description="Place among all teams by verified samples")
    name: str
    founder: str | None = Field(description="Null when the founder hid their profile")
    members: int
    member_names: list[str] = Field(description="Members with a visible profile, most verified first")
    hidden_members: int = Field(description="Members who hid their profile: counted, not named")
    verified_samples: int = Field(description="Of its current members, over every experiment anyone may see")
    created_at: datetime
    experiments: list[TeamStatsExperiment] = Field(description="Per experiment anyone may see, most verified first")


class TeamStats(BaseModel):
    generated_at: datetime
    teams: list[TeamStatsRow] = Field(description="Every team, in the standings' order")


# The CSV is long: a team's hub-wide row (experiment empty), then a row per experiment it helped.
CSV_FIELDS = ("team", "experiment", "rank", "members", "verified_samples", "share")


class Membership(BaseModel):
    team: str | None = Field(description="The team the caller is in now; null when none")
    role: str | None


# ---- reads
