"""Provider clients are the process's: one per endpoint, reused across turns and runs, closed at
the end, in the daemon, the CLI, the MCP server and the Python runtime.

The emulator counts the TCP connections it accepts and how many are still open, so keep-alive
reuse and closing are observed from the provider's side of the wire.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from support.daemon import HANG_S, running_daemon

from thoughtgate.config import Config
from thoughtgate.demo import demo_tools
from thoughtgate.orchestration.runtime import RunRequest, Runtime, TaskSpec
from thoughtgate.providers import clients as clients_module
from thoughtgate.providers.base import ProviderSettings, create_provider
from thoughtgate.providers.clients import ProviderClients, endpoint_of, shared_clients
from thoughtgate.providers.http import HTTPTransport
from thoughtgate.store.memory import MemoryStore
from thoughtgate.testing.emulator import (
    Emulator,
    EmulatorServer,
    Say,
    Scenario,
    ScriptedTurn,
    Sleep,
    Think,
    serve_emulator,
)
from thoughtgate.testing.emulator.scenarios import builtin_scenarios

SRC = Path(__file__).resolve().parents[1] / "src"
ANTHROPIC = "anthropic:claude-sonnet-4-5"
CHAT = "openai-compatible:deepseek-reasoner"


@pytest.fixture
def server() -> Iterator[EmulatorServer]:
    emulator = Emulator().add(builtin_scenarios()["tool-loop"], default=True)
    emulator.add(
        Scenario("slow", (ScriptedTurn((Sleep(1.0), Think("late"), Say("late"))),)),
    )
    with serve_emulator(emulator) as running:
        yield running


def config_for(server: EmulatorServer, **endpoint: Any) -> Config:
    return Config.from_mapping(
        {
            "providers": {
                "anthropic": {"base_url": server.url, "api_key": "key-a", **endpoint},
                "openai_compatible": {"base_url": server.v1, "api_key": "key-c", **endpoint},
            }
        }
    )


def wait_all_closed(server: EmulatorServer, timeout: float = 10) -> None:
    """The emulator notices a client's close asynchronously; wait for its count, not a clock."""
    deadline = time.monotonic() + timeout
    while server.connections.open:
        assert time.monotonic() < deadline, f"{server.connections.open} connection(s) left open"
        time.sleep(0.01)


