"""The five reader roles and their order; an unknown name is an error, never a default."""

from __future__ import annotations

from enum import IntEnum

from thoughtgate.errors import UnknownRoleError

__all__ = ["ROLE_NAMES", "Role", "parse_role"]


class Role(IntEnum):
    """Ordered so that ``role >= Role.DEVELOPER`` reads as "developer and above"."""

    VIEWER = 10
    MEMBER = 20
    DEVELOPER = 30
    ADMIN = 40
    OWNER = 50

    @property
    def label(self) -> str:
        return self.name.lower()

    def __str__(self) -> str:
        return self.label


ROLE_NAMES: tuple[str, ...] = tuple(r.label for r in Role)


def parse_role(value: str | Role) -> Role:
    """``"developer"`` -> ``Role.DEVELOPER``; anything unknown raises :class:`UnknownRoleError`."""
    if isinstance(value, Role):
        return value
    try:
        return Role[str(value).strip().upper()]
    except KeyError:
        raise UnknownRoleError(
            f"unknown role {value!r}; allowed: {', '.join(ROLE_NAMES)}"
        ) from None
