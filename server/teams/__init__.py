"""Teams: volunteers who add up their verified samples under one name (``/teams``, ``/teams/{name}`` and their
JSON under ``/api/teams``), as BOINC and Folding@home volunteers know them.

Rules:
- A volunteer belongs to at most one team at a time (``team_members.user_id`` is the primary key). Creating a team
  makes its creator the founder and an admin member; anyone signed in may join an open team.
- The founder and the team's admins may remove members and promote members to admin; only the founder may remove
  an admin; no one removes the founder (the founder leaves). Acting on someone not in this team is a 404.
- When the founder leaves, the oldest admin (by joining time), else the oldest member, becomes founder. The last
  member to leave deletes the team: an empty team would only hold its name.
- Team names follow the username rules (``accounts.USERNAME_RE``: 2-32 letters, digits, '-', '_'), are unique
  whatever the case, and the name is the team's address. Descriptions are plain text of at most 500 characters.

Credit: a team's figures are the sums of its **current** members' verified samples (``VolunteerTotal``, kept by
the ledger). A member's whole verified contribution counts for the team they are in now, including work done
before they joined; it leaves with them. Only experiments anyone may see (not drafts) count on ``/teams``.
A member who hid their profile is counted but not named, here, on the pages and in the open statistics export
(``/api/stats/teams.{json,csv}``).

Moderation: a hub administrator (``User.is_admin``) may rename any team and remove any team; the founder may rename
their own team too (the name is the team's, and the founder answers for it), the team's admins may not. A new name
passes the rules of a name at creation. Removing a team deletes its memberships and the team, nothing else: the
volunteers' verified samples are the ledger's and stay theirs.

Paging: every list is served in pages by cursor, as the leaderboard's (``limit``, ``cursor``, the ``Next-Cursor``
header), bounded by default: the standings (at most ``TEAMS_MAX_LIMIT`` teams a page; a page's first row also leads
to the previous one), a team's named members (``MEMBERS_MAX_LIMIT``), the experiments a team helped
(``TEAM_EXPERIMENTS_MAX_LIMIT``) and an experiment's teams (``TEAMS_MAX_LIMIT``). A team's own page holds the first
page of its members and of its experiments with the cursors of the next (:class:`Page`), and reads only that team's
rows (its rank is one count), and for its ranks per experiment the teams of the experiments on the page.
"""

from __future__ import annotations

from swarmhub.server.teams.export import stats, stats_bodies, stats_csv
from swarmhub.server.teams.membership import (
    can_manage,
    can_remove,
    can_rename,
    check_rename,
    create,
    join,
    leave,
    promote,
    remove_member,
    remove_team,
    rename,
)
from swarmhub.server.teams.per_experiment import experiment_standings_page, team_experiments_page
from swarmhub.server.teams.schemas import (
    CSV_FIELDS,
    DESCRIPTION_MAX,
    MEMBERS_LIMIT,
    MEMBERS_MAX_LIMIT,
    NAME_MAX,
    TEAM_EXPERIMENTS_LIMIT,
    TEAM_EXPERIMENTS_MAX_LIMIT,
    TEAMS_LIMIT,
    TEAMS_MAX_LIMIT,
    ExperimentTeamCursor,
    ExperimentTeamRow,
    MemberAction,
    MemberCursor,
    Membership,
    Page,
    TeamCreate,
    TeamCursor,
    TeamExperiment,
    TeamExperimentCursor,
    TeamMemberPublic,
    TeamName,
    TeamPage,
    TeamPublic,
    TeamStats,
    TeamStatsExperiment,
    TeamStatsRow,
    TeamSummary,
    team_path,
)
from swarmhub.server.teams.standings import (
    detail,
    get,
    members_page,
    membership,
    standings,
    standings_page,
    team_of,
)

__all__ = [
    "NAME_MAX",
    "DESCRIPTION_MAX",
    "TEAMS_LIMIT",
    "TEAMS_MAX_LIMIT",
    "MEMBERS_LIMIT",
    "MEMBERS_MAX_LIMIT",
    "TEAM_EXPERIMENTS_LIMIT",
    "TEAM_EXPERIMENTS_MAX_LIMIT",
    "MemberCursor",
    "TeamExperimentCursor",
    "ExperimentTeamCursor",
    "Page",
    "team_path",
    "TeamName",
    "TeamCreate",
    "MemberAction",
    "TeamSummary",
    "TeamMemberPublic",
    "TeamExperiment",
    "TeamPublic",
    "ExperimentTeamRow",
    "TeamCursor",
    "TeamPage",
    "TeamStatsExperiment",
    "TeamStatsRow",
    "TeamStats",
    "CSV_FIELDS",
    "Membership",
    "get",
    "membership",
    "team_of",
    "standings",
    "standings_page",
    "detail",
    "members_page",
    "team_experiments_page",
    "experiment_standings_page",
    "stats",
    "stats_csv",
    "stats_bodies",
    "create",
    "join",
    "leave",
    "remove_member",
    "promote",
    "can_manage",
    "can_rename",
    "check_rename",
    "can_remove",
    "rename",
    "remove_team",
]
