"""Rich output for people: a run's live thread and its summary (always from filtered data).

Reasoning is named for what it is, one section per model turn next to that turn's tool calls:
"Raw reasoning" only when the provider returned raw reasoning, "Reasoning (provider summary)" when
it returned a summary (the labels of ``thoughtgate.events.thread``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from thoughtgate.access.filter import shows
from thoughtgate.access.roles import parse_role
from thoughtgate.cli.common import console, inert_text, print_json
from thoughtgate.errors import UnknownRoleError
from thoughtgate.events.payloads import TokenUsage
from thoughtgate.events.schema import Event, EventType
from thoughtgate.events.thread import (
    PhaseItem,
    ReasoningItem,
    StepItem,
    TextItem,
    ThreadView,
    ToolCard,
    reasoning_label,
)
from thoughtgate.events.views import RunView
from thoughtgate.events.visibility import declared_fields
from thoughtgate.events.visible import describe_receipt, parse_receipt

__all__ = ["LivePrinter", "print_run", "render_run", "render_runs_table", "render_thread"]


def _turn_title(label: str, turn: Any) -> str:
    where = f"model turn {turn + 1}" if isinstance(turn, int) else "model turn"
    return f"{label} · {where} · developer only"


def _step_line(event_type: str, summary: str) -> str:
    """A visible step as one line: phases dim, steps bold, a tool's reason under its card."""
    summary = escape(inert_text(summary))  # a step's text is data, never markup
    if event_type == EventType.COT_PHASE:
        return f"[dim]· {summary}[/]"
    if event_type == EventType.COT_TOOL_REASONING:
        return f"    [magenta]↳ {summary}[/]"
    return f"[magenta]• {summary}[/]"


class LivePrinter:
    """Prints filtered events as they arrive: reasoning dimmed under an honest heading per turn
    and kind, answer plain, tools as cards, visible steps as bullets."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._mode: str | None = None
        self._saw_reasoning = False

    def _detail(self, p: Mapping[str, Any]) -> None:
        """The failure's own words (``error_detail``): only in a payload the one output filter
        left them in, for a reader who may read them (ADRs 0071, 0073)."""
        detail = p.get("error_detail")
        if isinstance(detail, str) and detail:
            self.console.print(Text(f"  said: {inert_text(detail)}", style="dim"))

    def _switch(self, mode: str, heading: str | None = None) -> None:
        if self._mode != mode:
            if self._mode is not None:
                self.console.print()
            if heading is not None:
                self.console.print(Text(heading, style="dim italic"))
            self._mode = mode

    def show(self, event: Event) -> None:
        p = event.payload
        t = event.type
        if t == EventType.REASONING_DELTA:
            self._saw_reasoning = True
            kind = p.get("reasoning_kind")
            label = reasoning_label(kind if isinstance(kind, str) else None)
            turn = p.get("turn")
            self._switch(
                f"reasoning:{event.task_id}:{turn}:{label}", f"── {_turn_title(label, turn)} ──"
            )
            self.console.print(Text(inert_text(p.get("text", "")), style="dim"), end="")
        elif t == EventType.MESSAGE_DELTA:
            self._switch("answer")
            self.console.print(Text(inert_text(p.get("text", ""))), end="")
        elif t.startswith("tool."):
            self._switch("tool")
            label = p.get("label") or p.get("tool_key") or "tool"
            detail = ""
            if "input" in p:
                detail = f" {p['input']}"
            if t == EventType.TOOL_COMPLETED and "output" in p:
                detail = f" → {str(p['output'])[:200]}"
            if t == EventType.TOOL_FAILED:
                # a viewer's copy has no error text (it can quote tool data), only its kind
                detail = f" ✗ {p.get('error') or p.get('error_kind') or 'failed'}"
            # a tool's input, output and error are data: "[/]" in them is text, not markup
            self.console.print(
                f"[cyan]⚙ {escape(inert_text(label))}[/] [dim]{t.removeprefix('tool.')}[/]"
                f"{escape(inert_text(detail))}",
                highlight=False,
            )
        elif t == EventType.COT_COMPLETED:
            receipt = parse_receipt(p)
            if receipt is not None:
                self._switch("receipt")
                raw = self._saw_reasoning
                self.console.print(
                    Text(" ".join(describe_receipt(receipt, raw_visible=raw)), "dim")
                )
        elif t.startswith("cot."):
            self._switch("cot")
            summary = p.get("summary")
            if isinstance(summary, str) and summary:
                self.console.print(_step_line(t, summary), highlight=False)
        elif t == EventType.MESSAGE_PARTIALLY_COMPLETED:
            self._switch("note")
            # an answer cut after some of it arrived, or none at all (the task then fails)
            what = "answer cut off" if p.get("text") else "no answer"
            self.console.print(
                f"[yellow]{what}: {escape(inert_text(p.get('error') or p.get('reason')))}[/]",
                highlight=False,
            )
            self._detail(p)
        elif t in (EventType.RUN_FAILED, EventType.RUN_ERROR):
            self._switch("note")
            error = escape(inert_text(p.get("error")))
            self.console.print(f"[red]{t}: {error}[/]", highlight=False)
            self._detail(p)
        elif t == EventType.RUN_INTERRUPTED:
            self._switch("note")
            self.console.print(
                f"[yellow]interrupted: {escape(inert_text(p.get('reason')))}[/]", highlight=False
            )
            self._detail(p)  # why it could not resume, be queued or start (ADR 0073)

    def end(self) -> None:
        if self._mode is not None:
            self.console.print()


USAGE_WITHHELD = "withheld below developer (billed tokens include the reasoning's)"
"""What a reader below developer reads for a run's usage (ADR 0163): said, not a ``-`` or a 0."""


