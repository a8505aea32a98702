"""The fake provider's outage (``fake:outage``, the tests' and the web page's stand-in for a
provider that is down) fails a run exactly as a real adapter's 529 does (ADR 0073).

A real adapter marks an HTTP error body's ``message`` as the provider's own text
(``by_provider``): the public ``error`` says which provider answered what status and type, and
the words go to the developer-only ``error_detail``. The fake raised its error unmarked, so its
"Overloaded" went into the public ``error`` as if thoughtgate had written it, and every test and
screenshot built on it showed the old shape.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from support.replay import provider_with
from support.scripts import outage

from thoughtgate.config import Config
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.providers.base import Provider
from thoughtgate.store.memory import MemoryStore
from thoughtgate.testing.fake import FakeProvider

pytestmark = pytest.mark.unit


def _anthropic(model: str) -> Provider:
    body = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    return provider_with(httpx.MockTransport(lambda _: httpx.Response(529, json=body)))


def _fake(model: str) -> Provider:
    return FakeProvider(outage, model=model)


async def _ending(factory: Any, model: str) -> dict[str, Any]:
    store = MemoryStore()
    runtime = Runtime(store, Config(), provider_factory=factory)
    run = await runtime.create_run(RunRequest("go", model=model, chain_of_thought="surface"))
    await runtime.execute(run.run_id)
    end = (await store.read(run.run_id))[-1]
    assert end.type == "run.failed"
    return dict(end.payload)


async def test_the_fake_outage_ends_a_run_as_a_real_adapter_s_529_does() -> None:
    real = await _ending(_anthropic, "anthropic:claude-sonnet-4-5")
    fake = await _ending(_fake, "fake:outage")
    assert real["error"] == "provider anthropic returned HTTP 529 (overloaded_error)"
    assert fake["error"] == "provider fake returned HTTP 529 (overloaded)"
    assert real["error_detail"] == fake["error_detail"] == "Overloaded"
    assert (real["error_type"], fake["error_type"]) == ("overloaded_error", "overloaded")
