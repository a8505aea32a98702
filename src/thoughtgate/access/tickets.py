"""Live-channel tickets: short-lived, signed, bound to one run and to the asker's role.

A browser ``EventSource`` cannot send an ``Authorization`` header, so the SSE channel is opened
with a ticket in the query string instead of an API key. A caller with a key asks
``POST /v1/tickets {run_id}`` and gets::

    v1.<base64url(JSON claims)>.<base64url(HMAC-SHA256(secret, "v1." + claims))>

with claims ``{"run": run_id, "role": "viewer", "kid": key_id, "exp": unix_seconds}``. The
server verifies the MAC in constant time, then the expiry, then the run. The ticket never grants
more than the key that asked for it (its role is copied, not chosen) and may be reused until it
expires so that a client can reconnect with ``Last-Event-ID``; it only opens connections, it does
not bound how long an open stream lasts.

Errors: a malformed, forged or expired ticket is :class:`AuthenticationError` (401); a valid
ticket for another run is :class:`AccessDeniedError` (403).
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
from thoughtgate.errors import AccessDeniedError, AuthenticationError, UnknownRoleError
from thoughtgate.store.base import EventStore

__all__ = ["SECRET_NAME", "Ticket", "TicketSigner", "ticket_secret"]

SECRET_NAME = "ticket_hmac"
"""Name of the generated HMAC key in ``EventStore.get_or_create_secret``."""

_VERSION = "v1"


@dataclass(frozen=True, slots=True)
class Ticket:
    """What a verified ticket allows: reading ``run_id`` as ``role`` until ``expires_at``."""

    run_id: str
    role: Role
    key_id: str
    expires_at: float


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


async def ticket_secret(store: EventStore, configured: str | None) -> str:
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

    def issue(self, run_id: str, role: Role, *, key_id: str = "") -> tuple[str, float]:
        """``(ticket, expires_at)`` for reading ``run_id`` with ``role``."""
        expires_at = round(self._clock() + self.ttl_s, 3)
        claims = {"run": run_id, "role": role.label, "kid": key_id, "exp": expires_at}
        body = _b64(json.dumps(claims, separators=(",", ":"), sort_keys=True).encode("utf-8"))
        signed = f"{_VERSION}.{body}"
        return f"{signed}.{self._mac(signed)}", expires_at

    def verify(self, ticket: str | None, run_id: str) -> Ticket:
        """The ticket's grant for ``run_id``; raises on anything but a valid, current ticket."""
        if not ticket:
            raise AuthenticationError("missing ticket: get one from POST /v1/tickets")
        parts = ticket.split(".")
        if len(parts) != 3 or parts[0] != _VERSION:
            raise AuthenticationError("malformed ticket")
        signed = f"{parts[0]}.{parts[1]}"
        if not hmac.compare_digest(self._mac(signed), parts[2]):
            raise AuthenticationError("invalid ticket signature")
        try:
            claims = json.loads(_unb64(parts[1]))
            grant = Ticket(
                str(claims["run"]),
                parse_role(str(claims["role"])),
                str(claims.get("kid", "")),
                float(claims["exp"]),
            )
        except (ValueError, KeyError, TypeError, binascii.Error, UnknownRoleError):
            raise AuthenticationError("malformed ticket") from None
        if grant.expires_at <= self._clock():
            raise AuthenticationError("ticket expired: get a new one from POST /v1/tickets")
        if grant.run_id != run_id:
            raise AccessDeniedError("this ticket is for another run")
        return grant
