"""Every module states its public surface in an ``__all__`` (that it is sorted and names only real
objects is ruff's to check in ``make lint``: RUF022, F822)."""

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


@pytest.mark.parametrize("name", MODULES)
def test_every_module_has_an_all(name: str) -> None:
    assert hasattr(importlib.import_module(name), "__all__"), f"{name} has no __all__"


def test_the_license_file_is_the_one_pyproject_names() -> None:
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"  # an SPDX expression
    assert project["license-files"] == ["LICENSE"]
    text = (root / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text, "the full text, not a pointer to it"
