"""JSON API under /api: parse, call a service, return."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError

from swarmhub.common.choice import JoinableExperiment
from swarmhub.common.protocol import (
    DenyListPublic,
    DeviceCode,
    ExperimentSummary,
    JoinRequest,
    JoinResponse,
    Me,
    SwarmToken,
    SwarmTokenRequest,
    TokenResponse,
)
from swarmhub.server import experiments, metrics
from swarmhub.server.accounts import device, quotas
from swarmhub.server.accounts import users as accounts
from swarmhub.server.core.errors import BadRequest, documented
from swarmhub.server.core.security import StoredText
from swarmhub.server.experiments.joining import check_running_worker
from swarmhub.server.http.deps import (
    DB,
    AppSettings,
    CurrentUser,
    OptionalUser,
    OrganizerUser,
    api_token,
    reconcile_after_commit,
)
from swarmhub.server.http.paging import NEXT_PAGE, link_next
from swarmhub.server.http.ratelimit import limited, limited_per_account
from swarmhub.server.live.snapshots import base_url, metrics_public
from swarmhub.server.metrics import swarm_view
from swarmhub.server.services import services

router = APIRouter(prefix="/api", tags=["api"], responses=documented(400, 401, 403, 404, 409, 429, 503))


DEVICE_CODE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
FORM = "application/x-www-form-urlencoded"
BodyModel = TypeVar("BodyModel", bound=BaseModel)


class DeviceCodeRequest(BaseModel):
    client_name: StoredText = Field(default="swarmhub CLI", max_length=100)
    scope: Literal["volunteer", "organizer"] = Field(
        default="volunteer", description="what the token will be able to do: volunteer (the default) or organizer"
    )


class DeviceTokenRequest(BaseModel):
    device_code: str = Field(max_length=200)
    grant_type: str = Field(default=DEVICE_CODE_GRANT, max_length=200, description="RFC 8628: the device-code grant")


def form_or_json(model: type[BodyModel]) -> Any:
    """A body of ``model`` read from JSON, as ``swarmhub login`` sends it, or from a form, as RFC 8628's clients
    do (sections 3.1 and 3.4: application/x-www-form-urlencoded). Errors are the same 422 as any body's."""

    async def parse(request: Request) -> BodyModel:
        data: Any
        if request.headers.get("content-type", "").split(";")[0].strip().lower() == FORM:
            data = dict((await request.form()).items())
        else:
            try:
                data = await request.json()
            except ValueError:
                error = {"type": "json_invalid", "loc": ("body",), "msg": "JSON decode error", "input": {}}
                raise RequestValidationError([error]) from None
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in exc.errors()]) from None

    return Depends(parse)


def form_or_json_openapi(model: type[BaseModel]) -> dict[str, Any]:
    """The request body and 422 of a :func:`form_or_json` route, which FastAPI cannot see in a dependency."""
    schema = model.model_json_schema()
    return {
        "requestBody": {
            "required": True,
            "content": {media: {"schema": schema} for media in ("application/json", FORM)},
        },
        "responses": {
            "422": {
                "description": "Validation Error",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/HTTPValidationError"}}},
            }
        },
    }


NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}  # RFC 6749 section 5.1: never cache a token


def no_store(response: Response) -> None:
    """Responses that carry a token (or a signed swarm token) are not to be cached by any client or proxy."""
    response.headers.update(NO_STORE)


class LoginRequest(accounts.Login):
    token_name: StoredText = Field(default="api", max_length=100)
    scope: Literal["volunteer", "organizer"] = Field(
        default="organizer", description="organizer (the default here, for scripts that run experiments) or volunteer"
    )
    expires_in_days: int | None = Field(default=None, ge=1, le=3650, description="None: until revoked")


class JoinBody(JoinRequest):
    """The worker's join request; the device name, and how its peer takes part as the worker reports it, are stored
    with the worker run."""

    device: StoredText = Field(default="cpu", max_length=32)
    client_version: StoredText = Field(default="", max_length=32)


