"""Swarm access tokens and experiment keys, without hivemind: what the server process signs and checks.

The server signs a token for every volunteer who joins, but it runs no hivemind peer itself (its peers are
subprocesses, ``server/swarm/bootstrap_peer.py`` and its companions), and importing hivemind would load torch into
every server process. So the token format, the RSA scheme and the key formats live here, on
``cryptography`` alone; ``swarm_access`` adds hivemind's token protocol and the averaging guard on top.

The signed bytes are defined here, once, and never a language's repr::

    swarmhub-access-token/v1
    run_id=<run_id>
    username=<username>
    public_key=<the peer's RSA public key, OpenSSH text "ssh-rsa AAAA...">
    expires=<UTC expiry, ISO 8601 "YYYY-MM-DDTHH:MM:SSZ">

joined by ``\\n``, UTF-8, signed with RSA-PSS/SHA-256 (maximum salt length, base64 output).
Usernames, run ids and the key text cannot contain a newline, so the encoding is unambiguous.

Every format matches hivemind's ``RSAPrivateKey``/``RSAPublicKey`` and ``PeerID`` byte for byte (a test
checks it): signatures made by either side verify on the other, experiment keys stored in databases (base64
of PKCS#1 DER) load unchanged, and peer IDs are the ones libp2p derives.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Protocol

import base58
from cryptography import exceptions
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

TOKEN_VERSION = "swarmhub-access-token/v1"  # noqa: S105 - a format tag, not a secret
# The username in the tokens of the server's own peers (bootstrap/monitor, auxiliary and checkpoint peers). No
# account may have it (``server.accounts`` reserves it): that account would be credited with those peers' work,
# and banning it would cut them off.
SERVER_PEER_USERNAME = "swarmhub"
REFRESH_MARGIN = timedelta(minutes=5)  # fetch a new token this long before the current one expires

# hivemind.utils.crypto's scheme: PSS randomizes each signature, so compatibility means each side verifies
# the other's signatures, not that both produce the same bytes.
_PADDING = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.MAX_LENGTH)
_HASH = hashes.SHA256()


class PublicKey:
    """An RSA public key; ``to_bytes`` is its OpenSSH text, as hivemind's ``RSAPublicKey``."""

    def __init__(self, key: rsa.RSAPublicKey):
        self._key = key

    @classmethod
    def from_bytes(cls, key: bytes) -> PublicKey:
        loaded = serialization.load_ssh_public_key(key)
        if not isinstance(loaded, rsa.RSAPublicKey):
            raise ValueError(f"Expected an RSA public key, got {loaded}")
        return cls(loaded)

    def to_bytes(self) -> bytes:
        return self._key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)

    def verify(self, data: bytes, signature: bytes) -> bool:
        """Whether ``signature`` (base64) signs ``data``."""
        try:
            self._key.verify(base64.b64decode(signature), data, _PADDING, _HASH)
        except (ValueError, exceptions.InvalidSignature):
            return False
        return True


class SigningKey:
    """An RSA-2048 private key; signs and serializes as hivemind's ``RSAPrivateKey``."""

    def __init__(self, key: rsa.RSAPrivateKey):
        self._key = key

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(rsa.generate_private_key(public_exponent=65537, key_size=2048))

    @classmethod
    def from_der(cls, der: bytes) -> SigningKey:
        loaded = serialization.load_der_private_key(der, password=None)
        if not isinstance(loaded, rsa.RSAPrivateKey):
            raise ValueError(f"Expected an RSA private key, got {loaded}")
        return cls(loaded)

    def to_bytes(self) -> bytes:
        """PKCS#1 DER, the format of the experiments' ``signing_key`` column."""
        return self._key.private_bytes(
            encoding=serialization.Encoding.DER,
            format=serialization.PrivateFormat.TraditionalOpenSSL,
            encryption_algorithm=serialization.NoEncryption(),
        )

    def sign(self, data: bytes) -> bytes:
        """The signature of ``data``, base64."""
        return base64.b64encode(self._key.sign(data, _PADDING, _HASH))

    def get_public_key(self) -> PublicKey:
        return PublicKey(self._key.public_key())


class Verifier(Protocol):
    """A public key: this module's or hivemind's ``RSAPublicKey``."""

    def verify(self, data: bytes, signature: bytes) -> bool: ...

    def to_bytes(self) -> bytes: ...


class Signer(Protocol):
    """A private key: this module's or hivemind's ``RSAPrivateKey`` (a peer's identity)."""

    def sign(self, data: bytes) -> bytes: ...

    def get_public_key(self) -> Verifier: ...


class TokenFields(Protocol):
    """A token: this module's :class:`Token` or hivemind's ``AccessToken`` message."""

    @property
    def username(self) -> str: ...

    @property
    def public_key(self) -> bytes: ...

    @property
    def expiration_time(self) -> str: ...

    @property
    def signature(self) -> bytes: ...


