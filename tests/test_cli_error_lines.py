"""An error is one line on stderr, whatever its length: a path, URL or run id in it must survive
being copied from a terminal or matched by a script, so the CLI never wraps it at the width."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from thoughtgate.cli import app


@pytest.mark.inprocess
def test_a_long_error_naming_a_path_is_one_unbroken_line(tmp_path: Path) -> None:
    deep = tmp_path.joinpath(*(f"directory-{i:02d}" for i in range(12)), "store.db")
    result = CliRunner().invoke(
        app, ["status", "run_abc", "--db", f"sqlite:///{deep}"], env={"COLUMNS": "60"}
    )
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and str(deep) in lines[0]
    assert not deep.parent.exists()
