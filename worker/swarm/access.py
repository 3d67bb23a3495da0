"""Who may enter an experiment's swarm: signed access tokens, peer identities, and the DHT authorizer.

Each experiment has its own RSA-2048 signing key, kept by the server. When a volunteer joins, the server
signs an access token that binds the experiment (its hivemind ``run_id``), the volunteer's username, the
public key of their peer and an expiry (the bytes and keys are defined in ``swarm_tokens``, which the server
uses without loading hivemind; its names are re-exported here). Every peer (workers and the server's own)
checks the token of every DHT request and answer: valid, its user not removed, and the key it binds is the one
that the libp2p connection it came on was authenticated with (``dht_auth``; hivemind's own protocol signs each
request and answer instead, at two RSA signatures a request).

A peer's identity key is one RSA key per user and experiment, stored on the volunteer's machine in
libp2p's key format: hivemind derives the peer ID from it, the token binds its public key, and the
peer's signed progress records use it too, so work in the swarm is attributable to a volunteer.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pydantic.v1
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.schema import BytesWithPublicKey, SchemaValidator
from hivemind.dht.validation import RecordValidatorBase
from hivemind.p2p.p2p_daemon_bindings.datastructures import PeerID
from hivemind.proto import crypto_pb2
from hivemind.proto.auth_pb2 import AccessToken
from hivemind.utils.auth import TokenAuthorizerBase
from hivemind.utils.crypto import RSAPrivateKey

from swarmhub.common import tokens as swarm_tokens
from swarmhub.common.tokens import REFRESH_MARGIN as REFRESH_MARGIN
from swarmhub.common.tokens import SERVER_PEER_USERNAME as SERVER_PEER_USERNAME
from swarmhub.common.tokens import TOKEN_VERSION as TOKEN_VERSION
from swarmhub.common.tokens import PublicKey as PublicKey
from swarmhub.common.tokens import Signer, TokenFields, Verifier
from swarmhub.common.tokens import SigningKey as SigningKey
from swarmhub.common.tokens import VerifiedTokens as VerifiedTokens
from swarmhub.common.tokens import format_expiry as format_expiry
from swarmhub.common.tokens import new_signing_key_der as new_signing_key_der
from swarmhub.common.tokens import parse_expiry as parse_expiry
from swarmhub.common.tokens import peer_id_for_public_key as peer_id_for_public_key
from swarmhub.common.tokens import public_key_from_text as public_key_from_text
from swarmhub.common.tokens import public_key_text as public_key_text
from swarmhub.common.tokens import signing_key_from_text as signing_key_from_text
from swarmhub.common.tokens import token_payload as token_payload
from swarmhub.common.tokens import token_to_wire as token_to_wire
from swarmhub.common.tokens import verify_token as verify_token
from swarmhub.worker.swarm import dht_auth
from swarmhub.worker.swarm.deny_list import DENY_POLL_SECONDS as DENY_POLL_SECONDS
from swarmhub.worker.swarm.deny_list import DenyList as DenyList

logger = logging.getLogger(__name__)


def to_access_token(token: TokenFields) -> AccessToken:
    return AccessToken(
        username=token.username,
        public_key=token.public_key,
        expiration_time=token.expiration_time,
        signature=token.signature,
    )


def sign_token(signing_key: Signer, run_id: str, username: str, public_key: bytes, lifetime: timedelta) -> AccessToken:
    """``swarm_tokens.sign_token`` as the hivemind message that ``SwarmAuthorizer`` hands to its peers."""
    return to_access_token(swarm_tokens.sign_token(signing_key, run_id, username, public_key, lifetime))


def token_from_wire(data: dict[str, str]) -> AccessToken:
    return AccessToken(
        username=data["username"],
        public_key=data["public_key"].encode(),
        expiration_time=data["expiration_time"],
        signature=data["signature"].encode(),
    )


# -- peer identities ---------------------------------------------------------------------------------------


def private_key_from_der(der: bytes) -> RSAPrivateKey:
    key = RSAPrivateKey.__new__(RSAPrivateKey)
    key.__setstate__({"_private_key": der})  # hivemind's own (pickle) path for loading a DER key
    return key


def load_or_create_identity(path: Path) -> RSAPrivateKey:
    """The peer's RSA key, in libp2p's format so that ``hivemind.DHT(identity_path=...)`` uses it too."""
    if path.exists():
        der = crypto_pb2.PrivateKey.FromString(path.read_bytes()).data
        return private_key_from_der(der)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = RSAPrivateKey()
    blob = crypto_pb2.PrivateKey(key_type=crypto_pb2.KeyType.RSA, data=key.to_bytes()).SerializeToString()
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(blob)
    os.chmod(tmp, 0o400)
    os.replace(tmp, path)
    return key


def peer_id_of(path: Path) -> str:
    return PeerID.from_identity(path.read_bytes()).to_base58()


def use_as_process_key(key: RSAPrivateKey) -> None:
    """hivemind signs DHT records (the swarm's progress records among them) with its process-wide key:
    make that the peer's identity key, so that what it publishes is attributable to its token."""
    RSAPrivateKey._process_wide_key = key


class SwarmAuthorizer(TokenAuthorizerBase):
    """hivemind's token protocol with swarmhub's tokens: ``fetch`` gets a fresh token (from the server, or
    minted locally by the server's own peer) whenever the current one is within REFRESH_MARGIN of expiry."""

    def __init__(
        self,
        local_key: RSAPrivateKey,
        experiment_key: Verifier,
        run_id: str,
        fetch: Callable[[], AccessToken],
        first_token: AccessToken | None = None,
        refresh_margin: timedelta = REFRESH_MARGIN,
        denied: DenyList | None = None,
    ):
        super().__init__(local_key)
        self.experiment_key = experiment_key
        self.run_id = run_id
        self.denied = denied or DenyList()
        self.verified = VerifiedTokens(experiment_key, run_id)
        self.peer_ids = dht_auth.PeerIds()
        self._fetch = fetch
        self._refresh_margin = refresh_margin
        if first_token is not None:
            self._local_access_token = first_token
        dht_auth.install()  # before the DHT that uses this authorizer starts (it runs in a forked process)

    async def get_token(self) -> AccessToken:
        return await asyncio.get_running_loop().run_in_executor(None, self._fetch)

    def is_token_valid(self, access_token: AccessToken) -> bool:
        return self.verified.valid(access_token) and (
            access_token.username not in self.denied or access_token.public_key == self._local_public_key.to_bytes()
        )

    def does_token_need_refreshing(self, access_token: AccessToken) -> bool:
        expires = parse_expiry(access_token.expiration_time)
        return expires is None or expires - datetime.now(timezone.utc) <= self._refresh_margin

    # The DHT's requests and answers, bound to the libp2p connection instead of signed (``dht_auth``).

    def is_bound_to(self, token: AccessToken, peer_id: Any) -> bool:
        """``token`` is valid, its user not removed, and the key it binds is ``peer_id``'s (a libp2p PeerID)."""
        expected = self.peer_ids.of(token.public_key)
        return expected is not None and expected == peer_id.to_bytes() and self.is_token_valid(token)

    async def bind_request(self, request: Any) -> None:
        await self.refresh_token_if_needed()
        request.auth.client_access_token.CopyFrom(self._local_access_token)
        request.auth.nonce = secrets.token_bytes(8)  # the answer must echo it (the channel already binds the two)

    async def is_request_from(self, request: Any, remote_id: Any) -> bool:
        await self.refresh_token_if_needed()
        return self.is_bound_to(request.auth.client_access_token, remote_id)

    async def bind_response(self, response: Any, request: Any) -> None:
        await self.refresh_token_if_needed()
        response.auth.service_access_token.CopyFrom(self._local_access_token)
        response.auth.nonce = request.auth.nonce

    def is_answer_from(self, response: Any, request: Any, dialed: Any) -> bool:
        return (
            response is not None
            and response.auth.nonce == request.auth.nonce
            and self.is_bound_to(response.auth.service_access_token, dialed)
        )


# -- averaging and state download ------------------------------------------------------------------------
#
# hivemind authenticates DHT requests only: gradient averaging (rpc_join_group, rpc_aggregate_part) and state
# download (rpc_download_state) carry no token. libp2p does authenticate the caller's peer ID, though, and a
# peer ID is a hash of the peer's public key. So every admitted peer publishes its access token in the DHT
# (``{run_id}_roster``), and the averaging handlers serve a caller only when the roster holds a valid token
# whose key hashes to the caller's peer ID. A peer that skipped the DHT, or whose token expired, gets nothing.
#
# Only admitted peers can write to the DHT, but an admitted peer could still overwrite another's entry (a
# subkey's value is replaced by any store with a later expiry) and so cut an honest peer off. The roster is
# therefore a protected record, as hivemind's progress records are: each entry's subkey is
# ``[owner:<the token's public key>]`` and its value carries that key's signature (RSASignatureValidator), so
# only the holder of a key can write the entry for it; a schema (SchemaValidator) keeps the roster a
# dictionary of such entries, so no one can replace it whole with a plain value. Every peer that stores or
# reads the roster must have these validators (``add_roster_validators``): storing peers refuse unsigned or
# mis-signed entries, readers drop a peer's answer that holds one, and the reader accepts an entry only when
# the key that signed it is the key its token binds.

ROSTER_REFRESH_SECONDS = 10.0
# The longest an averaging request waits for a roster read. The averager answers a join request only after the
# check, and the caller gives up after hivemind's request timeout (3 s): a read that hangs must not hold the
# check's lock past it, or every later request to this peer waits behind it and no group forms again.
ROSTER_READ_TIMEOUT = 2.0


def roster_key(run_id: str) -> str:
    return f"{run_id}_roster"


class RosterEntry(pydantic.v1.BaseModel):
    """An access token as the roster holds it (``token_to_wire``). hivemind's validators use pydantic v1."""

    username: pydantic.v1.StrictStr
    public_key: pydantic.v1.StrictStr
    expiration_time: pydantic.v1.StrictStr
    signature: pydantic.v1.StrictStr


class RosterSchema(pydantic.v1.BaseModel):
    """``{run_id}_roster``: one entry per peer, under the owner subkey of the key its token binds."""

    roster: dict[BytesWithPublicKey, RosterEntry]


def roster_validators(run_id: str, key: RSAPrivateKey) -> list[RecordValidatorBase]:
    """The roster's schema and hivemind's signature validator signing with ``key`` (this peer's identity).

    A DHT keeps the first signature validator it is given: add these before anything else adds one with
    another key (hivemind's progress tracker adds one with the process-wide key, see ``use_as_process_key``)."""
    return [SchemaValidator(RosterSchema, prefix=run_id), RSASignatureValidator(key)]


def add_roster_validators(dht: Any, run_id: str, key: RSAPrivateKey) -> None:
    dht.add_validators(roster_validators(run_id, key))


def roster_subkey(public_key: bytes) -> bytes:
    """The protected subkey of the entry for ``public_key`` (OpenSSH text): only that key can sign it."""
    return RSASignatureValidator.PUBLIC_KEY_FORMAT.replace(b"_key_", public_key)


def record_owner(subkey: Any) -> bytes | None:
    """The public key (OpenSSH text) that signed a protected DHT record's subkey (``[owner:...]``), if any."""
    if not isinstance(subkey, bytes):
        return None
    owners = RSASignatureValidator._PUBLIC_KEY_RE.findall(subkey)
    return owners[0] if len(owners) == 1 else None


def publish_roster_entry(dht: Any, run_id: str, token: AccessToken) -> bool:
    """Announce this peer's token so that other peers' averagers will talk to it.

    The entry is stored under the owner subkey of the token's key: ``dht`` signs it only when its signature
    validator holds that key (``add_roster_validators``), and other peers refuse it unsigned, so this returns
    False for a token that is not this peer's."""
    from hivemind.utils.timed_storage import get_dht_time

    expires = parse_expiry(token.expiration_time)
    if expires is None:
        return False
    ttl = max(expires.timestamp() - datetime.now(timezone.utc).timestamp(), 1.0)
    return bool(
        dht.store(
            roster_key(run_id),
            subkey=roster_subkey(token.public_key),
            value=token_to_wire(token),
            expiration_time=get_dht_time() + ttl,
        )
    )


class RosterGuard:
    """Decides, in an averager process, whether a caller's peer ID holds a valid token."""

    def __init__(self, experiment_key: Verifier, run_id: str, denied: DenyList | None = None):
        self.experiment_key = experiment_key
        self.run_id = run_id
        self.denied = denied or DenyList()
        self.verified = VerifiedTokens(experiment_key, run_id)
        self._usernames: dict[str, str] = {}  # peer ID -> username of its token
        self._allowed: dict[str, float] = {}  # peer ID -> token expiry (unix seconds)
        self._fetched_at = 0.0
        self._lock: asyncio.Lock | None = None

    def username_of(self, peer_id: str) -> str | None:
        """The username in the token that admitted ``peer_id`` (after :meth:`admit` saw it)."""
        return self._usernames.get(peer_id)

    def admit(self, record: Any) -> dict[str, float]:
        """Peer ID -> token expiry (unix seconds) for each roster entry with a valid token for this run."""
        allowed: dict[str, float] = {}
        if record is None or not isinstance(record.value, dict):
            return allowed
        for subkey, entry in record.value.items():
            try:
                token = token_from_wire(entry.value)
            except (KeyError, TypeError, AttributeError, ValueError):
                continue
            # The DHT checked that the subkey's owner signed the entry; the entry counts only when that owner
            # is the key the token binds (else an admitted peer could publish someone else's token as its own).
            if record_owner(subkey) != token.public_key or not self.verified.valid(token):
                continue
            try:
                claimed = peer_id_for_public_key(token.public_key)
            except ValueError:
                continue
            expires = parse_expiry(token.expiration_time)
            allowed[claimed] = expires.timestamp() if expires else 0.0
            self._usernames[claimed] = token.username
        return allowed

    async def allows(self, dht: Any, peer_id: Any) -> bool:
        import time

        caller = peer_id.to_base58()
        now = time.time()
        if self._usernames.get(caller) in self.denied:
            return False
        if self._allowed.get(caller, 0.0) > now:
            return True
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # one roster read at a time; unknown callers cannot force more than one per period
            if now - self._fetched_at >= ROSTER_REFRESH_SECONDS or caller not in self._allowed:
                if now - self._fetched_at >= 1.0:
                    read = dht.get(roster_key(self.run_id), latest=True, return_future=True)
                    try:
                        record = await asyncio.wait_for(read, ROSTER_READ_TIMEOUT)
                    except asyncio.TimeoutError:  # decide from the last read; the next request reads again
                        logger.warning("the swarm's roster could not be read within %.0f s", ROSTER_READ_TIMEOUT)
                    else:
                        self._allowed = self.admit(record)
                    self._fetched_at = time.time()
        return self._allowed.get(caller, 0.0) > time.time() and self._usernames.get(caller) not in self.denied


_GUARD: RosterGuard | None = None


def guard_averaging(experiment_key: Verifier, run_id: str, denied: DenyList | None = None) -> None:
    """Make every hivemind averager created after this call (in this process and its children) refuse
    callers that are not on the run's roster. Call before creating ``hivemind.Optimizer``."""
    import functools
    import inspect
    import typing

    from hivemind.averaging.averager import DecentralizedAverager

    global _GUARD
    _GUARD = RosterGuard(experiment_key, run_id, denied)
    for name in ("rpc_join_group", "rpc_aggregate_part", "rpc_download_state"):
        original = getattr(DecentralizedAverager, name)
        original = getattr(original, "__swarmhub_original__", original)

        def make(method: Any, rpc: str) -> Any:
            @functools.wraps(method)
            async def guarded(self: Any, request: Any, context: Any) -> Any:
                if _GUARD is not None and not await _GUARD.allows(self.dht, context.remote_id):
                    logger.warning("refused %s from %s: not on the swarm's roster", rpc, context.remote_id)
                    return
                async for item in method(self, request, context):
                    yield item

            # hivemind reads each handler's request and response types from its annotations, by parameter name
            hints = typing.get_type_hints(method)
            request_name = inspect.getfullargspec(method).args[1]
            guarded.__annotations__ = {"request": hints[request_name], "return": hints["return"]}
            guarded.__swarmhub_original__ = method  # type: ignore[attr-defined]
            return guarded

        setattr(DecentralizedAverager, name, make(original, name))
