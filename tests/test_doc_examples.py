"""The Python examples of the README and docs/client.md, run as a reader would paste them: each
block in a fresh interpreter, the client's against a real ``thoughtgate serve``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from support.daemon import HANG_S, REPO, ServeProcess, cli_env


def _python_blocks(page: str, after: str = "") -> list[str]:
    text = (REPO / page).read_text(encoding="utf-8")
    text = text[text.index(after) :] if after else text
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def _run(code: str, cwd: Path, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=cli_env(**env),
        cwd=str(cwd),
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_readme_python_example_runs_and_shows_a_viewer_no_reasoning(tmp_path: Path) -> None:
    (block,) = _python_blocks("README.md", after="## Python")[:1]
    out = _run(block, tmp_path)
    assert "status='completed'" in out and "output='Echo: Weather in Paris?'" in out, out
    assert "reasoning=None" in out, "a viewer's copy has no reasoning"
    assert (tmp_path / "runs.db").exists()


def test_the_client_page_example_runs_against_a_daemon(tmp_path: Path) -> None:
    (block,) = _python_blocks("docs/client.md")
    server = ServeProcess().start(expect_key=True)
    try:
        assert server.bootstrap_key
        code = block.replace("http://127.0.0.1:8765", server.base_url)
        out = _run(code, tmp_path, THOUGHTGATE_KEY=server.bootstrap_key)
    finally:
        server.stop()
    lines = out.splitlines()
    assert lines[0] == "1 run.started" and "reasoning.delta" in out, out
    assert lines[-3].endswith("run.settlement.completed"), out
    assert lines[-2:] == ["Echo: Plan the offsite", "completed"], out
