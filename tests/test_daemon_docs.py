"""docs/daemon.md, executed: every ``bash`` block runs in order against ``thoughtgate serve``
(started as the page says), and what the page claims about the output holds."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.daemon import HAVE_SQLITE, REPO, ServeProcess, cli_env

DOC = REPO / "docs" / "daemon.md"

pytestmark = [
    pytest.mark.skipif(
        not HAVE_SQLITE,
        reason="the page uses the default SQLite store (thoughtgate.store.sqlite, branch store)",
    ),
    pytest.mark.skipif(
        not (shutil.which("curl") and shutil.which("jq")), reason="needs curl and jq"
    ),
]


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def test_every_documented_command_runs_and_says_what_the_page_says(tmp_path: Path) -> None:
    assert _blocks("console")[0].startswith("$ thoughtgate serve")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "thoughtgate"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m thoughtgate "$@"\n')
    wrapper.chmod(0o755)
    server = ServeProcess().start(expect_key=True)  # fresh default store: prints a bootstrap key
    try:
        port = server.base_url.rsplit(":", 1)[1]
        blocks = [b.replace("127.0.0.1:8765", f"127.0.0.1:{port}") for b in _blocks("bash")]
        script = "set -euo pipefail\n" + "".join(
            f"echo '@@block {i}@@'\n{block}" for i, block in enumerate(blocks)
        )
        env = cli_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        done = subprocess.run(
            ["bash", "-c", script],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=str(tmp_path),
        )
    finally:
        server.stop()
    assert done.returncode == 0, done.stdout + done.stderr
    out = dict(
        (int(m.group(1)), m.group(2))
        for m in re.finditer(r"@@block (\d+)@@\n(.*?)(?=@@block|\Z)", done.stdout, flags=re.S)
    )
    keys, started, live, resumed, compare, dev_live = (out[i] for i in range(6))
    assert '"role":"viewer"' in keys and '"name":"victor"' in keys
    assert re.fullmatch(r"run_[0-9a-f]{32}\n", started)
    assert "id: 1\n" in live and "run.settlement.completed" in live
    assert "reasoning.delta" not in live  # a viewer's ticket
    resumed_ids = [int(i) for i in re.findall(r"^id: (\d+)$", resumed, flags=re.M)]
    assert resumed_ids and min(resumed_ids) > 3  # (a viewer's next visible event may be later)
    lines = compare.strip().splitlines()
    assert lines[0] == "null"  # viewer: task.reasoning
    assert lines[1].startswith('"The user said')  # developer: task.reasoning
    at = lines.index("403")  # viewer: the trace
    assert lines[at + 1].startswith('"The user said')  # developer: the trace
    names = [line.split()[1] for line in lines[2:at]]  # two `sort | uniq -c` listings
    cut = next(i for i in range(1, len(names)) if names[i] < names[i - 1])
    viewer_types, dev_types = names[:cut], names[cut:]
    assert "reasoning.delta" not in viewer_types and "reasoning.delta" in dev_types
    counts = [int(x) for x in dev_live.split()]
    assert counts[0] > 0 and counts[1] == 0  # live: developer ticket, viewer ticket
    past_end, revoked = out[6].splitlines()
    assert past_end == "204"
    assert revoked == "the key that asked for this ticket has been revoked"
    found, mine, streamed = out[7].splitlines()
    assert found == '["Say hello to the team",null,3]'
    assert (mine, streamed) == ("1", "1")
