"""API keys (hashed, unique names, no escalation) and live-channel tickets (signed, short, bound)."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from thoughtgate.access.keys import (
    KEY_ID_PREFIX,
    KEY_PREFIX,
    authenticate,
    bearer_token,
    create_key,
    hash_key,
    key_view,
    revoke_key,
)
from thoughtgate.access.roles import Role
from thoughtgate.access.tickets import TicketSigner, require_ticket_key, ticket_secret
from thoughtgate.errors import AccessDeniedError, AuthenticationError, TicketError, UsageError
from thoughtgate.store.memory import MemoryStore
from thoughtgate.store.records import ApiKeyRecord


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


async def test_key_names_cannot_take_the_reserved_id_prefix() -> None:
    """The attack: name a key after another key's id, so that revoking "by name or id" hits the
    wrong key (or both)."""
    store = MemoryStore()
    owner = await create_key(store, name="ops", role="owner")
    assert owner.record.key_id.startswith(KEY_ID_PREFIX)
    for name in (owner.record.key_id, "key_anything", "KEY_upper", "Key_1"):
        with pytest.raises(
            UsageError, match=f"starting with {KEY_ID_PREFIX!r} are reserved for key ids"
        ):
            await create_key(store, name=name, role="viewer")
    assert [k.name for k in await store.list_api_keys()] == ["ops"]


async def test_revocation_is_by_exact_id_or_an_unambiguous_name() -> None:
    store = MemoryStore()
    owner = await create_key(store, name="ops", role="owner")
    # A key named like another key's id, as a store from before the reserved prefix may hold.
    await store.save_api_key(ApiKeyRecord("key_legacy", owner.record.key_id, "viewer", "h-l"))
    assert await revoke_key(store, owner.record.key_id)  # the id wins: only that key
    states = {k.key_id: k.revoked_at is None for k in await store.list_api_keys()}
    assert states == {owner.record.key_id: False, "key_legacy": True}

    # Two active keys with one name (two replicas creating it at once, or old data).
    await store.save_api_key(ApiKeyRecord("key_ci1", "ci", "member", "h-1"))
    await store.save_api_key(ApiKeyRecord("key_ci2", "ci", "member", "h-2"))
    with pytest.raises(UsageError, match=r"2 active keys are named 'ci'.*key_ci1.*key_ci2"):
        await revoke_key(store, "ci")
    assert all(k.revoked_at is None for k in await store.list_api_keys() if k.name == "ci")
    assert await revoke_key(store, "key_ci2")
    assert await revoke_key(store, "ci")  # now unambiguous
    assert not await revoke_key(store, "ci")  # nothing active by that name


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


def _claims(ticket: str) -> dict[str, Any]:
    body = ticket.split(".")[1]
    found: dict[str, Any] = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    return found


def _resigned(signer_secret: str, claims: dict[str, Any]) -> str:
    """A ticket with these claims, signed properly: what someone holding the secret could mint."""
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    mac = hmac.new(signer_secret.encode(), f"v1.{body}".encode(), hashlib.sha256).digest()
    return f"v1.{body}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}"


def test_ticket_roundtrip_expiry_forgery_and_binding() -> None:
    clock = Clock()
    signer = TicketSigner("s3cret", ttl_s=60, clock=clock)
    ticket, expires = signer.issue("run_1", Role.VIEWER, key_id="key_1")
    assert expires == 1060.0
    assert _claims(ticket)["kid"] == "key_1"  # a ticket names the key that minted it
    grant = signer.verify(ticket, "run_1")
    assert (grant.run_id, grant.role, grant.key_id) == ("run_1", Role.VIEWER, "key_1")
    with pytest.raises(TicketError, match="this ticket is for another run") as wrong:
        signer.verify(ticket, "run_2")
    assert (wrong.value.status, wrong.value.code) == (403, "ticket_wrong_run")
    head, body, mac = ticket.split(".")
    # raise the role inside the claims: the MAC no longer matches
    claims = _claims(ticket)
    claims["role"] = "owner"
    forged_body = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    for forged in (f"{head}.{forged_body}.{mac}", f"{head}.{body}.{mac[:-2]}xx", "v1.a.b"):
        with pytest.raises(TicketError, match="not valid") as bad:
            signer.verify(forged, "run_1")
        assert (bad.value.status, bad.value.code) == (401, "ticket_invalid")
    for garbage in ("x", "a.b.c.d", "v0.a.b"):
        with pytest.raises(TicketError, match="not a ticket"):
            signer.verify(garbage, "run_1")
    with pytest.raises(TicketError, match="missing ticket"):
        signer.verify("", "run_1")
    other = TicketSigner("another-secret", ttl_s=60, clock=clock)
    with pytest.raises(AuthenticationError, match="not valid"):
        other.verify(ticket, "run_1")
    clock.now = 1060.0
    with pytest.raises(TicketError, match="this ticket has expired") as late:
        signer.verify(ticket, "run_1")
    assert (late.value.status, late.value.code) == (401, "ticket_expired")


_ISSUED = TicketSigner("s3cret", ttl_s=60, clock=Clock()).issue("run_1", Role.OWNER, key_id="k")[0]
_TICKET_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=40) | st.text(max_size=40)


@given(
    st.one_of(
        _TICKET_TEXT,
        st.builds(lambda a, b: f"v1.{a}.{b}", _TICKET_TEXT, _TICKET_TEXT),
        st.builds(lambda a, b: f"v1.{a}.{b}", st.just(_ISSUED.split(".")[1]), _TICKET_TEXT),
        st.builds(lambda a, b: f"v1.{a}.{b}", _TICKET_TEXT, st.just(_ISSUED.split(".")[2])),
    )
)
def test_any_text_that_is_not_a_ticket_is_refused_as_one(text: str) -> None:
    """The ticket is whatever a URL's query held, percent-decoded: any characters at all (an
    ``é``, a lone surrogate from ``%ED%A0%80``, NUL). Anything but a ticket this signer issued is
    a ``TicketError`` (401, in the reader's words), never another exception (a 500)."""
    signer = TicketSigner("s3cret", ttl_s=60, clock=Clock())
    with pytest.raises(TicketError) as refused:
        signer.verify(text, "run_1")
    assert (refused.value.status, refused.value.code) in {
        (401, "ticket_invalid"),
        (401, "ticket_missing"),
    }


def test_a_ticket_must_name_its_key() -> None:
    signer = TicketSigner("s3cret", ttl_s=60)
    with pytest.raises(ValueError, match="key"):
        signer.issue("run_1", Role.OWNER, key_id="")
    nameless = _resigned("s3cret", {"run": "run_1", "role": "owner", "exp": time.time() + 60})
    with pytest.raises(TicketError, match="names no key"):
        signer.verify(nameless, "run_1")


async def test_a_ticket_is_refused_once_its_key_is_revoked_or_below_its_role() -> None:
    store = MemoryStore()
    dev = await create_key(store, name="dana", role="developer")
    signer = TicketSigner("s3cret", ttl_s=60)
    ticket, _ = signer.issue("run_1", Role.DEVELOPER, key_id=dev.record.key_id)
    grant = signer.verify(ticket, "run_1")
    await require_ticket_key(store, grant)  # the key is active and still a developer

    demoted = dataclasses.replace(dev.record, role="viewer")
    await store.save_api_key(demoted)
    with pytest.raises(TicketError, match="no longer has the developer role") as lost:
        await require_ticket_key(store, grant)
    assert lost.value.code == "ticket_role_lost"
    await store.save_api_key(dev.record)

    assert await revoke_key(store, dev.record.key_id)
    with pytest.raises(
        TicketError, match="key that asked for this ticket has been revoked"
    ) as gone:
        await require_ticket_key(store, grant)
    assert (gone.value.status, gone.value.code) == (401, "ticket_key_revoked")
    unknown = signer.verify(signer.issue("run_1", Role.OWNER, key_id="key_nope")[0], "run_1")
    with pytest.raises(TicketError, match="revoked"):
        await require_ticket_key(store, unknown)


async def test_ticket_secret_from_config_or_store() -> None:
    store = MemoryStore()
    assert await ticket_secret(store, "configured") == "configured"
    first = await ticket_secret(store, None)
    assert first and await ticket_secret(store, None) == first


@pytest.mark.parametrize("local", ["member", "owner"])
async def test_the_daemons_first_key_has_the_local_role_never_more(local: str) -> None:
    """``thoughtgate serve`` on a store with no keys makes one with ``access.local_role``: a
    person whose command line stops at member (``keys create`` needs admin, ``mcp --role`` stops
    there) does not get an owner key by starting a daemon."""
    from thoughtgate.cli.serve import bootstrap_key

    store = MemoryStore()
    made = await bootstrap_key(store, Role[local.upper()])
    assert made is not None
    (record,) = await store.list_api_keys()
    assert (record.role, record.name) == (local, made[0])
    assert await bootstrap_key(store, Role.OWNER) is None  # once, on a store with no keys