@dataclass(frozen=True)
class Token:
    """The fields of hivemind's ``AccessToken``; ``swarm_access`` converts one into the other."""

    username: str
    public_key: bytes
    expiration_time: str
    signature: bytes


def token_payload(run_id: str, username: str, public_key: bytes, expires: str) -> bytes:
    fields = [TOKEN_VERSION, f"run_id={run_id}", f"username={username}", f"public_key={public_key.decode()}"]
    for value in (run_id, username, public_key.decode(), expires):
        if "\n" in value or "\r" in value:
            raise ValueError("token fields cannot contain line breaks")
    return "\n".join([*fields, f"expires={expires}"]).encode()


def format_expiry(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# Every DHT request and answer asks whether this peer's token needs refreshing (hivemind's authorizer), and each
# asked strptime again: 4 % of a demo worker's DHT process (py-spy). A peer meets a handful of distinct strings.
@functools.lru_cache(maxsize=256)
def parse_expiry(text: str) -> datetime | None:
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def sign_token(signing_key: Signer, run_id: str, username: str, public_key: bytes, lifetime: timedelta) -> Token:
    """The server's side: a token for one peer key, valid for ``lifetime``."""
    PublicKey.from_bytes(public_key)  # refuse anything that is not an RSA public key
    expires = format_expiry(datetime.now(timezone.utc) + lifetime)
    signature = signing_key.sign(token_payload(run_id, username, public_key, expires))
    return Token(username=username, public_key=public_key, expiration_time=expires, signature=signature)


def verify_token(token: TokenFields, experiment_key: Verifier, run_id: str) -> bool:
    expires = parse_expiry(token.expiration_time)
    if expires is None or expires <= datetime.now(timezone.utc):
        return False
    try:
        payload = token_payload(run_id, token.username, token.public_key, token.expiration_time)
    except (ValueError, UnicodeDecodeError):
        return False
    return experiment_key.verify(payload, token.signature)


class VerifiedTokens:
    """A peer's memory of the tokens whose signature it has checked: each distinct token is verified once, and
    later checks of it cost a lookup and a clock read until it expires. hivemind checks the token of every DHT
    request and response, and the roster's tokens at every read; the same few tokens come back each time.

    Only tokens that verified are remembered (a caller cannot fill the memory without tokens the experiment's
    key signed), and at most ``limit`` of them, the oldest forgotten first. What a token grants is still decided
    per call: the caller's deny list is read every time, and each request must come over a libp2p connection
    authenticated with the token's key (``dht_auth``)."""

    def __init__(self, experiment_key: Verifier, run_id: str, limit: int = 4096):
        self.experiment_key, self.run_id, self.limit = experiment_key, run_id, limit
        self._expiry: OrderedDict[tuple[str, bytes, str, bytes], datetime] = OrderedDict()

    def valid(self, token: TokenFields) -> bool:
        key = (token.username, token.public_key, token.expiration_time, token.signature)
        expires = self._expiry.get(key)
        if expires is not None:
            if expires > datetime.now(timezone.utc):
                return True
            del self._expiry[key]
            return False
        if not verify_token(token, self.experiment_key, self.run_id):
            return False
        self._expiry[key] = parse_expiry(token.expiration_time)  # type: ignore[assignment]  # verified: parses
        while len(self._expiry) > self.limit:
            self._expiry.popitem(last=False)
        return True


def token_to_wire(token: TokenFields) -> dict[str, str]:
    return {
        "username": token.username,
        "public_key": token.public_key.decode(),
        "expiration_time": token.expiration_time,
        "signature": token.signature.decode(),
    }


# -- keys ----------------------------------------------------------------------------------------------


def new_signing_key_der() -> str:
    """A fresh experiment signing key, as base64 DER text for the database."""
    return base64.b64encode(SigningKey.generate().to_bytes()).decode()


def signing_key_from_text(text: str) -> SigningKey:
    return SigningKey.from_der(base64.b64decode(text))


def public_key_text(key: Signer) -> str:
    return key.get_public_key().to_bytes().decode()


def public_key_from_text(text: str) -> PublicKey:
    return PublicKey.from_bytes(text.encode())


def peer_id_for_public_key(public_key: bytes) -> str:
    """libp2p's peer ID of an RSA public key (OpenSSH text), as hivemind derives it for its identity."""
    der = serialization.load_ssh_public_key(public_key).public_bytes(
        encoding=serialization.Encoding.DER, format=serialization.PublicFormat.SubjectPublicKeyInfo
    )
    # libp2p's crypto.pb.PublicKey{key_type: RSA (0), data: der}, as protobuf writes it: field 1 varint, field 2
    # length-delimited. Written out here because the generated message lives in hivemind.
    encoded = b"\x08\x00\x12" + _varint(len(der)) + der
    # multihash sha2-256 (code 0x12, 32 bytes); RSA keys are too long for libp2p's identity multihash
    return base58.b58encode(b"\x12\x20" + hashlib.sha256(encoded).digest()).decode()


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
