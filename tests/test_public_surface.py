"""Every module states its public surface in a sorted ``__all__`` that names only real objects."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import thoughtgate

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(thoughtgate.__path__, "thoughtgate.")
    if not m.name.endswith("__main__")
)


def isort_key(name: str) -> tuple[int, str]:
    """Constants, then classes, then functions (ruff's RUF022 order)."""
    if name.isupper() or (name.replace("_", "").isupper() and len(name) > 1):
        return (0, name)
    return (1, name) if name[:1].isupper() else (2, name)


@pytest.mark.parametrize("name", MODULES)
def test_all_is_sorted_and_resolves(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{name} has no __all__"
    assert list(exported) == sorted(exported, key=isort_key), f"{name}.__all__ is not sorted"
    for item in exported:
        assert hasattr(module, item), f"{name}.__all__ names {item!r}, which does not exist"


def test_the_license_file_is_the_one_pyproject_names() -> None:
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    declared = tomllib.loads((root / "pyproject.toml").read_text())["project"]["license"]
    assert declared == {"text": "Apache-2.0"}
    text = (root / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text, "the full text, not a pointer to it"
