"""JSON about volunteers: a volunteer's profile, and the open statistics export of every visible volunteer
(``/api/stats/volunteers.json`` and ``.csv``), which anyone may fetch, cache and mirror."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from swarmhub.server.community import exports, volunteers
from swarmhub.server.core.errors import documented
from swarmhub.server.http.deps import DB
from swarmhub.server.services import services

router = APIRouter(prefix="/api", tags=["volunteers"])


@router.get("/users/{username}", response_model=volunteers.VolunteerProfile, responses=documented(404))
def user_profile(username: str, session: DB) -> volunteers.VolunteerProfile:
    """A volunteer's public profile: the experiments they helped, with their verified samples and share of each,
    time online, device classes, and their verified samples over time. 404 for a name no one has and for a hidden
    profile alike."""
    return volunteers.profile(session, username)


@router.get(
    "/stats/volunteers.json",
    response_class=Response,
    responses={
        **exports.RESPONSES,
        200: {**exports.RESPONSES[200], "model": volunteers.VolunteerStats, "description": "Every visible volunteer"},
    },
)
def volunteer_stats_json(request: Request, session: DB) -> Response:
    """Every volunteer with a visible profile: username, verified samples, experiments helped. Gzipped when the
    client accepts it; regenerated at most every few minutes (per server process)."""
    return exports.serve(request, services(request.app).volunteer_stats.get(session, "json"))


@router.get(
    "/stats/volunteers.csv",
    response_class=Response,
    responses=exports.csv_responses("The same rows as the JSON, as CSV: username,verified_samples,experiments"),
)
def volunteer_stats_csv(request: Request, session: DB) -> Response:
    """The JSON export's rows as CSV (RFC 4180, a header row first)."""
    return exports.serve(request, services(request.app).volunteer_stats.get(session, "csv"))
