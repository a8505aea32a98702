"""The install footprint: PostgreSQL, MCP, OTLP/gRPC and SOCKS proxies are extras, and each says
so when missing (SOCKS: tests/providers/test_provider_requests.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from thoughtgate.cli import app
from thoughtgate.config import TelemetryConfig
from thoughtgate.errors import UsageError
from thoughtgate.store.urls import open_store
from thoughtgate.telemetry import build_meter_provider, build_tracer_provider

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = {
    "postgres": "psycopg",
    "mcp": "mcp",
    "grpc": "opentelemetry-exporter-otlp-proto-grpc",
    "socks": "httpx[socks]",
}


def _project() -> dict[str, object]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    project: dict[str, object] = data["project"]
    return project


def test_heavy_dependencies_only_some_users_need_are_extras() -> None:
    project = _project()
    core = " ".join(project["dependencies"])  # type: ignore[arg-type]
    extras: dict[str, list[str]] = project["optional-dependencies"]  # type: ignore[assignment]
    for extra, package in EXTRAS.items():
        assert package not in core, f"{package} belongs in the {extra} extra"
        assert any(package in req for req in extras[extra])
    assert "thoughtgate[postgres,mcp,grpc,socks]" in extras["all"]


def test_the_core_modules_import_none_of_the_extras() -> None:
    code = (
        "import sys, thoughtgate.cli, thoughtgate.server.app, thoughtgate.telemetry, "
        "thoughtgate.server.routes.agui;"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('psycopg', 'mcp', 'grpc') "
        "or m.startswith('opentelemetry.exporter.otlp.proto.grpc')];"
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=str(ROOT)
    )
    assert done.returncode == 0, done.stdout + done.stderr


# The core install has psycopg (DBOS brings it) but not the pool: either missing asks for the extra.
@pytest.mark.parametrize("missing", ["psycopg", "psycopg_pool"])
async def test_a_postgresql_url_without_the_extra_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    for name in [m for m in sys.modules if m.startswith("thoughtgate.store.p")]:
        monkeypatch.delitem(sys.modules, name)
    for name in [m for m in sys.modules if m.split(".")[0] == missing]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, missing, None)
    with pytest.raises(UsageError, match=r"pip install 'thoughtgate\[postgres\]'"):
        await open_store("postgresql://user@127.0.0.1/test")


def test_otlp_grpc_without_the_extra_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc", None)
    for name in [m for m in sys.modules if m.startswith("opentelemetry.exporter.otlp.proto.grpc.")]:
        monkeypatch.delitem(sys.modules, name)
    config = TelemetryConfig(exporter="otlp_grpc")
    for build in (build_tracer_provider, build_meter_provider):
        with pytest.raises(UsageError, match=r"pip install 'thoughtgate\[grpc\]'"):
            build(config)


def test_thoughtgate_mcp_without_the_extra_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "thoughtgate.mcp_server", raising=False)
    for name in [m for m in sys.modules if m.split(".")[0] in ("mcp", "mcp_types")]:
        monkeypatch.delitem(sys.modules, name)  # an imported submodule would still import
    monkeypatch.setitem(sys.modules, "mcp", None)
    result = CliRunner().invoke(app, ["mcp", "--db", "memory://"], env={"COLUMNS": "60"})
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr  # one error line, as every other, however narrow
    assert lines[0].startswith("error: ") and "pip install 'thoughtgate[mcp]'" in lines[0]


def test_a_durable_run_on_the_core_install_needs_no_postgres_extra(tmp_path: Path) -> None:
    """`thoughtgate run` and `serve` on the embedded SQLite default run durably (DBOS), and the
    core install has no ``psycopg_pool``: a durable run must not import the PostgreSQL pool.
    (It once did, through the workflows' set-up lock: a traceback on a fresh `pip install`.)"""
    code = (
        "import sys; sys.modules['psycopg_pool'] = None;"
        "from thoughtgate.cli import main;"
        f"sys.argv = ['thoughtgate', 'run', 'hi', '--model', 'fake:echo', '--json', "
        f"'--db', 'sqlite:///{tmp_path}/core.db']; main()"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("THOUGHTGATE_")}
    env["THOUGHTGATE_DURABILITY__ENABLED"] = "true"
    env["PYTHONPATH"] = str(ROOT / "src")  # this checkout, whatever the cwd
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(tmp_path),
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["status"] == "completed"
    assert "Traceback" not in done.stderr
