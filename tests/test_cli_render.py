"""What the CLI prints for people (``run``, ``status``, ``runs``, ``events``): words a reader can
act on, from the fields the reader's copy holds, and a run's data printed as text, never as markup."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from thoughtgate.access.filter import filter_events
from thoughtgate.cli.remote import show_event
from thoughtgate.cli.render import LivePrinter, render_run, render_runs_table, render_thread
from thoughtgate.events.payloads import RunStatus
from thoughtgate.events.schema import Event
from thoughtgate.events.thread import ThreadBuilder
from thoughtgate.events.views import RunView, TaskView

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


_BRACKETS = "fix the [/] bug in [red]x"  # rich markup if printed as markup: "[/]" raises


def test_brackets_in_a_tool_result_or_an_error_are_printed_as_they_are() -> None:
    """A tool's result, a provider's error and a step are data: ``[/]`` in them once made
    ``thoughtgate run`` end in a MarkupError traceback, and ``[anthropic 529 ...]`` vanished."""
    out = io.StringIO()
    printer = LivePrinter(Console(file=out, width=200))
    card = {"call_id": "c", "tool_key": "k", "turn": 0, "label": "k"}
    printer.show(Event(1, "run_x", "tool.completed", {**card, "output": _BRACKETS}))
    printer.show(Event(2, "run_x", "tool.failed", {**card, "error": "[errno 5] [/]"}))
    failed = {"status": "failed", "error": "[anthropic 529 overloaded_error] Overloaded"}
    printer.show(Event(3, "run_x", "run.failed", failed))
    printer.end()
    assert _lines(out) == [
        f"⚙ k completed → {_BRACKETS}",
        "⚙ k failed ✗ [errno 5] [/]",
        "run.failed: [anthropic 529 overloaded_error] Overloaded",
    ]


def _view(run_id: str, status: RunStatus, prompt: str) -> RunView:
    return RunView(
        run_id=run_id,
        status=status,
        prompt=prompt,
        model="fake:echo",
        chain_of_thought="telemetry_only",
        worker_backend="provider",
        created_at=1_796_000_000.0,
        updated_at=1_796_000_000.0,
        usage={},
        error=None,
        metadata={},
        tasks=[],
    )


def test_the_run_list_keeps_every_field_readable_in_an_80_column_terminal() -> None:
    """Where the table would squeeze status, mode, model and prompt to "…" (80 columns, a pipe),
    each run is two lines: its full id, status and mode, then its start, model and prompt."""
    views = [
        _view("run_" + "a" * 32, "interrupted", _BRACKETS),
        _view("run_" + "b" * 32, "completed", "hello"),
    ]
    out = io.StringIO()
    render_runs_table(Console(file=out, width=80), views)
    lines = out.getvalue().splitlines()
    assert len(lines) == 6 and all(len(line) <= 80 for line in lines), lines
    assert lines[0].split() == ["run_id", "status", "mode"]
    assert lines[1].split() == ["started", "·", "model", "·", "prompt"]
    assert lines[2].split() == ["run_" + "a" * 32, "interrupted", "telemetry_only"]
    assert lines[3].strip().endswith(f"· fake:echo · {_BRACKETS}")
    assert lines[4].split() == ["run_" + "b" * 32, "completed", "telemetry_only"]
    wide = io.StringIO()
    render_runs_table(Console(file=wide, width=200), views)
    assert "┃ run_id" in wide.getvalue() and _BRACKETS in wide.getvalue()


@pytest.mark.parametrize("width", [80, 200])
def test_the_run_list_says_a_runs_record_is_out_of_date_beside_its_status(width: int) -> None:
    """A daemon's list marks a run stopped by a refused write (ADR 0151, amendment 2): its
    recorded status is shown with the mark, not as if it were under way."""
    wire = {**_view("run_" + "c" * 32, "running", "hi").to_json()}
    wire["record_out_of_date"] = "store_removed"
    out = io.StringIO()
    render_runs_table(Console(file=out, width=width), [RunView.model_validate(wire)])
    said = " ".join(out.getvalue().split())
    assert "running (out of date: store_removed)" in said, out.getvalue()


def test_events_prints_a_prompt_with_brackets_as_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    """``thoughtgate events`` on a run whose prompt holds ``[/]`` (it ended in a traceback)."""
    show_event(Event(1, "run_x", "run.started", {"prompt": _BRACKETS}), json_lines=False)
    assert _BRACKETS in capsys.readouterr().out


def test_an_interrupted_task_says_interrupted_once() -> None:
    """The answer panel of a run stopped by SIGTERM read "interrupted: interrupted: ...": the
    task's error already names its status. A failed task's error does not, and gets it."""
    stopped = "interrupted: thoughtgate run was stopped (SIGTERM)"
    view = _view("run_" + "c" * 32, "interrupted", "x").model_copy(
        update={
            "error": stopped,
            "tasks": [
                TaskView(
                    task_id=f"task_{i}",
                    index=i,
                    prompt="x",
                    status=status,
                    output=None,
                    usage={},
                    error=error,
                    model="fake:echo",
                    backend="provider",
                )
                for i, (status, error) in enumerate(
                    [("interrupted", stopped), ("failed", "provider fake returned HTTP 529")]
                )
            ],
        }
    )
    out = io.StringIO()
    render_run(Console(file=out, width=200), view, role="owner")
    text = out.getvalue()
    assert "interrupted: interrupted:" not in text and text.count(stopped) == 2, text
    assert "failed: provider fake returned HTTP 529" in text


# An OSC title change, a C1 one-byte CSI (clear screen) and an OSC 8 link: what a model led by a
# page or a tool result it read could write into its answer, reasoning or a tool's output.
_ATTACK = "ok\x1b]0;pwned\x07 \x9b2J \x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\ end"


def _obeyed(raw: str) -> list[str]:
    """The attack's sequences that reached the terminal as they are (rich's own styles aside)."""
    return [s for s in ("\x1b]0;", "\x9b", "\x1b]8;") if s in raw]


def test_a_runs_data_reaches_the_terminal_with_its_control_characters_shown_not_obeyed() -> None:
    """Live and after the run: answer, reasoning, a tool's input and output, a step, an error --
    every escape sequence in the data is printed visibly, lines and tabs stay as they are."""
    out = io.StringIO()
    printer = LivePrinter(Console(file=out, width=400, force_terminal=True))
    card = {"call_id": "call_1", "tool_key": "fetch", "turn": 0, "label": f"fetch {_ATTACK}"}
    events = [
        Event(1, "run_x", "reasoning.delta", {"text": _ATTACK, "turn": 0}, task_id="task_a"),
        Event(2, "run_x", "tool.started", {**card, "input": {"url": _ATTACK}}, task_id="task_a"),
        Event(3, "run_x", "tool.completed", {**card, "output": _ATTACK}, task_id="task_a"),
        Event(4, "run_x", "cot.step", {"summary": _ATTACK}, task_id="task_a"),
        Event(5, "run_x", "message.delta", {"text": f"line one\r\n\t{_ATTACK}"}, task_id="task_a"),
        Event(6, "run_x", "run.failed", {"error": _ATTACK}),
    ]
    for event in events:
        printer.show(event)
    printer.end()
    live = out.getvalue()
    assert _obeyed(live) == [], repr(live)
    assert live.count("\\x1b]0;pwned") == 8 and "\\x9b2J" in live, live
    assert (
        "line one\n" in live and "\\x09" not in live and "\\x0d" not in live
    )  # lines and tabs stay (rich expands tabs)

    view = _view("run_x", "failed", _ATTACK).model_copy(
        update={
            "error": _ATTACK,
            "tasks": [
                TaskView(
                    task_id="task_a",
                    index=0,
                    prompt="x",
                    status="failed",
                    output=_ATTACK,
                    usage={},
                    error=_ATTACK,
                    model="fake:echo",
                    backend="provider",
                )
            ],
        }
    )
    after = io.StringIO()
    terminal = Console(file=after, width=400, force_terminal=True)
    render_run(terminal, view, role="developer", thread=ThreadBuilder().feed_all(events).view())
    render_runs_table(terminal, [view])
    assert _obeyed(after.getvalue()) == [], repr(after.getvalue())
    assert "\\x1b]0;pwned" in after.getvalue()
