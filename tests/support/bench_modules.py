"""Modules of ``bench/`` for the tests that check them.

``bench/`` is not an installed package (``make bench`` runs it from the checkout), and pytest puts
only ``tests/`` on ``sys.path``: a module is loaded from its file, as ``bench_<name>``, and
registered in ``sys.modules`` (dataclasses look their module up while they are built).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["bench_module"]

_BENCH = Path(__file__).resolve().parents[2] / "bench"


def bench_module(name: str) -> ModuleType:
    """``bench/<name>.py``, loaded once."""
    key = f"bench_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, _BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module
