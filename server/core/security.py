"""Passwords (Argon2id), opaque tokens (stored as SHA-256 only), CSRF comparison, and text we can store."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Annotated

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from pydantic import AfterValidator

PASSWORD_HASHING = {
    "standard": PasswordHasher(),  # argon2-cffi's defaults: Argon2id with RFC 9106 low-memory parameters
    # Argon2id at its smallest cost, for test suites that create thousands of accounts: never for real accounts
    # (the settings refuse it outside SWARMHUB_ENVIRONMENT=test)
    "minimal": PasswordHasher(time_cost=1, memory_cost=8, parallelism=1),
}
_hasher = PASSWORD_HASHING["standard"]
_DUMMY_PASSWORD = "swarmhub-dummy-password"  # noqa: S105 - hashed to verify against when a user does not exist
# A fixed hash to verify against when the user does not exist, so timing does not reveal usernames.
_DUMMY_HASH = _hasher.hash(_DUMMY_PASSWORD)


def use_password_hashing(name: str) -> None:
    """Hash new passwords with the named parameters (``Settings.password_hashing``). Stored hashes carry their
    own parameters, so a hash made with either verifies under either."""
    global _hasher, _DUMMY_HASH
    if PASSWORD_HASHING[name] is not _hasher:
        _hasher = PASSWORD_HASHING[name]
        _DUMMY_HASH = _hasher.hash(_DUMMY_PASSWORD)


API_TOKEN_PREFIX = "shb_"  # noqa: S105 - a public prefix, not a secret
USER_CODE_ALPHABET = "BCDFGHJKLMNPQRSTVWXZ"  # RFC 8628 section 6.1: no vowels, no look-alikes


def refuse_nul(value: str) -> str:
    """Pydantic validator for text that reaches the database, as a value or as a lookup key."""
    # PostgreSQL text cannot hold a NUL character: psycopg refuses it, which was a 500. SQLite would store it,
    # and a name that differs from another by an invisible character is no name to trust, so both refuse it.
    if "\x00" in value:
        raise ValueError("must not contain a NUL character")
    return value


# Any text field of a request model that is stored or looked up: the 422 names the field.
StoredText = Annotated[str, AfterValidator(refuse_nul)]


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def verify_password(password_hash: str | None, password: str) -> bool:
    try:
        return _hasher.verify(password_hash or _DUMMY_HASH, password) and password_hash is not None
    except (VerificationError, InvalidHashError):
        return False


def new_token(prefix: str = "") -> str:
    return prefix + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """Tokens are high-entropy random values, so a plain SHA-256 is enough to store them safely."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_user_code() -> str:
    chars = "".join(secrets.choice(USER_CODE_ALPHABET) for _ in range(8))
    return f"{chars[:4]}-{chars[4:]}"


def normalize_user_code(code: str) -> str:
    chars = "".join(c for c in code.upper() if c.isalnum())
    return f"{chars[:4]}-{chars[4:]}" if len(chars) == 8 else chars


def same(a: str | None, b: str | None) -> bool:
    # Compared as bytes: compare_digest raises TypeError on str with non-ASCII characters (a forged form field).
    return bool(a) and bool(b) and hmac.compare_digest(str(a).encode(), str(b).encode())
