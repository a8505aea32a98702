"""A failure's own words reach developers only: the canary for ``error_detail`` (ADR 0071).

A provider's error text is written by the provider, not by thoughtgate: an HTTP error body's
``message``, OpenRouter's ``metadata.raw`` (the upstream's own error body, which may quote the
request it refused -- earlier turns' reasoning included), an in-stream ``error`` event. An inline
worker's exception is user code's. Each of them once went into the run's and the task's public
``error`` as written. Here each carries a reasoning-like secret; a viewer must never read it
(run view, events, the SSE stream, the CLI), while a developer reads it in ``error_detail`` on a
``surface`` run, where reasoning itself is shown.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.daemon import Daemon, cli, running_daemon, stream_all
from support.replay import provider_with

from thoughtgate.access.filter import filter_events, filter_run
from thoughtgate.config import Config
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.providers.base import Provider, ProviderSettings
from thoughtgate.providers.openrouter import OpenRouterProvider
from thoughtgate.store.urls import open_store

TAG = "SECRETREASONING"

Respond = Callable[[str], httpx.Response]
"""A provider's failing answer, built around the secret."""


def _anthropic_http(secret: str) -> httpx.Response:
    body = {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": f"messages.1: {secret}"},
    }
    return httpx.Response(400, json=body)


def _openrouter_raw(secret: str) -> httpx.Response:
    raw = json.dumps({"error": {"message": f"thinking block: {secret}"}})
    body = {
        "error": {
            "code": 400,
            "message": "Provider returned error",
            "metadata": {"raw": raw, "provider_name": "Anthropic"},
        }
    }
    return httpx.Response(400, json=body)


def _anthropic_stream_error(secret: str) -> httpx.Response:
    data = json.dumps({"type": "error", "error": {"type": "overloaded_error", "message": secret}})
    body = f"event: error\ndata: {data}\n\n"
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, text=body)


def _openrouter_stream_error(secret: str) -> httpx.Response:
    data = json.dumps({"error": {"code": 502, "message": secret}, "choices": []})
    body = f"data: {data}\n\n"
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, text=body)


SOURCES: dict[str, tuple[str, Respond]] = {
    # name: (model, answer)
    "anthropic http body": ("anthropic:claude-sonnet-4-5", _anthropic_http),
    "openrouter metadata.raw": ("openrouter:anthropic/claude-sonnet-4.5", _openrouter_raw),
    "anthropic error event": ("anthropic:claude-sonnet-4-5", _anthropic_stream_error),
    "openrouter error chunk": ("openrouter:anthropic/claude-sonnet-4.5", _openrouter_stream_error),
}


def _factory(respond: Respond, secret: str) -> Callable[[str], Provider]:
    transport = httpx.MockTransport(lambda request: respond(secret))

    def make(model: str) -> Provider:
        if model.startswith("openrouter:"):
            settings = ProviderSettings(
                base_url="http://replay.invalid", api_key="k", max_retries=0, timeout_s=5.0
            )
            return OpenRouterProvider(
                model.split(":", 1)[1], settings, client=httpx.AsyncClient(transport=transport)
            )
        return provider_with(transport)

    return make


def _worker(secret: str) -> Callable[[str], str]:
    def worker(prompt: str) -> str:
        raise ValueError(f"the model thought: {secret}")

    return worker


@dataclass(frozen=True, slots=True)
class Reads:
    status: str
    viewer: str
    """The run view and events, as a viewer reads them (JSON text)."""
    developer: str
    """The same, for a developer."""
    developer_payloads: list[dict[str, Any]]
    recorded: str
    """Every payload the log holds, unfiltered."""


async def _reads(runtime: Runtime, request: RunRequest, mode: str, backend: str | None) -> Reads:
    store = runtime.store
    with contextlib.suppress(Exception):  # a run that errors raises; it is recorded
        await runtime.run(request, chain_of_thought=mode, worker_backend=backend)
    (record,) = await store.list_runs(limit=1)
    log = await store.read(record.run_id)

    def read(role: str) -> tuple[str, list[dict[str, Any]]]:
        events = [e.to_dict() for e in filter_events(log, role, mode=mode)]
        view = filter_run(record, role).to_json()
        return json.dumps([view, events]), [e["payload"] for e in events]

    viewer, _ = read("viewer")
    developer, payloads = read("developer")
    recorded = json.dumps([e.payload for e in log])
    return Reads(record.status, viewer, developer, payloads, recorded)


def _run(source: str, secret: str, mode: str) -> Reads:
    async def main() -> Reads:
        store = await open_store("memory://")
        try:
            if source == "inline worker":
                runtime = Runtime(store, Config(), inline_workers={"default": _worker(secret)})
                return await _reads(runtime, RunRequest("Why?"), mode, "inline")
            model, respond = SOURCES[source]
            runtime = Runtime(store, Config(), provider_factory=_factory(respond, secret))
            return await _reads(runtime, RunRequest("Why?", model=model), mode, None)
        finally:
            await store.close()

    return asyncio.run(main())


secrets = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40).map(
    lambda t: f"{TAG}{t}"
)


