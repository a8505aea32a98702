"""A workflow's own error, read back from the workflows database, is a typed error that names
the failure's class and quotes nothing it recorded (ADR 0082).

DBOS records a workflow that raised with the application's serializer (``_Json``: the class and
the words ``failure_text`` gave it, ADR 0065) and raises what the serializer reads back where the
workflow's outcome is awaited -- a handle's result, a start of a workflow that already ended. It
was ``RuntimeError("Type: words")``: a foreign-looking class whose text quoted the record.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from thoughtgate.errors import (
    RunTakenOverError,
    RuntimeFailure,
    StoreUnavailableError,
    WorkflowFailed,
    failure_detail,
    failure_text,
)
from thoughtgate.orchestration.durable import _Json  # pyright: ignore[reportPrivateUsage]

DATA = "RUN-DATA-7Q3 the prompt's words"


def _round_trip(exc: BaseException) -> object:
    codec = _Json()
    return codec.deserialize(codec.serialize(exc))


@pytest.mark.unit
def test_a_workflows_error_comes_back_typed_naming_its_class_only() -> None:
    back = _round_trip(StoreUnavailableError(f"database is locked: {DATA}"))
    assert isinstance(back, WorkflowFailed)
    assert isinstance(back, RuntimeFailure), "one of thoughtgate's runtime failures"
    assert back.kind == "StoreUnavailableError"
    assert str(back) == "the run's workflow ended with an error (StoreUnavailableError)"
    assert DATA not in str(back) and DATA not in repr(back.args)
    # The words thoughtgate recorded stay on the object for a debugger, never in a reader's text.
    assert back.said is not None and DATA in back.said
    assert failure_text(back) == str(back)
    assert failure_detail(back) is None


@pytest.mark.unit
def test_a_foreign_exception_was_recorded_by_its_class_and_comes_back_so() -> None:
    back = _round_trip(ValueError(DATA))
    assert isinstance(back, WorkflowFailed)
    assert (back.kind, back.said) == ("ValueError", "ValueError")
    assert DATA not in str(back)


@pytest.mark.unit
def test_a_taken_over_runs_workflow_error_names_it() -> None:
    back = _round_trip(RunTakenOverError("run_1", "other"))
    assert isinstance(back, WorkflowFailed)
    assert str(back) == "the run's workflow ended with an error (RunTakenOverError)"


@pytest.mark.unit
@pytest.mark.parametrize(
    "record",
    [
        {"type": "ValueError: " + DATA, "message": DATA},  # a class name that is no identifier
        {"type": 42, "message": [DATA]},
        {"message": DATA},
        DATA,
        [DATA],
    ],
)
def test_a_record_of_another_shape_is_an_exception_with_no_words(record: object) -> None:
    back = _Json().deserialize(json.dumps({"$exception": record}))
    assert isinstance(back, WorkflowFailed)
    assert back.kind == "Exception"
    assert str(back) == "the run's workflow ended with an error (Exception)"


@pytest.mark.unit
@given(kind=st.text(max_size=40), said=st.one_of(st.none(), st.text(max_size=80)))
def test_whatever_was_recorded_the_text_quotes_nothing_but_a_class_name(
    kind: str, said: str | None
) -> None:
    back = _Json().deserialize(json.dumps({"$exception": {"type": kind, "message": said}}))
    assert isinstance(back, WorkflowFailed)
    shown = back.kind
    assert shown == (kind if kind.isidentifier() else "Exception")
    assert str(back) == f"the run's workflow ended with an error ({shown})"


@pytest.mark.unit
def test_other_values_are_read_back_as_they_were_written() -> None:
    codec = _Json()
    value = {"a": [1, "two", None], "$exception": 1}
    assert codec.deserialize(codec.serialize(value)) == value
