"""Run the real JavaScript clients under ``tests/node`` (installed by ``make node-deps``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

NODE_DIR = Path(__file__).resolve().parents[1] / "node"

__all__ = ["NODE_DIR", "node_json", "run_node"]


def run_node(
    script: str, *args: str, timeout: float = 90, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``node tests/node/SCRIPT ARGS...`` (``env`` adds to this process's environment); fails
    (never skips) when node or the packages are missing, saying how to get them."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed; the AG-UI and MCP client tests need Node.js 18+")
    if not (NODE_DIR / "node_modules").is_dir():
        pytest.fail("the Node.js test clients are not installed: run `make node-deps`")
    return subprocess.run(
        [node, str(NODE_DIR / script), *args],
        cwd=str(NODE_DIR),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def node_json(
    script: str, *args: str, timeout: float = 90, env: dict[str, str] | None = None
) -> Any:
    """The JSON document a client script printed (the test fails with its stderr otherwise)."""
    done = run_node(script, *args, timeout=timeout, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