@pytest.mark.unit
@pytest.mark.parametrize("source", [*SOURCES, "inline worker"])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(secret=secrets)
def test_a_viewer_never_reads_a_failure_s_own_words(source: str, secret: str) -> None:
    reads = _run(source, secret, "surface")
    assert reads.status in ("failed", "error")
    assert TAG not in reads.viewer, "the provider's or the worker's words reached a viewer"
    assert '"error"' in reads.viewer, "a viewer still learns that and how it failed"
    details = [p["error_detail"] for p in reads.developer_payloads if "error_detail" in p]
    assert any(TAG in d for d in details), "a developer reads them in error_detail"


@pytest.mark.unit
@pytest.mark.parametrize("mode", ["hidden", "telemetry_only"])
def test_no_display_reader_gets_the_detail_where_reasoning_is_not_shown(mode: str) -> None:
    """The detail may quote reasoning: on a run whose reasoning goes nowhere on display, neither
    does it (developers included)."""
    for source in [*SOURCES, "inline worker"]:
        reads = _run(source, f"{TAG}-{mode}", mode)
        assert TAG not in reads.viewer, source
        assert TAG not in reads.developer, source
        if mode == "hidden":  # its reasoning is recorded nowhere, nor a quote of it
            assert TAG not in reads.recorded, source


@pytest.mark.unit
def test_the_public_error_names_the_provider_status_and_type() -> None:
    reads = _run("anthropic http body", f"{TAG}x", "surface")
    assert "provider anthropic returned HTTP 400 (invalid_request_error)" in reads.viewer
    reads = _run("openrouter error chunk", f"{TAG}x", "surface")
    assert "provider openrouter reported an error in the stream" in reads.viewer


# --------------------------------------------------------------------------- the read paths


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    secret = f"{TAG}-daemon"
    respond = SOURCES["openrouter metadata.raw"][1]
    with running_daemon(provider_factory=_factory(respond, secret)) as d:
        yield d


@pytest.mark.inprocess
@pytest.mark.parametrize("role", ["viewer", "member", "developer"])
def test_http_and_sse_show_the_detail_to_developers_only(daemon: Daemon, role: str) -> None:
    run_id = daemon.start_run(
        {
            "prompt": "Why?",
            "model": "openrouter:anthropic/claude-sonnet-4.5",
            "chain_of_thought": "surface",
        }
    )
    assert daemon.wait_done(run_id)["status"] in ("failed", "error")
    developer = role == "developer"
    with daemon.client(role) as c:
        run = c.get(f"/v1/runs/{run_id}")
        events = c.get(f"/v1/runs/{run_id}/events")
    response, stream = stream_all(daemon, run_id, role)
    assert run.status_code == events.status_code == response.status_code == 200
    assert TAG not in run.text, "the run view carries only the public error"
    assert "provider openrouter returned HTTP 400" in run.text
    assert (TAG in events.text) == developer, events.text
    assert (TAG in stream) == developer


@pytest.mark.external
@pytest.mark.parametrize("role", ["viewer", "developer"])
def test_cli_reads_show_the_detail_to_developers_only(tmp_path: Path, role: str) -> None:
    secret = f"{TAG}-{uuid.uuid4().hex[:8]}"
    db = f"sqlite:///{tmp_path / 'cli.db'}"

    async def record() -> str:
        store = await open_store(db)
        try:
            runtime = Runtime(store, Config(), inline_workers={"default": _worker(secret)})
            done = await runtime.run(
                RunRequest("Why?"), chain_of_thought="surface", worker_backend="inline"
            )
            return done.run_id
        finally:
            await store.close()

    run_id = asyncio.run(record())
    for args in (["events"], ["events", "--json"], ["status"], ["status", "--json"]):
        done = cli(*args, run_id, "--db", db, "--view-as", role)
        assert done.returncode == 0, (args, done.stderr)
        expected = role == "developer" and args[0] == "events"
        assert (secret in done.stdout) == expected, (args, role)
        assert "ValueError" in done.stdout, args


def _anthropic_malformed_event(secret: str) -> httpx.Response:
    """A stream whose thinking block holds the secret, then a delta of the wrong shape (its
    ``delta`` the secret as a string, not an object): the adapter's own check fails the turn."""
    events = [
        ("message_start", {"type": "message_start", "message": {"id": "msg_1", "model": "m"}}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "thinking", "thinking": secret, "signature": ""},
            },
        ),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": secret}),
    ]
    body = "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events)
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, text=body)


@pytest.mark.unit
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(secret=secrets)
def test_a_malformed_events_reasoning_and_its_check_s_words_reach_developers_only(
    secret: str,
) -> None:
    """A malformed event fails the run with thoughtgate's description of its shape; the words
    of the exception the adapter's check caught (a library's, which may quote what it was
    given) are in the developer-only ``error_detail``, and a viewer's view holds no fragment of
    the event's reasoning."""
    SOURCES["anthropic malformed event"] = (
        "anthropic:claude-sonnet-4-5",
        _anthropic_malformed_event,
    )
    try:
        reads = _run("anthropic malformed event", secret, "surface")
    finally:
        del SOURCES["anthropic malformed event"]
    assert reads.status == "failed"
    assert TAG not in reads.viewer
    assert "content_block_delta event is missing a field or has a wrong type" in reads.viewer
    assert "string indices" not in reads.viewer, "a library's words in the public error"
    assert TAG in reads.developer  # the reasoning itself, for a developer on a surface run
    details = [p["error_detail"] for p in reads.developer_payloads if "error_detail" in p]
    assert any("TypeError: string indices must be integers" in d for d in details), details