@router.post(
    "/auth/device/code",
    response_model=DeviceCode,
    dependencies=[limited("token-issue")],
    openapi_extra=form_or_json_openapi(DeviceCodeRequest),
)
def device_code(
    body: Annotated[DeviceCodeRequest, form_or_json(DeviceCodeRequest)],
    request: Request,
    session: DB,
    settings: AppSettings,
) -> DeviceCode:
    return device.start(
        session,
        body.client_name,
        base_url(request, settings),
        settings.device_code_minutes,
        scope=body.scope,
        client_address=request.client.host if request.client else None,
    )


@router.post(
    "/auth/device/token",
    response_model=TokenResponse,
    responses={400: {"description": 'RFC 8628 / RFC 6749 error: {"error": "authorization_pending"} and the like'}},
    openapi_extra=form_or_json_openapi(DeviceTokenRequest),
    dependencies=[Depends(no_store)],
)
def device_token(
    body: Annotated[DeviceTokenRequest, form_or_json(DeviceTokenRequest)], session: DB
) -> TokenResponse | JSONResponse:
    if body.grant_type != DEVICE_CODE_GRANT:
        # RFC 6749 section 5.2: this endpoint grants tokens for device codes only
        return JSONResponse({"error": "unsupported_grant_type"}, status_code=400, headers=NO_STORE)
    result = device.poll(session, body.device_code)
    if isinstance(result, str):
        error: dict[str, str] = {"error": result}
        if result == "invalid_grant":  # with the wrong field named, as every 4xx of this API
            message = "unknown device_code: run `swarmhub login` again"
            error.update(error_description=message, detail=message, field="device_code")
        return JSONResponse(error, status_code=400, headers=NO_STORE)
    return result


@router.post("/auth/token", response_model=TokenResponse, dependencies=[limited("login"), Depends(no_store)])
def password_token(body: LoginRequest, session: DB) -> TokenResponse:
    """A token for scripts that hold a password (the CLI uses the device flow instead)."""
    user = accounts.authenticate(session, body.username, body.password)
    value, _ = accounts.issue_token(session, user, body.token_name, body.scope, body.expires_in_days)
    return TokenResponse(access_token=value, username=user.username, scope=body.scope)


@router.delete("/auth/token", status_code=204)
def revoke_current_token(session: DB, request: Request) -> Response:
    _, token = api_token(request, session)
    accounts.revoke_token(session, token)
    return Response(status_code=204)


@router.get("/me", response_model=Me)
def me(session: DB, request: Request) -> Me:
    user, token = api_token(request, session)
    return Me(username=user.username, is_admin=user.is_admin, scope=token.scope, expires_at=token.expires_at)


@router.get("/me/joinable", response_model=list[JoinableExperiment])
def joinable_experiments(session: DB, user: CurrentUser, settings: AppSettings) -> list[JoinableExperiment]:
    """The running experiments you may join (as the join route decides), most needed first: ``need`` is
    1 / (1 + peers online), peers online being the experiment's workers that reported within the active window;
    ties go to less throughput, then the name. What ``swarmhub join --any`` chooses from. (Under ``/me``: it
    depends on who asks, and ``/experiments/joinable`` would hide an experiment named "joinable".)"""
    return experiments.joinable(session, user, settings.active_window_seconds)


@router.get("/experiments", response_model=list[ExperimentSummary])
def list_experiments(session: DB, user: OptionalUser) -> list[ExperimentSummary]:
    return [experiments.to_public(e) for e in experiments.list_visible(session, user)]


@router.post("/experiments", response_model=experiments.ExperimentPublic, status_code=201)
def create_experiment(
    body: experiments.ExperimentCreate, session: DB, user: OrganizerUser, settings: AppSettings
) -> experiments.ExperimentPublic:
    quotas.check_create(session, settings, user)
    return experiments.to_public(experiments.create(session, user, body))


@router.get("/experiments/{slug}", response_model=experiments.ExperimentPublic)
def get_experiment(slug: str, session: DB, user: OptionalUser) -> experiments.ExperimentPublic:
    experiment = experiments.get_visible(session, slug, user)
    # The warning that names the fastest peer's rate is the organizer's, as on the experiment page.
    fastest = experiments.fastest_peer_rate(session, experiment) if experiments.can_manage(experiment, user) else 0.0
    return experiments.to_public(experiment, fastest)


