"""Pydantic's validation errors of a configuration, in the words of the one who wrote it.

Pydantic says "Input should be less than or equal to 65535" about a model's field; the writer of
``thoughtgate.toml`` (or of ``THOUGHTGATE_SERVER__PORT``) needs where the value is, its key path,
the value and what is expected there -- ``thoughtgate.toml: server.port = 70000: expected a whole
number from 0 to 65535`` -- for every problem at once, a line each (:class:`ConfigError`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias, get_args

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from thoughtgate.errors import ConfigError

__all__ = ["Location", "Origin", "config_error"]

Location: TypeAlias = tuple[str | int, ...]
"""A value's place in the configuration: section, key (and list index)."""

Origin: TypeAlias = Callable[[Location, bool], str]
"""Where the value at a location came from (a file, a variable), given whether it is a table."""


def config_error(
    exc: ValidationError, model: type[BaseModel], source: str, origin: Origin | None = None
) -> ConfigError:
    """Every problem pydantic found, one :class:`ConfigError` line each; ``origin`` names where a
    key's value came from (a file, a variable), given its path and whether the value is a whole
    table, else every line names ``source``."""
    errors = [
        _problem(err, model, source if origin is None else origin(err["loc"], _is_table(err)))
        for err in exc.errors()
    ]
    first, *others = errors
    return ConfigError(
        first.key,
        first.value,
        first.allowed,
        source=first.source,
        problem=first.problem,
        also=others,
    )


_SECRET_WORDS = ("key", "secret", "token", "password")


def _names_a_secret(loc: Location) -> bool:
    """Whether the innermost key of ``loc`` names a credential (``api_key``, ``token``...)."""
    names = [p.lower() for p in loc if isinstance(p, str)]
    return bool(names) and any(word in names[-1] for word in _SECRET_WORDS)


_URL_PASSWORD = re.compile(r"://[^/@\s]*:[^/@\s]*@")
"""A URL's ``user:password@`` (a database's, a gateway's)."""


def _holds_a_secret(loc: Location, value: object) -> bool:
    """Whether the value at ``loc`` may be a secret: a credential key's, or a URL with a
    password in it (``store.url = "postgress://user:password@..."``)."""
    return _names_a_secret(loc) or (isinstance(value, str) and bool(_URL_PASSWORD.search(value)))


def _is_table(err: Mapping[str, Any]) -> bool:
    return isinstance(err.get("input"), Mapping)


def _problem(err: Mapping[str, Any], model: type[BaseModel], where: str) -> ConfigError:
    """One pydantic error in the words of a config file: what is expected there, not pydantic's
    "Input should be ..." about a model."""
    loc = tuple(err["loc"])
    key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    kind = err["type"]
    # The line is printed and logged: a value that may be a secret is not repeated in it. That
    # is any value under an unknown key (``api_kye = "sk-..."`` is a key with a typo), any
    # value of a key named for a credential and any URL with a password.
    value = (
        None
        if kind == "extra_forbidden" or _holds_a_secret(loc, err.get("input"))
        else err.get("input")
    )
    msg = str(err.get("msg", ""))
    if kind == "extra_forbidden":
        check = "the spelling" if len(loc) == 1 else "the spelling and the section"
        unknown = "section" if len(loc) == 1 else "key"
        return ConfigError(
            key, value, "", source=where, problem=f"no such {unknown} (check {check})"
        )
    if kind == "missing":
        return ConfigError(key, None, _expected(model, loc) or "a value", source=where)
    withheld = value is None and err.get("input") is not None
    if kind == "value_error":  # our validators' own words
        said = msg.removeprefix("Value error, ") + (" (the value is not shown)" if withheld else "")
        return ConfigError(key, value, "", source=where, problem=said)
    ctx = err.get("ctx") or {}
    expected = _expected(model, loc)
    if kind == "literal_error" and "expected" in ctx:
        expected = f"one of {ctx['expected']}"
    if withheld:
        # a secret's value is not repeated, but it was set: not "is not set; it needs ..."
        said = f"expected {expected}" if expected is not None else msg[:1].lower() + msg[1:]
        return ConfigError(key, None, "", source=where, problem=f"{said} (the value is not shown)")
    if expected is not None:
        return ConfigError(key, value, expected, source=where)
    return ConfigError(key, value, "", source=where, problem=msg[:1].lower() + msg[1:])


def _expected(root: type[BaseModel], loc: Location) -> str | None:
    """What the field at ``loc`` of ``root`` takes, in a TOML writer's words, with its bounds."""
    model: Any = root
    field: FieldInfo | None = None
    for part in loc:
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or isinstance(part, int):
            return None
        field = model.model_fields.get(part)
        if field is None:
            return None
        model = _without_none(field.annotation)
    if field is None:
        return None
    if isinstance(model, type) and issubclass(model, BaseModel):
        return "a table of settings"
    kinds: dict[Any, str] = {
        bool: "true or false",
        int: "a whole number",
        float: "a number",
        str: "a string",
    }
    kind = kinds.get(model)
    return None if kind is None else kind + _bounds(field.metadata)


def _without_none(annotation: Any) -> Any:
    """``X`` of ``X | None``."""
    args = [a for a in get_args(annotation) if a is not type(None)]
    return args[0] if len(args) == 1 and type(None) in get_args(annotation) else annotation


def _bounds(metadata: list[Any]) -> str:
    """A field's numeric constraints in words, for after its kind: "from 0 to 65535", "above 0",
    "at least 1024" (with a leading space), or nothing."""
    found = {
        name: getattr(item, name)
        for item in metadata
        for name in ("gt", "ge", "lt", "le")
        if getattr(item, name, None) is not None
    }
    if "ge" in found and "le" in found:
        return f" from {found['ge']} to {found['le']}"
    words = {"gt": "above", "ge": "at least", "lt": "below", "le": "at most"}
    said = [f"{words[name]} {found[name]}" for name in ("gt", "ge", "lt", "le") if name in found]
    return f" {' and '.join(said)}" if said else ""
