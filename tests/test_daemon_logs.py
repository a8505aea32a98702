"""What ``thoughtgate serve`` logs: provider HTTP requests only at ``--log-level debug``, and no
ticket, key or reasoning in any line at any level (ADR 0098)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx
import pytest
from support.daemon import ServeProcess, auth

from thoughtgate.server.logs import QUIET_LIBRARIES, configure_logging, redact_query
from thoughtgate.testing.emulator import Emulator, EmulatorServer, serve_emulator
from thoughtgate.testing.emulator.scenario import Fail, Say, Scenario, ScriptedTurn, Think

TOOLS = ("--tools", "support.served:SERVER_TOOLS")


async def _provider_request() -> None:
    """One request through httpx, as an adapter's turn makes it."""
    transport = httpx.MockTransport(lambda request: httpx.Response(200, text="{}"))
    async with httpx.AsyncClient(transport=transport) as client:
        await client.post("https://provider.example/v1/messages")


@pytest.mark.unit
@pytest.mark.parametrize(("level", "shown"), [("info", False), ("warning", False), ("debug", True)])
async def test_provider_requests_are_logged_at_debug_only(
    level: str, shown: bool, caplog: pytest.LogCaptureFixture
) -> None:
    configure_logging(level)  # undone after the test (support.process_logging)
    caplog.handler.setLevel(logging.DEBUG)
    await _provider_request()
    lines = [r.getMessage() for r in caplog.records if r.name.startswith(QUIET_LIBRARIES)]
    assert any("HTTP Request: POST https://provider.example" in line for line in lines) is shown
    assert logging.getLogger().level == logging.getLevelName(level.upper())


@pytest.mark.unit
@pytest.mark.parametrize(("level", "shown"), [("info", False), ("error", False), ("debug", True)])
def test_an_exceptions_text_is_logged_at_debug_only(
    level: str, shown: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """ADR 0104: below ``debug`` an exception is logged by its class (and code)."""
    configure_logging(level)  # undone after the test (support.process_logging)
    caplog.handler.setLevel(logging.DEBUG)
    logging.getLogger("thoughtgate.server").error("failed: %s", ValueError("REASONING-x"))
    assert ("failed: REASONING-x" in caplog.text) is shown
    assert ("failed: ValueError" in caplog.text) is not shown


@pytest.mark.unit
@pytest.mark.parametrize(
    "target",
    [
        "/v1/runs/r1/stream?ticket=SECRET",
        "/v1/runs/r1/stream?after=3&ticket=SECRET",
        "/v1/runs/r1/stream?%74icket=SECRET",  # the daemon's parser decodes the name
        "/v1/runs/r1/stream?TICKET=SECRET&api_key=SECRET",
        "/v1/runs?token=SECRET",
    ],
)
def test_secret_query_values_are_redacted(target: str) -> None:
    redacted = redact_query(target)
    assert "SECRET" not in redacted
    assert redacted.split("?")[0] == target.split("?")[0]


@pytest.mark.unit
def test_other_query_parameters_are_kept() -> None:
    assert redact_query("/v1/runs?status=running&limit=5") == "/v1/runs?status=running&limit=5"


LEAK = "LOGLEAK"
API_KEY = "sk-ant-LOGLEAK-provider-key"


@pytest.fixture
def emulator() -> Iterator[EmulatorServer]:
    """The Anthropic API, thinking and failing with words that quote reasoning."""
    emu = Emulator()
    emu.add(Scenario("think", (ScriptedTurn((Think(f"THINK-{LEAK}"), Say("Done."))),)))
    fail = Fail(400, "invalid_request_error", f"prompt is too long: THINK-{LEAK}-body")
    emu.add(Scenario("fail", (ScriptedTurn((fail,)),)))
    with serve_emulator(emu) as server:
        yield server


@pytest.mark.external
@pytest.mark.parametrize("level", ["info", "debug"])
def test_no_log_line_holds_a_ticket_key_or_reasoning(level: str, emulator: EmulatorServer) -> None:
    """Attacks the daemon's logs at the default level and at their most verbose: a live stream whose ticket is sent under
    an encoded name, a wrong key and a malformed Authorization header, provider turns with the
    provider's key, one thinking and one failing with an error body quoting reasoning, a fake
    provider failing the same way; none of it in stdout (the access log) or stderr."""
    env = {
        "ANTHROPIC_BASE_URL": emulator.url,
        "ANTHROPIC_API_KEY": API_KEY,
        "THOUGHTGATE_PROVIDERS__ANTHROPIC__MAX_RETRIES": "0",
    }
    server = ServeProcess("--db", "memory://", "--log-level", level, *TOOLS, env=env)
    server.start(expect_key=True)
    try:
        key = server.bootstrap_key
        assert key
        with httpx.Client(base_url=server.base_url, headers=auth(key), timeout=30) as c:

            def run(model: str) -> str:
                body = {"prompt": f"providerfail {LEAK}", "model": model}
                run_id = str(
                    c.post("/v1/runs", json={**body, "chain_of_thought": "surface"}).json()[
                        "run_id"
                    ]
                )
                ticket = c.post("/v1/tickets", json={"run_id": run_id}).json()["ticket"]
                for name in ("ticket", "%74icket"):  # the stream ends with the run
                    r = httpx.get(f"{server.base_url}/v1/runs/{run_id}/stream?{name}={ticket}")
                    assert r.status_code == 200
                events = c.get(f"/v1/runs/{run_id}/events").text
                assert f"THINK-{LEAK}" in events or f"REASONING-{LEAK}" in events  # owner sees it
                tickets.append(ticket)
                return str(c.get(f"/v1/runs/{run_id}").json()["status"])

            tickets: list[str] = []
            assert run("fake:providerfail") == "failed"
            assert run("anthropic:think") == "completed"
            assert run("anthropic:fail") == "failed"
            wrong = "tg_" + "W" * 40
            for header in (f"Bearer {wrong}", wrong, f"Basic {wrong}"):
                r = httpx.get(f"{server.base_url}/v1/runs", headers={"Authorization": header})
                assert r.status_code == 401
        logs = server.stdout_text() + "".join(server.stderr_lines)
        assert "/stream?ticket=… " in logs  # the access log is on
        # a provider request's line at debug only: thoughtgate records each turn itself
        assert ("HTTP Request: POST " in logs) is (level == "debug")
        assert "401 GET /v1/runs" in logs
        assert logs.count(key) == 1  # its one-time print at start-up
        for secret in (*tickets, wrong, API_KEY, LEAK):
            assert secret not in logs
    finally:
        server.stop()


@pytest.mark.unit
async def test_a_provider_error_reaching_a_route_is_logged_without_its_words(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from thoughtgate.errors import ProviderError
    from thoughtgate.server.errors import exception_handlers

    said = "context too long: REASONING-route"

    async def fail(request: Request) -> Response:
        raise ProviderError(said, provider="anthropic", status=400, by_provider=True, detail=said)

    app = Starlette(routes=[Route("/x", fail)], exception_handlers=exception_handlers())
    caplog.set_level(logging.DEBUG)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://daemon"
    ) as client:
        assert (await client.get("/x")).status_code == 500
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "unexpected failure on GET /x: provider anthropic" in logged
    assert "REASONING-route" not in logged
