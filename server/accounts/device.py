"""RFC 8628 device authorization grant: how `swarmhub login` gets a token without a password prompt."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from swarmhub.common.protocol import DeviceCode, TokenResponse
from swarmhub.server.accounts import users as accounts
from swarmhub.server.core import security
from swarmhub.server.core.errors import NotFound
from swarmhub.server.models import DeviceAuthorization, User, utcnow

POLL_INTERVAL = 5


def start(
    session: Session,
    client_name: str,
    base_url: str,
    minutes: int,
    *,
    scope: str = accounts.VOLUNTEER,
    client_address: str | None = None,
) -> DeviceCode:
    """A new grant for the token ``scope`` asks for (shown on the approval page with the asking address)."""
    device_code = security.new_token()
    user_code = security.new_user_code()
    while session.scalar(select(DeviceAuthorization.id).where(DeviceAuthorization.user_code == user_code)):
        user_code = security.new_user_code()
    session.add(
        DeviceAuthorization(
            device_code_hash=security.token_hash(device_code),
            user_code=user_code,
            client_name=client_name[:100] or "swarmhub CLI",
            interval=POLL_INTERVAL,
            expires_at=utcnow() + timedelta(minutes=minutes),
            scope=scope,
            client_address=(client_address or "")[:64] or None,
        )
    )
    session.flush()
    uri = f"{base_url.rstrip('/')}/device"
    return DeviceCode(
        device_code=device_code,
        user_code=user_code,
        verification_uri=uri,
        verification_uri_complete=f"{uri}?user_code={user_code}",
        expires_in=minutes * 60,
        interval=POLL_INTERVAL,
    )


def pending(session: Session, user_code: str) -> DeviceAuthorization:
    grant = session.scalar(
        select(DeviceAuthorization).where(DeviceAuthorization.user_code == security.normalize_user_code(user_code))
    )
    if grant is None or grant.status != "pending" or grant.expires_at <= utcnow():
        raise NotFound("that code is unknown or has expired: run `swarmhub login` again", field="user_code")
    return grant


def decide(
    session: Session, user_code: str, user: User, approve: bool, token_days: int | None = None
) -> DeviceAuthorization:
    """The approver's answer; an approved device's token works for ``token_days`` (until revoked: None)."""
    grant = pending(session, user_code)
    grant.status = "approved" if approve else "denied"
    grant.user_id = user.id
    grant.token_days = token_days if approve else None
    return grant


def poll(session: Session, device_code: str) -> TokenResponse | str:
    """The token, or one of the RFC's error codes. Errors are returned, not raised, so that the
    poll time is committed (it drives ``slow_down``)."""
    grant = session.scalar(
        select(DeviceAuthorization).where(DeviceAuthorization.device_code_hash == security.token_hash(device_code))
    )
    if grant is None:
        return "invalid_grant"  # RFC 8628 section 3.5 / RFC 6749 section 5.2: a code this server never issued
    now = utcnow()
    if grant.expires_at <= now or grant.status == "consumed":
        return "expired_token"
    if grant.status == "denied":
        return "access_denied"
    too_fast = grant.last_polled_at is not None and now - grant.last_polled_at < timedelta(seconds=grant.interval - 1)
    grant.last_polled_at = now
    if grant.status == "pending":
        if too_fast:
            grant.interval += 5  # RFC 8628 section 3.5: for this and every later request of this client
            return "slow_down"
        return "authorization_pending"
    assert grant.user is not None
    value, _ = accounts.issue_token(session, grant.user, grant.client_name, grant.scope, grant.token_days)
    grant.status = "consumed"  # a device code yields one token, once
    scope: Literal["volunteer", "organizer"] = "organizer" if grant.scope == accounts.ORGANIZER else "volunteer"
    return TokenResponse(access_token=value, username=grant.user.username, scope=scope)