async def wait_all_closed_async(server: EmulatorServer, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while server.connections.open:
        assert time.monotonic() < deadline, f"{server.connections.open} connection(s) left open"
        await asyncio.sleep(0.01)


async def test_building_adapters_and_checking_models_open_nothing(
    server: EmulatorServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checking a model and its key (``POST /v1/runs``) builds adapters: no client, no socket."""
    made: list[httpx.AsyncClient] = []
    real_init = httpx.AsyncClient.__init__

    def counting_init(self: httpx.AsyncClient, *args: Any, **kwargs: Any) -> None:
        made.append(self)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(httpx.AsyncClient, "__init__", counting_init)
    settings = ProviderSettings(base_url=server.v1, api_key="k")
    for model in (ANTHROPIC, CHAT, "openai:gpt-5", "openrouter:deepseek/deepseek-r1"):
        create_provider(model, settings)
    runtime = Runtime(MemoryStore(), config_for(server))
    tasks = [TaskSpec("a", model=ANTHROPIC), TaskSpec("b", model=CHAT), TaskSpec("c")]
    await runtime.create_run(RunRequest("x", model=ANTHROPIC, tasks=tasks))
    assert made == []
    assert server.connections.accepted == 0


async def test_runs_and_turns_share_one_client_and_one_connection(server: EmulatorServer) -> None:
    created = shared_clients().created
    async with Runtime(MemoryStore(), config_for(server), tools=demo_tools()) as runtime:
        for model in (ANTHROPIC, CHAT, ANTHROPIC, CHAT):
            run = await runtime.run(RunRequest("Largest city?", model=model))
            assert run.status == "completed", run.error
            assert run.tasks[0].output == "The largest city in your country is Mexico City."
        assert shared_clients().endpoints() == [endpoint_of(server.url)]
    # 4 runs x 3 turns over two wire formats on one endpoint: one client, one connection
    assert len(server.emulator.requests) == 12
    assert shared_clients().created == created + 1
    assert server.connections.accepted == 1
    await wait_all_closed_async(server)
    assert shared_clients().endpoints() == []


async def test_without_an_owner_a_run_closes_what_it_opened(server: EmulatorServer) -> None:
    runtime = Runtime(MemoryStore(), config_for(server), tools=demo_tools())
    for expected in (1, 2):
        run = await runtime.run(RunRequest("Largest city?", model=ANTHROPIC))
        assert run.status == "completed", run.error
        assert server.connections.accepted == expected  # the run's 3 turns on one connection
        await wait_all_closed_async(server)


async def test_per_run_settings_travel_with_each_request(server: EmulatorServer) -> None:
    """Two runs with their own key, headers and timeout share a client, not their settings."""
    hurried = ProviderSettings(
        base_url=server.url,
        api_key="key-hurried",
        timeout_s=0.2,
        max_retries=0,
        extra={"thoughtgate": {"headers": {"x-emulator-scenario": "slow"}}},
    )
    patient = ProviderSettings(
        base_url=server.url,
        api_key="key-patient",
        extra={"thoughtgate": {"headers": {"x-emulator-scenario": "slow"}}},
    )
    created = shared_clients().created
    runtime = Runtime(
        MemoryStore(),
        provider_factory=lambda model: create_provider(
            model, hurried if model.endswith("-hurried") else patient
        ),
    )
    async with runtime:
        late, early = await asyncio.gather(
            runtime.run(RunRequest("?", model=ANTHROPIC)),
            runtime.run(RunRequest("?", model="anthropic:claude-sonnet-4-5-hurried")),
        )
    assert late.status == "completed", late.error
    assert early.status != "completed"
    assert "did not answer in time" in (early.tasks[0].error or "")
    assert shared_clients().created == created + 1
    keys = sorted(r.headers["x-api-key"] for r in server.emulator.requests)
    assert keys == ["key-hurried", "key-patient"]


def test_each_event_loop_gets_its_own_client(server: EmulatorServer) -> None:
    """A client's connections belong to the loop that made them; a second loop must not reuse
    them (it would fail with "attached to a different loop")."""
    created = shared_clients().created

    async def one_run() -> str:
        runtime = Runtime(MemoryStore(), config_for(server), tools=demo_tools())
        run = await runtime.run(RunRequest("Largest city?", model=CHAT))
        return run.status

    assert asyncio.run(one_run()) == "completed"
    assert asyncio.run(one_run()) == "completed"
    assert shared_clients().created == created + 2


LONG_KEEP_ALIVE_S = 600
"""Longer than any test: an idle connection is closed by a shutdown, not by a slow host's pause."""


def test_daemon_runs_share_one_client_and_close_it_at_shutdown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its connection counts hold however slow the host (ADR 0165: it failed once under heavy
    load). What they depended on: idle keep-alive connections closed after 5 s by the server
    (uvicorn) and by the client (``KEEPALIVE_EXPIRY_S``), so a pause that long left none open
    or had the next run connect again; the four runs of the second wire format started while
    the burst's could still be in flight, each then free to open a connection of its own; and
    ``wait_done``'s 10 s deadline per run. Now both keep-alives outlast the test, the second
    group starts once the burst has completed, and the waits are hang-only."""
    monkeypatch.setattr(clients_module, "KEEPALIVE_EXPIRY_S", float(LONG_KEEP_ALIVE_S))
    single = Scenario("single", (ScriptedTurn((Think("Short thought."), Say("Short answer."))),))
    emulator = Emulator().add(single, default=True)
    created = shared_clients().created
    concurrency = 8
    with serve_emulator(emulator, keep_alive_s=LONG_KEEP_ALIVE_S) as server:
        with running_daemon(config=config_for(server)) as daemon:
            body = {"prompt": "hi", "model": ANTHROPIC, "chain_of_thought": "surface"}
            with daemon.client("member") as client:
                burst = [client.post("/v1/runs", json=body) for _ in range(concurrency)]
            assert all(r.status_code == 202 for r in burst), [r.text for r in burst]
            ids = [r.json()["run_id"] for r in burst]
            for run_id in ids:  # the burst ends before the next runs start: they reuse its ones
                assert daemon.wait_done(run_id, timeout=HANG_S)["status"] == "completed"
            ids += [daemon.start_run({**body, "model": CHAT}) for _ in range(4)]
            for run_id in ids:
                assert daemon.wait_done(run_id, timeout=HANG_S)["status"] == "completed"
            assert len(server.emulator.requests) == len(ids) == concurrency + 4
            # each model check (at POST /v1/runs) and each run built an adapter: one client
            assert shared_clients().created == created + 1
            assert server.connections.accepted <= concurrency
            assert server.connections.open >= 1  # kept alive for the next run
        wait_all_closed(server)  # the lifespan closed the shared client


def test_cli_run_turns_share_one_connection(server: EmulatorServer, tmp_path: Path) -> None:
    (tmp_path / "city_tools.py").write_text(
        "def get_country() -> str:\n"
        '    """The user\'s country."""\n'
        '    return "Mexico"\n\n\n'
        "def largest_city(country: str) -> str:\n"
        '    """The most populous city of a country."""\n'
        '    return "Mexico City"\n\n\n'
        "TOOLS = [get_country, largest_city]\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(tmp_path)])}
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "thoughtgate", "run", "Largest city?", "--model", ANTHROPIC),
            *("--base-url", server.url, "--api-key", "k", "--tools", "city_tools:TOOLS"),
            *("--approve-all", "--json", "--db", f"sqlite:///{tmp_path / 'tg.db'}"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert len(server.emulator.requests) == 3
    assert server.connections.accepted == 1
    wait_all_closed(server)


async def test_mcp_server_runs_share_one_connection(server: EmulatorServer) -> None:
    env = {
        "PYTHONPATH": str(SRC),
        "ANTHROPIC_BASE_URL": server.url,
        "ANTHROPIC_API_KEY": "k",
        **{k: v for k, v in os.environ.items() if k in ("HOME", "PATH", "TMPDIR")},
    }
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "thoughtgate", "mcp", "--db", "memory://", "--role", "member"],
        env=env,
        cwd=str(SRC.parent),
    )
    single = Scenario("single", (ScriptedTurn((Think("Short thought."), Say("Short answer."))),))
    server.emulator.add(single, default=True)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        for _ in range(3):
            result = await session.call_tool(
                "orchestration_run", {"prompt": "hi", "model": ANTHROPIC}
            )
            assert not result.is_error, result.content
        assert server.connections.accepted == 1
    await wait_all_closed_async(server)
    assert len(server.emulator.requests) == 3


