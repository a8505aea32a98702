"""``bench.first_byte_trace``: the traced first byte says which wake-ups ``ttfb_added`` counts
for the fake provider and for the emulator behind a real adapter (ADR 0110)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.bench_modules import bench_module

pytestmark = pytest.mark.unit

trace = bench_module("first_byte_trace")


def _write(path: Path, records: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _line(text: str, start: str) -> str:
    return next(line.strip() for line in text.splitlines() if line.strip().startswith(start))


def test_the_fakes_slot_is_read_from_its_first_delta_even_when_the_stamp_reads_back_100_s_early(
    tmp_path: Path,
) -> None:
    """The fake's first delta carries its slot beside its stamp (ADR 0113): the trace reads it
    there, no file of the fake's own (ADR 0116)."""
    # the fake's stamp 12.3457 was rounded up past the read-back at 1012.34567: rebuilt 100 s early
    found = trace._STAMPED_TEXT.match("T12.3457 S12.3407")
    stamps = trace.first_delta_stamps(found, 1012.34567)
    assert stamps["sent"] == pytest.approx(912.3457)
    assert stamps["e_due_first"] == pytest.approx(1012.3407)
    _write(tmp_path / "server-1.jsonl", [{"run_id": "r1", "emit": 1012.34567, **stamps}])
    _write(tmp_path / "client-fake_c10.jsonl", [{"run_id": "r1", "c_first": 1012.35}])
    text = trace.report(str(tmp_path), "fake_c10")
    assert _line(text, "the first delta's slot to its stamp") == (
        "the first delta's slot to its stamp (not in ttfb_added): median 5.00 ms (per run)"
    )
    assert "emulator's stamp" not in text


def test_a_slot_just_past_the_clocks_wrap_is_read_back_beside_its_stamp() -> None:
    # read back at 1099.9999: the slot 99.9990 is 0.9 ms before, not 100 s; an adapter's stamp
    # has no slot
    stamps = trace.first_delta_stamps(trace._STAMPED_TEXT.match("T99.9995 S99.9990"), 1099.9999)
    assert stamps["e_due_first"] == pytest.approx(1099.999)
    stamps = trace.first_delta_stamps(trace._STAMPED_TEXT.match("T00.0003 S99.9990"), 1100.0004)
    assert stamps["e_due_first"] == pytest.approx(1099.999)
    assert stamps["sent"] == pytest.approx(1100.0003)
    assert "e_due_first" not in trace.first_delta_stamps(
        trace._STAMPED_TEXT.match("T12.3456"), 12.35
    )


def test_an_adapters_hops_split_the_emulators_write_from_the_daemons_read(tmp_path: Path) -> None:
    _write(
        tmp_path / "server-1.jsonl",
        [{"run_id": "a", "sent": 200.0, "read_p": 200.004, "emit": 200.0041}],
    )
    _write(
        tmp_path / "emulator-1.jsonl",
        [{"key": "00.0000", "e_due_first": 199.999, "e_first_written": 200.0001}],
    )
    _write(tmp_path / "client-chat_c10.jsonl", [{"run_id": "a", "c_first": 200.01}])
    text = trace.report(str(tmp_path), "chat_c10")
    assert _line(text, "the emulator's stamp").endswith("median 0.10 ms (per run)")
    assert _line(text, "that write").endswith("median 3.90 ms (per run)")
    assert _line(text, "the first delta's slot").endswith("median 1.00 ms (per run)")


def test_the_daemons_wait_for_the_emulators_write_is_split_at_its_socket_read(
    tmp_path: Path,
) -> None:
    """ADR 0130: the write's wait splits into the loop's I/O phase (until the provider
    connection gets the bytes) and its ready queue (until the body read returns them), and the
    path after the provider is a hop of its own; a run without ``arrived_p`` (its stamp split
    across two socket reads) counts in the whole wait only."""
    _write(
        tmp_path / "server-1.jsonl",
        [
            {
                "run_id": "a",
                "sent": 200.0,
                "arrived_p": 200.003,
                "read_p": 200.004,
                "emit": 200.0041,
                "written": 200.0091,
            },
            {"run_id": "b", "sent": 250.0, "read_p": 250.008, "emit": 250.0081},
        ],
    )
    _write(
        tmp_path / "emulator-1.jsonl",
        [
            {"key": "00.0000", "e_due_first": 199.999, "e_first_written": 200.0001},
            {"key": "50.0000", "e_due_first": 249.999, "e_first_written": 250.0},
        ],
    )
    _write(
        tmp_path / "client-chat_c10.jsonl",
        [{"run_id": "a", "c_first": 200.01}, {"run_id": "b", "c_first": 250.01}],
    )
    text = trace.report(str(tmp_path), "chat_c10")
    assert _line(text, "that write to the daemon's read").endswith("median 5.95 ms (per run)")
    assert _line(text, "that write to the daemon's socket read").endswith(
        "median 2.90 ms (per run)"
    )
    assert _line(text, "that socket read to the body read").endswith("median 1.00 ms (per run)")
    assert _line(text, "the delta's emit to its frame written").endswith("median 5.00 ms (per run)")
