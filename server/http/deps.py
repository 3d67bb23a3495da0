"""Request dependencies: the one transaction per request, who is asking, and CSRF checks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from swarmhub.server.accounts import users as accounts
from swarmhub.server.core import security
from swarmhub.server.core.errors import Forbidden, NotAuthenticated
from swarmhub.server.core.settings import Settings
from swarmhub.server.models import ApiToken, User, WebSession
from swarmhub.server.services import services

SESSION_COOKIE = "swarmhub_session"
CSRF_COOKIE = "swarmhub_csrf"


def get_settings(request: Request) -> Settings:
    return services(request.app).settings


def get_session(request: Request) -> Iterator[Session]:
    """The request's unit of work: committed once when the route returns, rolled back on any error. What a route
    registered with :func:`after_commit` runs once the commit is done, and never after a rollback."""
    with services(request.app).sessionmaker() as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.info.pop(AFTER_COMMIT, None)
            session.rollback()
            raise
        for action in session.info.pop(AFTER_COMMIT, []):
            action()


AFTER_COMMIT = "swarmhub.after_commit"


def after_commit(session: Session, action: Callable[[], object]) -> None:
    """Run ``action`` once ``session`` (a request's unit of work) has committed: a side effect that reads what the
    request wrote (the swarm's reconcile, for one) must not run before it is there."""
    session.info.setdefault(AFTER_COMMIT, []).append(action)


def reconcile_after_commit(request: Request, session: Session) -> None:
    """The swarm's reconcile (start, stop, deny-list, rollback), woken once this request's changes are committed."""
    after_commit(session, services(request.app).coordinator.reconcile_soon)


# scope="function": commit before the response is sent. With FastAPI's default ("request") the commit ran
# after the client already had its answer: a redirect after login could arrive before the session row
# existed, and a failed commit could follow a 201.
DB = Annotated[Session, Depends(get_session, scope="function")]
AppSettings = Annotated[Settings, Depends(get_settings)]


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def _address(request: Request) -> str | None:
    return request.client.host if request.client else None


def api_token(request: Request, session: DB) -> tuple[User, ApiToken]:
    return accounts.user_for_token(session, _bearer(request), _address(request))


def api_user(auth: Annotated[tuple[User, ApiToken], Depends(api_token)]) -> User:
    return auth[0]


def organizer_api_user(auth: Annotated[tuple[User, ApiToken], Depends(api_token)]) -> User:
    """The token's user, when the token is an organizer token; 403 naming the scope otherwise."""
    user, token = auth
    if token.scope != accounts.ORGANIZER:
        raise Forbidden(
            "this is a volunteer token (it can join, report and read): creating and running experiments needs an "
            "organizer token; run `swarmhub login --scope organizer`",
            field="scope",
        )
    return user


def optional_api_user(request: Request, session: DB) -> User | None:
    """Public reads accept an optional token, or else the signed-in browser's session cookie (the pages' own
    fetches send it): either reveals what the caller may see (their drafts, an organizer's flags). Only reads use
    this: every API route that changes something needs a token, so a cookie never authorizes a change (no
    cross-site request forgery through the API), and no cross-origin page can read the answer (no CORS)."""
    if _bearer(request):
        return accounts.user_for_token(session, _bearer(request), _address(request))[0]
    web = accounts.session_for_cookie(session, request.cookies.get(SESSION_COOKIE))
    return web.user if web is not None else None


def web_session(request: Request, session: DB) -> WebSession | None:
    return accounts.session_for_cookie(session, request.cookies.get(SESSION_COOKIE))


def page_user(web: Annotated[WebSession | None, Depends(web_session)]) -> User | None:
    return web.user if web else None


def require_page_user(request: Request, web: Annotated[WebSession | None, Depends(web_session)]) -> User:
    if web is None:
        raise LoginRequired(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
    return web.user


class LoginRequired(NotAuthenticated):
    """Rendered as a redirect to the login page that comes back here afterwards."""

    def __init__(self, next_path: str):
        super().__init__("log in first")
        self.next_path = next_path


def csrf_token_for(request: Request, web: WebSession | None) -> str:
    """The token to embed in forms: the session's own, or the pre-login cookie's (double submit)."""
    if web is not None:
        return web.csrf_token
    token = request.cookies.get(CSRF_COOKIE) or getattr(request.state, "new_csrf", None)
    if not token:
        token = security.new_token()
        request.state.new_csrf = token  # set as a cookie by the page renderer
    return token


async def check_csrf(request: Request, web: Annotated[WebSession | None, Depends(web_session)]) -> None:
    form = await request.form()
    sent = form.get("csrf_token")
    expected = web.csrf_token if web is not None else request.cookies.get(CSRF_COOKIE)
    if not isinstance(sent, str) or not security.same(sent, expected):
        raise Forbidden("the form expired or came from another site: reload the page and try again")


CurrentUser = Annotated[User, Depends(api_user)]
OrganizerUser = Annotated[User, Depends(organizer_api_user)]  # routes that change experiments
OptionalUser = Annotated[User | None, Depends(optional_api_user)]
PageUser = Annotated[User | None, Depends(page_user)]
RequiredPageUser = Annotated[User, Depends(require_page_user)]
CSRF = Depends(check_csrf)