def _billing_shown(role: str, mode: str) -> bool:
    """Whether this reader gets billed counts, by ``TokenUsage``'s own declaration (a role this
    CLI cannot read counts as one that does not)."""
    try:
        reader = parse_role(role)
    except UnknownRoleError:
        return False
    return shows(declared_fields(TokenUsage)["output_tokens"].cls, reader, mode)


def _usage_text(usage: Mapping[str, Any], *, role: str, mode: str) -> str:
    if not _billing_shown(role, mode):
        return USAGE_WITHHELD
    if not usage:
        return "-"
    text = f"in {usage.get('input_tokens', 0)} · out {usage.get('output_tokens', 0)}"
    if "reasoning_tokens" in usage:  # withheld where reasoning itself is
        text += f" · reasoning {usage['reasoning_tokens']}"
    return text


_STATUS_STYLE = {"completed": "green", "partial": "yellow", "interrupted": "yellow"}


def _status_text(status: str) -> Text:
    return Text(status, style=_STATUS_STYLE.get(status, "bold red"))


def _listed_status(view: RunView) -> str:
    """A run's status in a list: a daemon's mark that its record is out of date follows it
    (ADR 0151, amendment 2), so a script matching the status word still finds it."""
    if view.record_out_of_date:
        return f"{view.status} (out of date: {view.record_out_of_date})"
    return view.status


def _listed_status_text(view: RunView) -> Text:
    if view.record_out_of_date:
        return Text(_listed_status(view), style="bold red")
    return _status_text(view.status)


def render_thread(console: Console, thread: ThreadView) -> None:
    """The thread rebuilt from the reader's filtered events: visible steps, tool cards, each
    model turn's reasoning under its honest label (only in a developer's view), the receipt."""
    cards = {card.call_id for card in thread.cards}
    # What a turn said before calling a tool stays in the thread; each task's last words are its
    # answer, printed with the task.
    answers = {t.task_id: t.key for t in thread.said}
    captions: dict[str, list[str]] = {}  # a phase that names a card is shown on the card
    for item in thread.items:
        if isinstance(item, PhaseItem) and item.step.tool_call_id in cards:
            captions.setdefault(item.step.tool_call_id, []).append(item.step.summary)
    for item in thread.items:
        if isinstance(item, StepItem):
            console.print(_step_line(EventType.COT_STEP, item.step.summary), highlight=False)
        elif isinstance(item, PhaseItem):
            if item.step.tool_call_id not in cards:
                console.print(_step_line(EventType.COT_PHASE, item.step.summary), highlight=False)
        elif isinstance(item, ToolCard):
            caption = escape(inert_text(" · ".join(captions.get(item.call_id, ()))))
            # the kind of a failure is every reader's (a viewer's card has no error text)
            status: str = item.status
            if item.error_kind and item.error_kind != status:
                status = f"{status}: {item.error_kind}"
            console.print(
                f"[cyan]⚙ {escape(inert_text(item.label))}[/] [dim]{escape(status)}[/]"
                + (f" [dim]({caption})[/]" if caption else ""),
                highlight=False,
            )
            for why in item.reasoning:
                line = _step_line(EventType.COT_TOOL_REASONING, why.summary)
                console.print(line, highlight=False)
        elif isinstance(item, TextItem):
            if item.text.strip() and answers.get(item.task_id) != item.key:
                said = inert_text(item.text.strip())
                console.print(Text(f"  “{said}”", style="italic"), highlight=False)
        elif isinstance(item, ReasoningItem):
            for segment in item.segments:
                console.print(
                    Panel(
                        Text(inert_text(segment.text), style="dim"),
                        title=_turn_title(segment.label, item.turn),
                        border_style="dim",
                    )
                )
    if thread.receipt is not None:
        lines = describe_receipt(thread.receipt, raw_visible=thread.raw_reasoning is not None)
        console.print(Text(" ".join(lines), style="dim"))


