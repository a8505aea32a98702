"""The adapter tests' emulator: one per test module, with the built-in scenarios."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from thoughtgate.testing.emulator import Emulator, EmulatorServer, serve_emulator


@pytest.fixture(scope="module")
def server() -> Iterator[EmulatorServer]:
    with serve_emulator(Emulator()) as srv:
        yield srv
