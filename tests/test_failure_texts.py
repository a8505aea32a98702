"""An exception that ends a run says what failed, never the data its library attached.

A run's and a task's ``error`` are ``public``: a viewer reads why a run failed. thoughtgate's
own errors are written for that reader, but a library's are not: SQLAlchemy (under DBOS, which
keeps every checkpoint) appends a failed statement's ``[parameters: ...]`` -- a step's output,
a model turn with its reasoning and signatures -- and pydantic each failing ``input_value``.
So the text a run keeps of a foreign exception is its class and first line
(``errors.failure_text``), and DBOS's engine is told to hide parameters in the first place.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st
from support.viewer import viewer_reads

from thoughtgate.engine.turn import stream_llm_turn
from thoughtgate.errors import (
    MalformedResponseError,
    ProviderStreamError,
    failure_detail,
    failure_text,
)
from thoughtgate.orchestration.durable import _Location, database_settings
from thoughtgate.providers.base import TurnRequest
from thoughtgate.testing.fake import FakeProvider, reasoning
from thoughtgate.types import Chunk

TAG = "SECRETREASONING"


def _statement_error(secret: str) -> sa.exc.OperationalError:
    """What SQLAlchemy raises when recording a checkpoint fails, by default: the statement and
    its parameters on the lines after the driver's message."""
    return sa.exc.OperationalError(
        "INSERT INTO operation_outputs (workflow_uuid, output) VALUES (?, ?)",
        ("run_x", json.dumps({"ok": {"reasoning": secret}})),
        sqlite3.OperationalError("database is locked"),
    )


@pytest.mark.unit
@given(secret=st.text(min_size=1).map(lambda t: f"{TAG}{t}"))
def test_a_foreign_exception_is_named_by_its_class_its_first_line_is_detail(secret: str) -> None:
    """The public text is the class; the developer-only detail its first line (ADR 0071),
    neither the parameters."""
    error = _statement_error(secret)
    assert TAG in str(error), "SQLAlchemy does attach the parameters (what this guards)"
    assert failure_text(error) == "OperationalError"
    detail = failure_detail(error)
    assert detail == "OperationalError: (sqlite3.OperationalError) database is locked"
    validation = ValueError(f"1 validation error for Spec\nsystem\n  input_value={secret!r}")
    assert failure_text(validation) == "ValueError"
    assert failure_detail(validation) == "ValueError: 1 validation error for Spec"


@pytest.mark.unit
def test_thoughtgate_s_own_errors_speak_for_themselves() -> None:
    ours = MalformedResponseError("a message for the reader", provider="test")
    assert failure_text(ours) == str(ours)
    assert failure_text(RuntimeError()) == "RuntimeError"


@pytest.mark.unit
@pytest.mark.parametrize("mode", ["hidden", "surface", "telemetry_only"])
def test_a_viewer_reads_the_failure_not_the_parameters(mode: str) -> None:
    """The whole way: a library error escapes a model turn, the run errors, and a viewer's run
    view and events say which error without the parameters it carried."""

    def refuse(request: httpx.Request) -> httpx.Response:
        raise _statement_error(f"{TAG}-whole-way")

    read = viewer_reads(httpx.MockTransport(refuse), mode)
    assert read.status == "error"
    assert "OperationalError" in read.view, "the viewer still learns which error"
    assert "database is locked" not in read.events, "a library's words are developer-only"
    assert TAG not in read.view
    assert TAG not in read.events


@pytest.mark.inprocess
def test_dbos_s_engine_hides_a_failed_statement_s_parameters(tmp_path: Path) -> None:
    """The engine arguments thoughtgate hands DBOS, on a SQLite file and on PostgreSQL (built
    here on SQLite: the argument is SQLAlchemy's, the same for every dialect)."""
    for location in (
        _Location(f"sqlite:///{tmp_path / 'w.db'}", None),
        _Location("postgresql://127.0.0.1/test", "tg_workflows"),
    ):
        kwargs = dict(database_settings(location)["db_engine_kwargs"])
        kwargs.pop("connect_args", None)  # the driver's own (PostgreSQL's application_name)
        engine = sa.create_engine(f"sqlite:///{tmp_path / 'probe.db'}", **kwargs)
        try:
            with engine.connect() as conn, pytest.raises(sa.exc.OperationalError) as info:
                conn.execute(sa.text("INSERT INTO missing VALUES (:x)"), {"x": TAG})
        finally:
            engine.dispose()
        assert TAG not in str(info.value), location
        assert "no such table" in str(info.value)


@pytest.mark.unit
def test_an_adapter_s_own_bug_mid_stream_is_named_by_its_first_line() -> None:
    """A ``ValueError`` out of an adapter (pydantic's ``ValidationError`` is one) becomes the
    turn's ``ProviderStreamError``, the partial turn kept, without the values it quotes."""

    async def broken(request: TurnRequest, turn: int) -> AsyncIterator[Chunk]:
        yield reasoning(f"{TAG} thinking")
        raise ValueError(f"1 validation error for Delta\nthinking\n  input_value='{TAG}'")

    async def main() -> ProviderStreamError:
        with pytest.raises(ProviderStreamError) as info:
            await stream_llm_turn(FakeProvider(broken, model="x"), TurnRequest([]))
        return info.value

    error = asyncio.run(main())
    assert TAG not in str(error)
    assert "ValueError: 1 validation error for Delta" in str(error)
    assert error.partial is not None
