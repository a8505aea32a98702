"""Live-channel tickets: short-lived, signed, bound to one run (or to the run list) and to the
asker's role.

A browser ``EventSource`` cannot send an ``Authorization`` header, so the SSE channel is opened
with a ticket in the query string instead of an API key. A caller with a key asks
``POST /v1/tickets {run_id}`` (or ``{"scope": "runs"}`` for the live run list) and gets::

    v1.<base64url(JSON claims)>.<base64url(HMAC-SHA256(secret, "v1." + claims))>

with claims ``{"run": run_id, "role": "viewer", "kid": key_id, "exp": unix_seconds}`` (a run-list
ticket has ``"scope": "runs"`` and no ``run``: it opens no run's stream, and a run's ticket does
not open the list). The
server verifies the MAC in constant time, then the expiry, then the run, then (``require_ticket_key``)
that the key named by ``kid`` is still active and still holds the ticket's role. The ticket never
grants more than the key that asked for it (its role is copied, not chosen) and may be reused until
it expires so that a client can reconnect with ``Last-Event-ID``. A stream it opened lasts until
the run ends, or until its key is revoked or loses the role (``server.access_watch``).

The secret comes from ``server.secret``, else from the store's ``get_or_create_secret``: a 0600
file beside a SQLite database, never inside it, or the ``secrets`` table of a PostgreSQL schema,
guarded by PostgreSQL's own credentials (docs/adr/0006-ticket-secret.md).

Errors are :class:`TicketError` with a message in the reader's words: 401 for a missing,
malformed, forged or expired ticket or a revoked key, 403 for a ticket for another run.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from thoughtgate.access.roles import Role, parse_role
from thoughtgate.errors import TicketError, UnknownRoleError
from thoughtgate.store.key_store import KeyStore
from thoughtgate.store.records import ApiKeyRecord

__all__ = [
    "RUN_LIST_SCOPE",
    "SECRET_NAME",
    "Ticket",
    "TicketSigner",
    "key_access_problem",
    "require_ticket_key",
    "ticket_secret",
]

SECRET_NAME = "ticket_hmac"
"""Name of the generated HMAC key in ``KeyStore.get_or_create_secret``."""

_VERSION = "v1"
_NEW_TICKET = "get a new one from POST /v1/tickets"


RUN_LIST_SCOPE = "runs"
"""The ``scope`` claim of a ticket for the live run list (``GET /v1/runs/stream``)."""


@dataclass(frozen=True, slots=True)
class Ticket:
    """What a verified ticket allows: reading ``run_id`` (``None``: the run list) as ``role``
    until ``expires_at``."""

    run_id: str | None
    role: Role
    key_id: str
    expires_at: float


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


async def ticket_secret(store: KeyStore, configured: str | None) -> str:
    """``server.secret`` from config when set, else one generated once and kept in the store
    (so every daemon sharing the store verifies every other's tickets)."""
    if configured:
        return configured
    return await store.get_or_create_secret(SECRET_NAME, secrets.token_urlsafe(32))


class TicketSigner:
    """Issues and verifies tickets with one HMAC key."""

    def __init__(
        self, secret: str, *, ttl_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        if not secret:
            raise ValueError("the ticket secret must not be empty")
        self._key = secret.encode("utf-8")
        self.ttl_s = ttl_s
        self._clock = clock

    def _mac(self, signed: str) -> str:
        return _b64(hmac.new(self._key, signed.encode("ascii"), hashlib.sha256).digest())

    def issue(self, run_id: str | None, role: Role, *, key_id: str) -> tuple[str, float]:
        """``(ticket, expires_at)`` for reading ``run_id`` (``None``: the run list) with
        ``role``, minted by ``key_id``."""
        if not key_id:
            raise ValueError("a ticket must name the key that asked for it")
        expires_at = round(self._clock() + self.ttl_s, 3)
        claims: dict[str, object] = {"role": role.label, "kid": key_id, "exp": expires_at}
        if run_id is None:
            claims["scope"] = RUN_LIST_SCOPE
        else:
            claims["run"] = run_id
        body = _b64(json.dumps(claims, separators=(",", ":"), sort_keys=True).encode("utf-8"))
        signed = f"{_VERSION}.{body}"
        return f"{signed}.{self._mac(signed)}", expires_at

    def verify(self, ticket: str | None, run_id: str | None) -> Ticket:
        """The ticket's grant for ``run_id`` (``None``: the run list); raises
        :class:`TicketError` on anything but a valid, current ticket for exactly that. (Whether
        its key still holds is ``require_ticket_key``.)"""
        if not ticket:
            raise TicketError(f"missing ticket: {_NEW_TICKET}", code="ticket_missing")
        parts = ticket.split(".")
        # Tickets are ASCII (base64url and dots); a query's ticket may hold anything its URL
        # percent-decoded to, which neither the MAC's encoding nor compare_digest takes.
        if len(parts) != 3 or parts[0] != _VERSION or not ticket.isascii():
            raise _not_a_ticket()
        signed = f"{parts[0]}.{parts[1]}"
        if not hmac.compare_digest(self._mac(signed), parts[2]):
            raise TicketError(
                "this ticket is not valid: its signature does not match (it was changed, cut "
                f"short, or signed by another installation); {_NEW_TICKET}",
                code="ticket_invalid",
            )
        try:
            claims = json.loads(_unb64(parts[1]))
            listing = claims.get("scope") == RUN_LIST_SCOPE and "run" not in claims
            grant = Ticket(
                None if listing else str(claims["run"]),
                parse_role(str(claims["role"])),
                str(claims.get("kid") or ""),
                float(claims["exp"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError, binascii.Error, UnknownRoleError):
            raise _not_a_ticket() from None
        if not grant.key_id:
            raise TicketError(f"this ticket names no key; {_NEW_TICKET}", code="ticket_invalid")
        if grant.expires_at <= self._clock():
            raise TicketError(f"this ticket has expired; {_NEW_TICKET}", code="ticket_expired")
        if grant.run_id != run_id:
            if run_id is None:
                wrong = (
                    'this ticket is for one run, not the run list; get one with {"scope": "runs"}'
                )
            elif grant.run_id is None:
                wrong = "this ticket is for the run list; get one for this run"
            else:
                wrong = "this ticket is for another run; get one for this run"
            raise TicketError(f"{wrong} from POST /v1/tickets", code="ticket_wrong_run", status=403)
        return grant


def _not_a_ticket() -> TicketError:
    return TicketError(f"this is not a ticket (malformed); {_NEW_TICKET}", code="ticket_invalid")


def key_access_problem(key: ApiKeyRecord | None, role: Role) -> TicketError | None:
    """Why ``key`` no longer backs a grant of ``role`` (revoked, gone, or now below it), if so."""
    if key is None or key.revoked_at is not None:
        return TicketError(
            "the key that asked for this ticket has been revoked", code="ticket_key_revoked"
        )
    try:
        current = parse_role(key.role)
    except UnknownRoleError:
        current = None
    if current is None or current < role:
        return TicketError(
            f"the key that asked for this ticket no longer has the {role.label} role; "
            f"{_NEW_TICKET}",
            code="ticket_role_lost",
        )
    return None


async def require_ticket_key(store: KeyStore, grant: Ticket) -> None:
    """Refuse a ticket whose key was revoked or no longer holds the ticket's role."""
    problem = key_access_problem(await store.get_api_key(grant.key_id), grant.role)
    if problem is not None:
        raise problem
