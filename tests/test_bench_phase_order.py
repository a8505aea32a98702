"""``bench.daemon_bench``: the real adapters' phases rotate by one format a round, so each
format's median is measured in different places of the round (ADR 0124)."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest
from support.bench_modules import bench_package_module

pytestmark = pytest.mark.unit

FORMATS = ["anthropic", "chat", "openrouter", "responses"]


@pytest.fixture(scope="module")
def daemon_bench() -> Iterator[ModuleType]:
    with bench_package_module("daemon_bench") as module:
        yield module


def test_round_one_keeps_the_given_order_and_each_round_after_rotates_by_one(
    daemon_bench: ModuleType,
) -> None:
    assert daemon_bench._adapter_order(1, FORMATS) == FORMATS
    assert daemon_bench._adapter_order(2, FORMATS) == [
        "chat",
        "openrouter",
        "responses",
        "anthropic",
    ]
    assert daemon_bench._adapter_order(3, FORMATS) == [
        "openrouter",
        "responses",
        "anthropic",
        "chat",
    ]
    assert daemon_bench._adapter_order(5, FORMATS) == FORMATS


def test_over_three_rounds_no_format_runs_twice_in_the_same_position(
    daemon_bench: ModuleType,
) -> None:
    orders = [daemon_bench._adapter_order(n, FORMATS) for n in (1, 2, 3)]
    for name in FORMATS:
        positions = [order.index(name) for order in orders]
        assert len(set(positions)) == 3, (name, positions)
    # ADR 0119's pair: chat no longer always runs right after anthropic
    assert any(o.index("chat") < o.index("anthropic") for o in orders)


def test_a_subset_or_no_formats_rotates_among_themselves(daemon_bench: ModuleType) -> None:
    assert daemon_bench._adapter_order(2, ["anthropic", "chat"]) == ["chat", "anthropic"]
    assert daemon_bench._adapter_order(3, ["chat"]) == ["chat"]
    assert daemon_bench._adapter_order(2, []) == []
