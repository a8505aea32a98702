"""The key store: API keys (their hashes only) and named server secrets.

Separate from the log and the run index because the code that needs it -- authentication, key
administration, ticket signing (``thoughtgate.access``) -- needs nothing else from the store.
"""

from __future__ import annotations

import abc

from thoughtgate.store.records import ApiKeyRecord

__all__ = ["KeyStore"]


class KeyStore(abc.ABC):
    """API keys and server secrets."""

    @abc.abstractmethod
    async def save_api_key(self, key: ApiKeyRecord) -> None:
        """Insert or replace a key (by ``key_id``)."""

    @abc.abstractmethod
    async def list_api_keys(self) -> list[ApiKeyRecord]:
        """Every key, revoked ones too, oldest first."""

    @abc.abstractmethod
    async def get_api_key(self, key_id: str) -> ApiKeyRecord | None:
        """The key with exactly this id, revoked or not: a ticket's redemption checks its key
        on every request, so it reads one row by the primary key, not every key."""

    @abc.abstractmethod
    async def find_api_key(self, key_hash: str) -> ApiKeyRecord | None:
        """The active (not revoked) key with this hash, if any."""

    @abc.abstractmethod
    async def revoke_api_key(self, key_id: str) -> bool:
        """Revoke the active key with exactly this id (never by name: names are resolved to one
        id by ``access.keys.revoke_key``); ``False`` when no active key has it."""

    @abc.abstractmethod
    async def get_or_create_secret(self, name: str, candidate: str) -> str:
        """A named server secret; the first caller's ``candidate`` wins (e.g. the ticket key)."""
