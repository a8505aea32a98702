"""Shared test setup: no real network, isolated data directory, the fake scripts, test tiers, the
process's logging restored after each test (``support.process_logging``).

Every test has exactly one tier (``unit``, ``inprocess``, ``external``), assigned and checked by
``support.tiers``; ``make test-fast`` runs the first two.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# The helpers' asserts explain themselves too (and support.tiers is a plugin, below).
pytest.register_assert_rewrite("support")

from support import registries  # noqa: E402

# The production registries before any helper or test module is imported (checked after collection).
_REGISTRIES_BEFORE_IMPORTS = registries.snapshot()

from support import fakes, tiers  # noqa: E402

from thoughtgate.events.catalogue import strict  # noqa: E402
from thoughtgate.store.memory import MemoryStore  # noqa: E402

# support.process_logging: every test leaves the process's logging as it found it; pytester:
# its own test runs a pytest session inside this one.
pytest_plugins = ("support.tiers", "support.process_logging", "pytester")

# Every event a producer appends in these tests is validated against the catalogue first.
strict(True)

# The machine is shared and noisy: Hypothesis examples are bounded by count, never by wall time.
settings.register_profile(
    "thoughtgate", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("thoughtgate")

_LOOPBACK = ("127.", "::1", "localhost")
_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _guard(address: Any) -> None:
    host = address[0] if isinstance(address, tuple) else address
    if isinstance(host, str) and host.startswith(_LOOPBACK):
        return
    if isinstance(address, str | bytes):  # unix sockets
        return
    raise RuntimeError(f"tests must not touch the network: connect to {address!r} refused")


def _guarded_connect(self: socket.socket, address: Any) -> None:
    _guard(address)
    tiers.note_connect(self, address)
    _real_connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: Any) -> int:
    _guard(address)
    tiers.note_connect(self, address)
    return _real_connect_ex(self, address)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Importing the helpers and the collected test modules left the production registries as
    they were: fakes are registered by fixtures (``fake_scripts``), never at import time."""
    changed = registries.changes(_REGISTRIES_BEFORE_IMPORTS)
    if changed:
        raise pytest.UsageError(
            "importing the tests changed a production registry (register fakes through "
            "support.fakes or hand them to a FakeProvider instead):\n  " + "\n  ".join(changed)
        )


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real providers are never called from tests; only loopback is reachable."""
    monkeypatch.setattr(socket.socket, "connect", _guarded_connect)
    monkeypatch.setattr(socket.socket, "connect_ex", _guarded_connect_ex)


@pytest.fixture(autouse=True)
def _isolated_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """No user config, keys or data directory leak into tests."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "data"))
    monkeypatch.setenv("HOME", str(home))
    for name in (
        "THOUGHTGATE_CONFIG",
        "THOUGHTGATE_DB",
        "ANTHROPIC_API_KEY",
        "OPENAI_API_KEY",
        "OPENROUTER_API_KEY",
        "ANTHROPIC_BASE_URL",
        "OPENAI_BASE_URL",
        "OPENROUTER_BASE_URL",
    ):
        monkeypatch.delenv(name, raising=False)
    import os

    for name in list(os.environ):
        if name.startswith("THOUGHTGATE_"):
            monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session", autouse=True)
def fake_scripts() -> Iterator[None]:
    """The tests' fake scripts (``fake:canary``, ``fake:story``, ...): the one place this process
    registers them, for the whole session."""
    with fakes.registered():
        yield


@pytest.fixture
def memory_store() -> Iterator[MemoryStore]:
    yield MemoryStore()