@router.patch("/experiments/{slug}", response_model=experiments.ExperimentPublic)
def update_experiment(
    slug: str, body: experiments.ExperimentUpdate, session: DB, user: OrganizerUser, settings: AppSettings
) -> experiments.ExperimentPublic:
    experiment = experiments.get_managed(session, slug, user)
    quotas.check_update(session, settings, experiment, user, body)
    experiment = experiments.update(session, experiment, body)
    return experiments.to_public(experiment, experiments.fastest_peer_rate(session, experiment))


@router.post("/experiments/{slug}/status", response_model=experiments.ExperimentPublic)
def change_status(
    slug: str, body: experiments.StatusChange, session: DB, user: OrganizerUser, settings: AppSettings, request: Request
) -> experiments.ExperimentPublic:
    experiment = experiments.get_managed(session, slug, user)
    quotas.check_status_change(session, settings, experiment, user, body.action)
    experiment = experiments.change_status(session, experiment, body.action)
    reconcile_after_commit(request, session)
    return experiments.to_public(experiment)


def _bootstrap_addresses(request: Request, run_id: str, timeout: float) -> list[str]:
    services(request.app).coordinator.reconcile_soon()
    return services(request.app).addresses.wait(run_id, timeout)


SWARM_TOKEN_LIMITS = [Depends(no_store), limited_per_account("swarm-token")]


@router.post(
    "/experiments/{slug}/join", response_model=JoinResponse, dependencies=SWARM_TOKEN_LIMITS, responses=documented(426)
)
def join(
    slug: str, body: JoinBody, session: DB, user: CurrentUser, settings: AppSettings, request: Request
) -> JoinResponse:
    """The worker's configuration and a swarm token for its peer key. Refused: a key that is not RSA of at least
    2048 bits (400), a key another volunteer holds here (409), a new key while the volunteer already runs the
    experiment's ``max_peers_per_volunteer`` peers, or more than 60 swarm tokens asked for by one account in 10
    minutes (429, Retry-After). The worker run is stored under the peer ID derived from the key, with what the worker
    reports of how its peer takes part (precision, client_mode, role, bandwidth_mbps: optional, self-reported), for
    the organizer's swarm view."""
    experiment = experiments.get_visible(session, slug, user)
    return experiments.join(
        session,
        experiment,
        user,
        body,
        device=body.device,
        swarm_enabled=settings.swarm_enabled,
        token_minutes=settings.swarm_token_minutes,
        bootstrap_addresses=lambda run_id: _bootstrap_addresses(request, run_id, timeout=10),
    )


@router.post(
    "/experiments/{slug}/swarm-token",
    response_model=SwarmToken,
    dependencies=SWARM_TOKEN_LIMITS,
    responses=documented(426),
)
def refresh_swarm_token(
    slug: str, body: SwarmTokenRequest, session: DB, user: CurrentUser, settings: AppSettings, request: Request
) -> SwarmToken:
    """A fresh token for a peer key; refused once the experiment stops running. A key whose token is still valid
    is always renewed; a new one is refused as by the join (400, 409, 429), and the two routes share one budget of
    60 tokens per account in 10 minutes. A swarmhub worker older than the swarm's protocol needs (its User-Agent,
    ``swarmhub-worker/VERSION``) is refused as at join (426, ``field: User-Agent``): it joined before the hub was
    upgraded."""
    check_running_worker(request.headers.get("user-agent"))
    experiment = experiments.get_visible(session, slug, user)
    return experiments.swarm_token(
        session, experiment, user, body.peer_public_key, timedelta(minutes=settings.swarm_token_minutes)
    )


class BanRequest(BaseModel):
    username: StoredText = Field(min_length=1, max_length=32)


