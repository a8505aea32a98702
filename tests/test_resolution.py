"""One precedence rule: explicit > the run's own setting > project config > default."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from thoughtgate.config import (
    WORKER_BACKENDS,
    resolve_chain_of_thought,
    resolve_store,
    resolve_worker_backend,
)
from thoughtgate.disclosure import CHAIN_OF_THOUGHT_MODES
from thoughtgate.errors import UnknownModeError, UsageError

layer = st.none() | st.sampled_from(CHAIN_OF_THOUGHT_MODES)


@given(layer, layer, layer)
def test_chain_of_thought_precedence_over_all_combinations(
    explicit: str | None, run: str | None, config: str | None
) -> None:
    expected = explicit or run or config or "hidden"
    assert resolve_chain_of_thought(explicit, run, config) == expected


def test_every_combination_exhaustively() -> None:
    values = [None, *CHAIN_OF_THOUGHT_MODES]
    for e in values:
        for r in values:
            for c in values:
                want = next((v for v in (e, r, c) if v is not None), "hidden")
                assert resolve_chain_of_thought(e, r, c) == want


@given(
    st.none() | st.sampled_from(WORKER_BACKENDS),
    st.none() | st.sampled_from(WORKER_BACKENDS),
    st.none() | st.sampled_from(WORKER_BACKENDS),
)
def test_worker_backend_precedence(e: str | None, r: str | None, c: str | None) -> None:
    assert resolve_worker_backend(e, r, c) == (e or r or c or "provider")


def test_store_precedence_and_default() -> None:
    assert resolve_store("memory://", "sqlite:///r.db", "sqlite:///c.db") == "memory://"
    assert resolve_store(None, "sqlite:///r.db", "sqlite:///c.db") == "sqlite:///r.db"
    assert resolve_store(None, None, "sqlite:///c.db") == "sqlite:///c.db"
    default = resolve_store(None, None, None)
    assert default.startswith("sqlite:///") and default.endswith("thoughtgate.db")


@pytest.mark.parametrize("position", [0, 1, 2])
def test_unknown_mode_is_an_error_at_any_layer(position: int) -> None:
    layers: list[str | None] = [None, None, None]
    layers[position] = "verbose"
    with pytest.raises(UnknownModeError, match="hidden, surface, telemetry_only"):
        resolve_chain_of_thought(*layers)


def test_unknown_backend_is_an_error() -> None:
    with pytest.raises(UsageError, match="inline, provider"):
        resolve_worker_backend("gpu", None, None)
