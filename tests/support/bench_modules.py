"""Modules of ``bench/`` for the tests that check them.

``bench/`` is not an installed package (``make bench`` runs it from the checkout), and pytest puts
only ``tests/`` on ``sys.path``: a module is loaded from its file, as ``bench_<name>``, and
registered in ``sys.modules`` (dataclasses look their module up while they are built).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

__all__ = ["bench_module", "bench_package_module"]

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


@contextlib.contextmanager
def bench_package_module(name: str) -> Iterator[ModuleType]:
    """``bench.<name>`` imported as the package's module (it imports its siblings as
    ``bench.*``), with the repository on ``sys.path`` while the block lasts."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(_BENCH.parent))
        yield importlib.import_module(f"bench.{name}")
