"""``bench.daemon_bench``: the real adapters' phases rotate by one format a round, so each
format's median is measured in different places of the round (ADR 0124), from a start that
moves with the hour the pass began, so the format a short pass leaves out of first place is not
always the same one (ADR 0150); and every phase warms up with one run on each of its connections
at once, so it starts with the server's provider connections open whatever ran before (ADR
0126)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st
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


@given(
    formats=st.lists(st.text(min_size=1, max_size=3), min_size=1, max_size=6, unique=True),
    extra=st.integers(min_value=0, max_value=3),
    start=st.integers(min_value=0, max_value=30),
)
def test_with_as_many_rounds_as_formats_each_format_takes_each_position_once(
    daemon_bench: ModuleType, formats: list[str], extra: int, start: int
) -> None:
    """ADR 0126: three rounds cannot put each of four formats first; ``--rounds`` of at least
    the number of formats does, from any start (ADR 0150), and every round runs every format
    once."""
    rounds = range(1, len(formats) + 1 + extra)
    orders = [daemon_bench._adapter_order(n, formats, start) for n in rounds]
    assert all(sorted(order) == sorted(formats) for order in orders)
    for name in formats:
        positions = sorted(order.index(name) for order in orders[: len(formats)])
        assert positions == list(range(len(formats))), name


@given(
    # at most the bench's four formats: 1-4 all divide 24, so the hour's wrap keeps the cycle
    formats=st.lists(st.text(min_size=1, max_size=3), min_size=2, max_size=4, unique=True),
    rounds=st.integers(min_value=1, max_value=5),
    first_hour=st.integers(min_value=0, max_value=23),
)
def test_passes_begun_in_consecutive_hours_put_each_format_first(
    daemon_bench: ModuleType, formats: list[str], rounds: int, first_hour: int
) -> None:
    """ADR 0150: three rounds of four formats leave one out of first place in a pass; over as
    many hours as formats, every format has run first in some pass (a start fixed at 0 left
    out the same one every time)."""
    firsts = set()
    for hour in range(first_hour, first_hour + len(formats)):
        start = daemon_bench._order_start(formats, hour % 24)
        firsts |= {daemon_bench._adapter_order(n, formats, start)[0] for n in range(1, rounds + 1)}
    assert firsts == set(formats)


def test_the_method_note_names_the_format_this_pass_left_out_of_first_place(
    daemon_bench: ModuleType,
) -> None:
    for start, left_out in enumerate(["responses", "anthropic", "chat", "openrouter"]):
        note = daemon_bench._variants_note(FORMATS, 3, start)
        assert f"for 4 formats, {left_out} never ran first in this pass" in note
        round_one = ", ".join(daemon_bench._adapter_order(1, FORMATS, start))
        assert f"round 1 here: {round_one})" in note
    assert "never ran first" not in daemon_bench._variants_note(FORMATS, 4, 1)


def test_the_warm_up_runs_three_in_turn_then_one_on_every_connection_at_once(
    daemon_bench: ModuleType,
) -> None:
    """ADR 0126: the wave is what opens the server's provider connections before the timed
    runs; runs one after another would leave all but one of them to the first timed wave."""
    log: list[tuple[str, int]] = []

    async def one(conn: int) -> None:
        log.append(("start", conn))
        await asyncio.sleep(0)
        log.append(("end", conn))

    asyncio.run(daemon_bench._warm_up(list(range(5)), one))
    in_turn = [("start", 0), ("end", 0), ("start", 1), ("end", 1), ("start", 2), ("end", 2)]
    assert log[:6] == in_turn
    wave = log[6:]
    assert sorted(wave) == sorted([("start", c) for c in range(5)] + [("end", c) for c in range(5)])
    assert [kind for kind, _ in wave[:5]] == ["start"] * 5  # all begun before any ended


def test_one_connection_warms_up_with_one_run(daemon_bench: ModuleType) -> None:
    runs: list[int] = []

    async def one(conn: int) -> None:
        runs.append(conn)

    asyncio.run(daemon_bench._warm_up([7], one))
    assert runs == [7]
