"""The production registries a test module must not change by being imported.

A test that needs a fake script registers it through ``support.fakes`` (conftest's
``fake_scripts`` fixture) or hands it to a ``FakeProvider`` itself; a registration at import time
would leak into every test collected after it, and into none when the module runs alone. conftest
snapshots these before any test module is imported and checks them once collection is done.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from thoughtgate.providers.base import PROVIDER_MODULES
from thoughtgate.providers.registry import ENDPOINTS
from thoughtgate.testing.fake import FAKE_SCRIPTS

REGISTRIES: dict[str, Mapping[str, Any]] = {
    "thoughtgate.testing.fake.FAKE_SCRIPTS": FAKE_SCRIPTS,
    "thoughtgate.providers.registry.ENDPOINTS": ENDPOINTS,
    "thoughtgate.providers.base.PROVIDER_MODULES": PROVIDER_MODULES,
}

Snapshot = dict[str, dict[str, Any]]


def snapshot() -> Snapshot:
    return {name: dict(registry) for name, registry in REGISTRIES.items()}


def changes(before: Snapshot) -> list[str]:
    """Each entry added, replaced or removed since ``before``, as ``registry[key]: how``."""
    out: list[str] = []
    for name, registry in REGISTRIES.items():
        old = before[name]
        for key in sorted(set(old) | set(registry)):
            if key not in old:
                out.append(f"{name}[{key!r}] added")
            elif key not in registry:
                out.append(f"{name}[{key!r}] removed")
            elif registry[key] is not old[key]:
                out.append(f"{name}[{key!r}] replaced")
    return out
