"""API keys (hashed, unique names, no escalation) and live-channel tickets (signed, short, bound)."""

from __future__ import annotations

import pytest

from thoughtgate.access.keys import (
    KEY_PREFIX,
    authenticate,
    bearer_token,
    create_key,
    hash_key,
    key_view,
    revoke_key,
)
from thoughtgate.access.roles import Role
from thoughtgate.access.tickets import TicketSigner, ticket_secret
from thoughtgate.errors import AccessDeniedError, AuthenticationError, UsageError
from thoughtgate.store.memory import MemoryStore


async def test_keys_are_stored_hashed_and_authenticate() -> None:
    store = MemoryStore()
    created = await create_key(store, name="ci", role="developer")
    assert created.key.startswith(KEY_PREFIX) and len(created.key) > 40
    [record] = await store.list_api_keys()
    assert record.key_hash == hash_key(created.key) and created.key not in repr(record)
    assert "key_hash" not in key_view(record)
    principal = await authenticate(store, f"Bearer {created.key}")
    assert (principal.name, principal.role) == ("ci", Role.DEVELOPER)
    assert await revoke_key(store, "ci")
    with pytest.raises(AuthenticationError):
        await authenticate(store, f"Bearer {created.key}")
    assert not await revoke_key(store, "ci")


async def test_key_rules() -> None:
    store = MemoryStore()
    await create_key(store, name="a", role="viewer")
    with pytest.raises(UsageError, match="already exists"):
        await create_key(store, name="a", role="viewer")
    with pytest.raises(UsageError, match="bad key name"):
        await create_key(store, name="no spaces", role="viewer")
    with pytest.raises(UsageError):
        await create_key(store, name="b", role="superuser")
    with pytest.raises(AccessDeniedError):
        await create_key(store, name="c", role="owner", by=Role.ADMIN)
    owner = await create_key(store, name="o", role="owner")
    with pytest.raises(AccessDeniedError):
        await revoke_key(store, owner.record.key_id, by=Role.ADMIN)
    assert await revoke_key(store, "a", by=Role.ADMIN)


@pytest.mark.parametrize("header", [None, "", "Basic abc", "Bearer", "Bearer   "])
def test_bad_authorization_headers(header: str | None) -> None:
    with pytest.raises(AuthenticationError):
        bearer_token(header)


async def test_unknown_key_is_refused() -> None:
    with pytest.raises(AuthenticationError):
        await authenticate(MemoryStore(), "Bearer tg_not-a-key")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_ticket_roundtrip_expiry_forgery_and_binding() -> None:
    clock = Clock()
    signer = TicketSigner("s3cret", ttl_s=60, clock=clock)
    ticket, expires = signer.issue("run_1", Role.VIEWER, key_id="key_1")
    assert expires == 1060.0
    grant = signer.verify(ticket, "run_1")
    assert (grant.run_id, grant.role, grant.key_id) == ("run_1", Role.VIEWER, "key_1")
    with pytest.raises(AccessDeniedError):
        signer.verify(ticket, "run_2")
    head, body, mac = ticket.split(".")
    # raise the role inside the claims: the MAC no longer matches
    import base64
    import json

    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    claims["role"] = "owner"
    forged_body = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    for forged in (f"{head}.{forged_body}.{mac}", f"{head}.{body}.{mac[:-2]}xx", "v1.a.b", "x", ""):
        with pytest.raises(AuthenticationError):
            signer.verify(forged, "run_1")
    other = TicketSigner("another-secret", ttl_s=60, clock=clock)
    with pytest.raises(AuthenticationError):
        other.verify(ticket, "run_1")
    clock.now = 1060.0
    with pytest.raises(AuthenticationError, match="expired"):
        signer.verify(ticket, "run_1")


async def test_ticket_secret_from_config_or_store() -> None:
    store = MemoryStore()
    assert await ticket_secret(store, "configured") == "configured"
    first = await ticket_secret(store, None)
    assert first and await ticket_secret(store, None) == first
