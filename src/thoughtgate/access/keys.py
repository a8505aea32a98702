"""API keys: who is calling the daemon, and with which role.

A key is ``tg_`` followed by 43 URL-safe characters from :func:`secrets.token_urlsafe` (256 random
bits). It is shown once, when created; the store keeps only its SHA-256 hex digest. A plain,
unsalted SHA-256 is enough here because the input is a high-entropy random string, not a password:
there is nothing to guess from a dictionary, and a lookup by digest never compares secrets
character by character. Keys are revoked, never deleted, so ``keys list`` shows their history.

Every caller (CLI ``keys`` commands and the daemon's ``/v1/keys`` routes) goes through these
functions; the rules live here: names are unique among active keys, and nobody may mint or revoke a
key with a role above their own.

Ids and names never overlap: a key id is ``key_`` plus 32 hex digits, and a name may not start
with ``key_`` (in any case). Revocation takes an exact id, or a name that exactly one active key
holds; two active keys with one name (two replicas creating it at the same moment, or data from
before names were checked) are refused with both ids listed, so the wrong key is never revoked.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import Any

from thoughtgate.access.roles import Role, parse_role
from thoughtgate.errors import AccessDeniedError, AuthenticationError, UsageError
from thoughtgate.store.key_store import KeyStore
from thoughtgate.store.records import ApiKeyRecord, new_id

__all__ = [
    "KEY_ID_PREFIX",
    "KEY_PREFIX",
    "CreatedKey",
    "Principal",
    "authenticate",
    "bearer_token",
    "create_key",
    "generate_key",
    "hash_key",
    "key_view",
    "revoke_key",
]

KEY_PREFIX = "tg_"
"""How every key (the secret) starts."""
KEY_ID_PREFIX = "key_"
"""How every key id starts (``new_id("key")``); reserved: no key name may start with it."""
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller behind a request: which key, which name, which role."""

    key_id: str
    name: str
    role: Role


@dataclass(frozen=True, slots=True)
class CreatedKey:
    """A freshly created key: the only moment its secret is known."""

    record: ApiKeyRecord
    key: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "key_id": self.record.key_id,
            "name": self.record.name,
            "role": self.record.role,
            "key": self.key,
        }


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    """The stored form of a key: SHA-256, hex. Of any text: a token holding a lone surrogate
    (which UTF-8 cannot carry) hashes to what no key's hash is, an unknown key."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def key_view(record: ApiKeyRecord) -> dict[str, Any]:
    """A key as listed: never its hash."""
    return {
        "key_id": record.key_id,
        "name": record.name,
        "role": record.role,
        "created_at": record.created_at,
        "revoked_at": record.revoked_at,
    }


async def create_key(
    store: KeyStore, *, name: str, role: Role | str, by: Role | None = None
) -> CreatedKey:
    """Create and store a key; ``by`` is the creator's role (``None``: the local operator)."""
    parsed = parse_role(role)
    if by is not None and parsed > by:
        raise AccessDeniedError("a key cannot be given a role above its creator's")
    if not _NAME.match(name):
        raise UsageError(
            f"bad key name {name!r}: 1-64 characters, letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    if name.lower().startswith(KEY_ID_PREFIX):
        raise UsageError(
            f"bad key name {name!r}: names starting with {KEY_ID_PREFIX!r} are reserved for key "
            "ids (so that a name is never mistaken for another key's id); pick another name"
        )
    if any(k.name == name and k.revoked_at is None for k in await store.list_api_keys()):
        raise UsageError(f"an active key named {name!r} already exists; revoke it or pick another")
    key = generate_key()
    record = ApiKeyRecord(new_id("key"), name, parsed.label, hash_key(key))
    await store.save_api_key(record)
    return CreatedKey(record, key)


async def revoke_key(
    store: KeyStore, key_id_or_name: str, *, by: Role | None = None
) -> ApiKeyRecord | None:
    """Revoke the active key with this exact id, else the one active key with this name.

    Returns the revoked key, ``None`` when no active key matched. Raises ``UsageError`` when the
    name is held by several active keys (naming their ids) and ``AccessDeniedError`` when the
    key's role is above ``by`` (the revoker's role; ``None``: the local operator).
    """
    active = [k for k in await store.list_api_keys() if k.revoked_at is None]
    matches = [k for k in active if k.key_id == key_id_or_name]
    if not matches:  # an id always wins over a (legacy) name that looks like it
        matches = [k for k in active if k.name == key_id_or_name]
    if not matches:
        return None
    if len(matches) > 1:
        ids = ", ".join(k.key_id for k in matches)
        raise UsageError(
            f"{len(matches)} active keys are named {key_id_or_name!r} ({ids}); revoke one by its id"
        )
    target = matches[0]
    if by is not None and parse_role(target.role) > by:
        raise AccessDeniedError("cannot revoke a key whose role is above yours")
    if not await store.revoke_api_key(target.key_id):
        return None  # revoked by someone else in the meantime
    return target


def bearer_token(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer ...`` header; anything else is an auth error."""
    if not authorization:
        raise AuthenticationError("missing API key: send 'Authorization: Bearer KEY'")
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise AuthenticationError("malformed Authorization header: expected 'Bearer KEY'")
    return token


async def authenticate(store: KeyStore, authorization: str | None) -> Principal:
    """The principal for an ``Authorization`` header; unknown or revoked keys are refused."""
    token = bearer_token(authorization)
    record = await store.find_api_key(hash_key(token))
    if record is None:
        raise AuthenticationError("invalid or revoked API key")
    return Principal(record.key_id, record.name, parse_role(record.role))
