"""What ``thoughtgate run`` and ``thoughtgate status`` print for a task that got no answer and for
a tool call that failed: words a reader can act on, from the fields the reader's copy holds."""

from __future__ import annotations

import io

from rich.console import Console

from thoughtgate.access.filter import filter_events
from thoughtgate.cli.render import LivePrinter, render_thread
from thoughtgate.events.schema import Event
from thoughtgate.events.thread import ThreadBuilder

_ERROR = "provider anthropic returned HTTP 529 (overloaded_error) (request id req_1)"


def _lines(out: io.StringIO) -> list[str]:
    return [line.strip() for line in out.getvalue().splitlines() if line.strip()]


def test_a_task_that_got_no_answer_is_not_called_partial() -> None:
    """A provider outage before any text arrived fails the task: the line says there was no
    answer; an answer cut after some of it arrived says so."""
    out = io.StringIO()
    printer = LivePrinter(Console(file=out, width=200))
    base = {"reason": "provider_error", "error": _ERROR, "status": 529}
    printer.show(
        Event(1, "run_x", "message.partially_completed", {**base, "text": ""}, task_id="task_a")
    )
    printer.show(
        Event(2, "run_x", "message.partially_completed", {**base, "text": "Mex"}, task_id="task_b")
    )
    printer.end()
    assert _lines(out) == [f"no answer: {_ERROR}", f"answer cut off: {_ERROR}"]


def _tool_events() -> list[Event]:
    card = {"call_id": "call_1", "tool_key": "get_country", "turn": 0, "label": "get country"}
    return [
        Event(1, "run_x", "tool.started", {**card, "input": {}}, task_id="task_a"),
        Event(
            2,
            "run_x",
            "tool.failed",
            {
                **card,
                "error": "the process executing the run stopped while this tool ran",
                "error_kind": "interrupted",
            },
            task_id="task_a",
        ),
    ]


def test_a_failed_tool_card_says_the_kind_of_failure_to_every_reader() -> None:
    """The README promises viewers the kind of any failure on a tool card; ``status`` shows it
    (a viewer's copy has no error text, only ``error_kind``)."""
    for role in ("viewer", "developer"):
        events = filter_events(_tool_events(), role, mode="hidden")
        out = io.StringIO()
        render_thread(Console(file=out, width=200), ThreadBuilder().feed_all(events).view())
        assert _lines(out) == ["⚙ get country failed: interrupted"], role
