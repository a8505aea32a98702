"""The check conftest runs after collection: a test module that registers a fake script (or
changes any production registry) when imported is named, so the suite stops before running."""

from __future__ import annotations

from typing import Any

import pytest
from support import registries

from thoughtgate.testing.fake import FAKE_SCRIPTS


def _script(request: Any, turn: int) -> list[Any]:
    return []


def test_a_registration_after_the_snapshot_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    before = registries.snapshot()
    assert registries.changes(before) == []
    monkeypatch.setitem(FAKE_SCRIPTS, "import-time", _script)
    monkeypatch.setitem(FAKE_SCRIPTS, "echo", _script)
    assert registries.changes(before) == [
        "thoughtgate.testing.fake.FAKE_SCRIPTS['echo'] replaced",
        "thoughtgate.testing.fake.FAKE_SCRIPTS['import-time'] added",
    ]
