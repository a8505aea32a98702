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


def test_the_fakes_slot_is_joined_by_its_stamp_even_when_the_stamp_reads_back_100_s_early(
    tmp_path: Path,
) -> None:
    # the fake's stamp 12.3457 was rounded up past the read-back at 1012.34566: rebuilt 100 s early
    _write(tmp_path / "server-1.jsonl", [{"run_id": "r1", "sent": 912.3457, "emit": 1012.34567}])
    _write(tmp_path / "emulator-fake-1.jsonl", [{"key": "12.3457", "e_due_first": 1012.3407}])
    _write(tmp_path / "client-fake_c10.jsonl", [{"run_id": "r1", "c_first": 1012.35}])
    text = trace.report(str(tmp_path), "fake_c10")
    assert _line(text, "the first delta's slot to its stamp") == (
        "the first delta's slot to its stamp (not in ttfb_added): median 5.00 ms (per run)"
    )
    assert "emulator's stamp" not in text


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