@router.post("/experiments/{slug}/bans", status_code=204)
def ban_volunteer(slug: str, body: BanRequest, session: DB, user: OrganizerUser, request: Request) -> Response:
    """Remove a volunteer from the experiment (organizer only)."""
    experiments.ban(session, experiments.get_managed(session, slug, user), body.username)
    reconcile_after_commit(request, session)  # the server's peer gets the new deny-list at once
    return Response(status_code=204)


@router.delete("/experiments/{slug}/bans/{username}", status_code=204)
def unban_volunteer(slug: str, username: StoredText, session: DB, user: OrganizerUser, request: Request) -> Response:
    experiments.unban(session, experiments.get_managed(session, slug, user), username)
    reconcile_after_commit(request, session)
    return Response(status_code=204)


@router.get("/experiments/{slug}/swarm", response_model=swarm_view.SwarmView)
def swarm_peers(
    slug: str, session: DB, user: OrganizerUser, settings: AppSettings, request: Request
) -> swarm_view.SwarmView:
    """The peers now in the swarm (read by the monitor within the active window), each with its volunteer, rates,
    newest witnessed round and flags, and the state of the server's own peers for it (organizer and administrators
    only: it names every volunteer's peers)."""
    experiment = experiments.get_managed(session, slug, user)
    states = services(request.app).coordinator.peer_states(session, experiments.run_id(experiment))
    return swarm_view.view(session, experiment, settings.active_window_seconds, states)


@router.get("/experiments/{slug}/denylist", response_model=DenyListPublic, responses=documented(426))
def denylist(slug: str, session: DB, user: CurrentUser, request: Request) -> DenyListPublic:
    """Whom the swarm's peers must refuse; polled by every worker (every 5 s). A swarmhub worker too old for the
    swarm's protocol is refused as at join (426, ``field: User-Agent``): it stops within a poll of a hub upgrade."""
    check_running_worker(request.headers.get("user-agent"))
    experiment = experiments.get_visible(session, slug, user)
    return DenyListPublic(usernames=experiments.banned_usernames(session, experiment))


@router.get(
    "/experiments/{slug}/leaderboard",
    response_model=list[metrics.LeaderboardEntry],
    responses=NEXT_PAGE,
)
def leaderboard(
    slug: str,
    session: DB,
    user: OptionalUser,
    settings: AppSettings,
    request: Request,
    response: Response,
    limit: Annotated[int, Query(ge=1, le=metrics.LEADERBOARD_MAX_LIMIT)] = metrics.LEADERBOARD_LIMIT,
    offset: Annotated[
        int, Query(ge=0, le=2**31 - 1, description=f"At most {metrics.LEADERBOARD_MAX_OFFSET:,}; page deeper by cursor")
    ] = 0,
    cursor: Annotated[str | None, Query(max_length=200, description="The Next-Cursor of the previous page")] = None,
) -> list[metrics.LeaderboardEntry]:
    """One page of the leaderboard; ``rank`` is the place on the whole board. Page on with the ``Next-Cursor``
    header (a page's cost stays the page's however deep); ``offset`` goes up to 10,000, at a cost that grows with
    it."""
    after = metrics.Cursor.decode(cursor) if cursor is not None else None
    if after is not None and offset:
        raise BadRequest("give cursor or offset, not both", field="offset")
    if offset > metrics.LEADERBOARD_MAX_OFFSET:
        raise BadRequest(
            f"offsets stop at {metrics.LEADERBOARD_MAX_OFFSET:,}: page deeper with the cursor in each page's "
            "Next-Cursor header (?cursor=)",
            field="offset",
        )
    experiment = experiments.get_visible(session, slug, user)
    with_flags = user is not None and experiments.can_manage(experiment, user)
    page = metrics.leaderboard_page(
        session,
        experiment,
        settings.active_window_seconds,
        with_flags=with_flags,
        limit=limit,
        offset=offset,
        after=after,
    )
    link_next(request, response, limit, page.next_cursor)
    return page.entries


@router.get("/experiments/{slug}/metrics", response_model=metrics.MetricsPublic)
def experiment_metrics(slug: str, session: DB, user: OptionalUser, request: Request) -> metrics.MetricsPublic:
    experiment = experiments.get_visible(session, slug, user)
    return metrics_public(session, experiment, request.app)
