"""Teams: the open statistics export, every team as the standings and the team pages count it (the same queries,
:mod:`.standings` and :mod:`.per_experiment`), in JSON and CSV."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from swarmhub.server.community import exports
from swarmhub.server.models import TeamMember, utcnow
from swarmhub.server.teams.per_experiment import experiments_by_team
from swarmhub.server.teams.schemas import CSV_FIELDS, TeamStats, TeamStatsExperiment, TeamStatsRow
from swarmhub.server.teams.standings import public_verified, ranked, summary_of


def _members(session: Session, team_id: int | None = None) -> dict[int, list[Any]]:
    """Each team's members (or ``team_id``'s) with their verified samples, most verified first, then the longest
    in the team: (TeamMember, verified) rows by team id."""
    per_user = public_verified()
    verified = func.coalesce(per_user.c.verified, 0)
    query = (
        select(TeamMember, verified)
        .outerjoin(per_user, per_user.c.user_id == TeamMember.user_id)
        .order_by(TeamMember.team_id, verified.desc(), TeamMember.joined_at)
    )
    if team_id is not None:
        query = query.where(TeamMember.team_id == team_id)
    grouped: dict[int, list[Any]] = {}
    for member, member_verified in session.execute(query).all():
        grouped.setdefault(member.team_id, []).append((member, int(member_verified)))
    return grouped


def _named(rows: list[Any]) -> list[Any]:
    """The members anyone may see named: a member who hid their profile is counted, never named (their
    membership would tell that the account exists)."""
    return [(member, verified) for member, verified in rows if not member.user.profile_hidden]


def stats(session: Session) -> TeamStats:
    """The open statistics export: every team as the standings and the team pages count it (the same functions),
    with the members anyone may see named and the others counted, and its standing in each public experiment."""
    members = _members(session)
    experiments = experiments_by_team(session)
    rows = []
    for rank, row in enumerate(ranked(session, None, None, None), 1):
        team, listed = row.Team, members.get(row.Team.id, [])
        named = [member.user.username for member, _ in _named(listed)]
        summary = summary_of(rank, team, row.members, row.verified)
        rows.append(
            TeamStatsRow(
                rank=rank,
                name=team.name,
                founder=summary.founder,
                members=summary.members,
                member_names=named,
                hidden_members=len(listed) - len(named),
                verified_samples=summary.verified_samples,
                created_at=team.created_at,
                experiments=[
                    TeamStatsExperiment(slug=e.slug, verified_samples=e.verified_samples, share=e.share, rank=e.rank)
                    for e in experiments.get(team.id, [])
                ],
            )
        )
    return TeamStats(generated_at=utcnow(), teams=rows)


def stats_csv(data: TeamStats) -> str:
    def rows() -> Any:
        for team in data.teams:
            yield (team.name, "", team.rank, team.members, team.verified_samples, "")
            for e in team.experiments:
                yield (team.name, e.slug, e.rank, team.members, e.verified_samples, e.share)

    return exports.csv_text(CSV_FIELDS, rows())


def stats_bodies(session: Session) -> tuple[bytes, str]:
    """The export's JSON and CSV, from one read so that they agree."""
    data = stats(session)
    return data.model_dump_json().encode(), stats_csv(data)


# ---- changes (the caller's transaction; nothing here commits)
