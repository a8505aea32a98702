"""The daemon's router (``server.routing.DepthRouter``) answers every request exactly as
Starlette's own router does: the same status, headers and body, for the routes' successes and for
the errors routing decides (404, 405) or lets the route decide (401, 422, a run that does not
exist); the trailing-slash redirect goes where Starlette's does, but as a path on the daemon,
never built from the request's ``Host`` (ADR 0128)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Router
from support.daemon import auth

from thoughtgate.access.keys import create_key
from thoughtgate.access.tickets import TicketSigner
from thoughtgate.config import Config
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.server.app import create_app
from thoughtgate.server.middleware import OVERHEAD_HEADER
from thoughtgate.server.routing import DepthRouter
from thoughtgate.store.memory import MemoryStore

pytestmark = pytest.mark.unit


def _apps(store: MemoryStore) -> tuple[Starlette, Starlette]:
    """The daemon's app, and the same app routed by Starlette's router; their tickets are
    signed at one fixed time, so that both issue the same ticket."""
    ours, theirs = create_app(store), create_app(store)
    assert isinstance(ours.router, DepthRouter)
    theirs.router = Router(theirs.router.routes)
    signer = TicketSigner("routing-test-secret", ttl_s=60, clock=lambda: 1_000_000.0)
    for app in (ours, theirs):
        app.state.thoughtgate._signer = signer
    return ours, theirs


def _answer(response: httpx.Response) -> tuple[int, list[tuple[str, str]], bytes]:
    headers = [(k, v) for k, v in response.headers.multi_items() if k != OVERHEAD_HEADER]
    return response.status_code, headers, response.content


async def _ask(app: Starlette, method: str, path: str, **options: Any) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://daemon") as client:
        return await client.request(method, path, **options)


async def test_every_answer_is_the_one_starlettes_router_gives() -> None:
    store = MemoryStore()
    key = auth((await create_key(store, name="owner", role="owner")).key)
    ours, theirs = _apps(store)
    run = await Runtime(store, Config()).run(
        RunRequest(prompt="hi", model="fake:echo"), chain_of_thought="surface"
    )
    run_id = run.run_id
    assert run.status == "completed"
    ticket = (await _ask(ours, "POST", "/v1/tickets", json={"run_id": run_id}, headers=key)).json()
    requests: list[tuple[str, str, dict[str, Any]]] = [
        ("GET", "/healthz", {}),
        ("GET", "/openapi.json", {}),
        ("GET", "/", {}),
        ("GET", "/static/app.css", {}),
        ("GET", "/static/missing.css", {}),
        ("GET", "/v1/me", {"headers": key}),
        ("HEAD", "/v1/me", {"headers": key}),
        ("GET", "/v1/runs", {"headers": key}),
        ("GET", "/v1/runs?limit=1", {"headers": key}),
        ("GET", "/v1/tools", {"headers": key}),
        ("GET", f"/v1/runs/{run_id}", {"headers": key}),
        ("GET", f"/v1/runs/{run_id}/events", {"headers": key}),
        ("GET", f"/v1/runs/{run_id}/trace", {"headers": key}),
        ("POST", "/v1/tickets", {"headers": key, "json": {"run_id": run_id}}),
        ("GET", f"/v1/runs/{run_id}/stream?ticket={ticket['ticket']}", {}),
        # errors
        ("GET", "/v1/me", {}),
        ("GET", "/v1/nothing", {"headers": key}),
        ("GET", "/v1/runs/a/b/c/d/e", {"headers": key}),
        ("PUT", "/v1/runs", {"headers": key}),
        ("DELETE", f"/v1/runs/{run_id}", {"headers": key}),
        ("GET", "/v1/tickets", {"headers": key}),
        ("GET", "/v1/runs/follow", {"headers": key}),
        ("GET", "/v1/runs/run_missing", {"headers": key}),
        ("GET", "/v1/runs?bogus=1", {"headers": key}),
        ("POST", "/v1/tickets", {"headers": key, "content": b"{"}),
        ("POST", "/v1/runs", {"headers": key, "json": {"prompt": 1}}),
        ("GET", f"/v1/runs/{run_id}/stream", {}),
        ("GET", f"/v1/runs/{run_id}/stream?ticket=v1.forged.mac", {}),
        ("GET", "/v1/runs/stream", {}),
    ]
    for method, path, options in requests:
        answer = _answer(await _ask(ours, method, path, **options))
        assert answer == _answer(await _ask(theirs, method, path, **options)), (method, path)
        assert answer[0] != 500, (method, path)


@pytest.mark.parametrize(
    "path",
    ["/v1/runs/", "/healthz/", "/static", "/static?x=%2F&y", "/v1/runs//", "/v1/me/?a=b"],
)
async def test_a_slash_redirect_goes_where_starlettes_does_as_a_path(path: str) -> None:
    """The same status and target as Starlette's redirect; its ``Location`` a path (with the
    query), not the absolute URL Starlette builds from the caller's ``Host``."""
    ours, theirs = _apps(MemoryStore())
    headers = {"Host": "elsewhere.example"}
    mine = await _ask(ours, "GET", path, headers=headers)
    starlettes = await _ask(theirs, "GET", path, headers=headers)
    assert (mine.status_code, starlettes.status_code) == (307, 307)
    assert starlettes.headers["location"] == "http://elsewhere.example" + mine.headers["location"]
    assert mine.headers["location"].startswith("/") and "elsewhere" not in mine.text


@pytest.mark.parametrize("path", ["//static", "//evil.example/", "/\\evil.example/", "/"])
async def test_no_redirect_leaves_the_daemon(path: str) -> None:
    """A path that begins like another host's address (``//host``) is never redirected to: a
    ``Location`` of ``//evil.example`` would be that host. Starlette's router answers it."""
    ours, theirs = _apps(MemoryStore())
    mine = await _ask(ours, "GET", path)
    assert "location" not in mine.headers
    assert _answer(mine) == _answer(await _ask(theirs, "GET", path))