def render_run(
    console: Console, view: RunView, *, role: str, thread: ThreadView | None = None
) -> None:
    """A run view (already filtered) as panels: header, the thread (when given), each answer.

    ``task.reasoning`` (all turns joined, kinds unknown) is never printed under a label: the
    reasoning a reader may see is shown per turn and kind from the ``thread``. A run that did not
    complete says so in its header, with its error, and so does each task panel: an empty answer
    box is never all a reader gets.
    """
    head = Table.grid(padding=(0, 2))
    head.add_row("run", Text(view.run_id))
    head.add_row("status", _status_text(view.status))
    head.add_row("model", Text(inert_text(view.model)))
    head.add_row("chain_of_thought", view.chain_of_thought)
    head.add_row("viewing as", role)
    head.add_row("usage", _usage_text(view.usage, role=role, mode=view.chain_of_thought))
    if view.error:
        head.add_row("error", Text(inert_text(view.error), style="red"))
    suspended = view.metadata.get("suspended")
    if suspended and view.status in ("pending", "running"):
        how = (
            f"continue it: thoughtgate resume {view.run_id}"
            if suspended.get("resume") == "manual"
            else "another replica takes it up shortly"
        )
        reason = inert_text(suspended.get("reason"))
        head.add_row("paused", Text(f"{reason}; {how}", style="yellow"))
    border = "green" if view.status == "completed" else "red"
    console.print(Panel(head, title="thoughtgate run", expand=False, border_style=border))
    if thread is not None:
        render_thread(console, thread)
    for task in view.tasks:
        body = Text(inert_text(task.output or ""))
        if task.status != "completed" and task.error:
            if body:
                body.append("\n\n")
            said = f"{task.status}: "  # an interrupted task's error already starts so
            error = task.error if task.error.startswith(said) else said + task.error
            body.append(inert_text(error), "red")
        console.print(
            Panel(
                body,
                title=f"answer · task {task.index} · {task.status}",
                border_style="none" if task.status == "completed" else "red",
            )
        )


def print_run(view: RunView, *, json_out: bool, role: str) -> str:
    """How ``run``, ``resume`` and ``demo`` end: the view as one JSON document (``--json``, the
    same as ``status --json``) or as panels. Returns the run's status (the exit code's source)."""
    if json_out:
        print_json(view.to_json())
    else:
        render_run(console, view, role=role)
    return view.status


def _started(ts: float | None) -> str:
    if not ts:
        return ""
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


_TABLE_OVERHEAD = 19  # six columns' borders and padding
_MODEL_AND_PROMPT_MIN = 40  # room that keeps the model and the prompt readable in the table


def render_runs_table(console: Console, views: list[RunView]) -> None:
    """Full run ids (never cut, whatever the terminal's width) and when each run started.

    Where a table with readable cells does not fit (an 80-column terminal, a pipe), each run is
    two lines instead: its id, status and mode, then when it started, its model and its prompt --
    never a column squeezed to an ellipsis, and one line per run to ``grep`` for a status."""
    fixed = [
        max((len(f(v)) for v in views), default=0)
        for f in (
            lambda v: v.run_id,
            lambda v: _started(v.created_at),
            _listed_status,
            lambda v: v.chain_of_thought,
        )
    ]
    if views and console.width < sum(fixed) + _TABLE_OVERHEAD + _MODEL_AND_PROMPT_MIN:
        _render_runs_lines(console, views, fixed)
        return
    table = Table("run_id", "started", "status", "mode", "model", "prompt")
    table.columns[0].no_wrap = True
    table.columns[0].min_width = max((len(v.run_id) for v in views), default=6)
    table.columns[1].no_wrap = True
    for v in views:
        table.add_row(
            v.run_id,
            _started(v.created_at),
            _listed_status_text(v),
            v.chain_of_thought,
            Text(inert_text(v.model)),  # a model and a prompt are data: "[/]" in them is text
            Text(inert_text(v.prompt[:60])),
        )
    console.print(table)


def _render_runs_lines(console: Console, views: list[RunView], widths: list[int]) -> None:
    id_w, _, status_w, _ = widths
    console.print(
        Text(f"{'run_id'.ljust(id_w)}  {'status'.ljust(status_w)}  mode", style="bold"),
        no_wrap=True,
        overflow="ellipsis",
    )
    console.print(Text("  started · model · prompt", style="bold"), no_wrap=True)
    for v in views:
        status = _listed_status_text(v)
        status.pad_right(status_w - len(status))
        console.print(
            Text.assemble(v.run_id.ljust(id_w), "  ", status, "  ", v.chain_of_thought),
            no_wrap=True,
            overflow="ellipsis",
        )
        console.print(
            Text(
                inert_text(f"  {_started(v.created_at)} · {v.model} · {v.prompt[:60]}"),
                style="dim",
            ),
            no_wrap=True,
            overflow="ellipsis",
        )
