"""Files one bench process writes and another polls for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(path: Path, data: Any) -> None:
    """``data`` as JSON at ``path``, written whole, then renamed into place: a reader polling
    for the file never sees it half written."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(data))
    partial.replace(path)