async def test_busy_endpoints_spread_over_small_pools_and_give_slots_back(
    server: EmulatorServer,
) -> None:
    """Streams past ``shard_size`` open another pool; a closed response frees its slot, so the
    next requests reuse the first pools' warm connections instead of opening new ones."""
    slow = Scenario("paused", (ScriptedTurn((Think("a"), Sleep(0.3), Say("b"))),))
    server.emulator.add(slow, default=True)
    clients = ProviderClients(shard_size=2)
    settings = ProviderSettings(base_url=server.url, api_key="k")
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    transport = HTTPTransport("anthropic", server.url, headers, settings, clients=clients)
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
    }

    async def stream() -> int:
        async with transport.open("/v1/messages", body, stream=True) as response:
            return sum([len(batch) async for batch in transport.event_batches(response)])

    async with clients.lease():
        assert all(await asyncio.gather(*(stream() for _ in range(5))))
        assert clients.pools(server.url) == 3  # 2 + 2 + 1 streams
        assert server.connections.accepted == 5
        for _ in range(4):
            assert await stream()
        assert clients.pools(server.url) == 3
        assert server.connections.accepted == 5  # every slot came back: warm connections reused
        async with transport.open("/v1/messages", body, stream=True):
            pass  # closed unread: httpcore drops that connection, the slot still comes back
        assert await stream()
        assert clients.pools(server.url) == 3
    await wait_all_closed_async(server)
    assert clients.endpoints() == []


@pytest.mark.external
def test_a_daemon_builds_its_adapters_and_tls_context_before_it_serves() -> None:
    """A daemon's first request to a provider ran on the loop every stream shares: importing
    the adapter and building the TLS context (~50 ms of CPU) stalled every run under way. A
    fresh process (the pytest one has them all) starts the app and looks before any run."""
    code = (
        "import json, sys\n"
        "from starlette.testclient import TestClient\n"
        "from thoughtgate.providers import clients\n"
        "from thoughtgate.providers.base import PROVIDER_MODULES\n"
        "from thoughtgate.server.app import create_app\n"
        "from thoughtgate.store.memory import MemoryStore\n"
        "modules = [t.partition(':')[0] for t in PROVIDER_MODULES.values()]\n"
        "before = [m for m in modules if m in sys.modules]\n"
        "tls_before = clients._tls_context.cache_info().currsize\n"
        "with TestClient(create_app(MemoryStore())):\n"
        "    after = [m for m in modules if m in sys.modules]\n"
        "    tls_after = clients._tls_context.cache_info().currsize\n"
        "print(json.dumps([modules, before, after, tls_before, tls_after]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(Path(__file__).resolve().parents[1]),
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr
    modules, before, after, tls_before, tls_after = json.loads(done.stdout)
    assert len(modules) >= 5
    assert before == [], "the check needs a process that has not imported them yet"
    assert after == modules
    assert (tls_before, tls_after) == (0, 1)
