"""Rich output for people: a run's live thread and its summary (always from filtered data)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from thoughtgate.events.schema import Event, EventType
from thoughtgate.events.views import RunView

__all__ = ["LivePrinter", "render_run", "render_runs_table"]


class LivePrinter:
    """Prints filtered events as they arrive: reasoning dimmed, answer plain, tools as cards."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._mode: str | None = None

    def _switch(self, mode: str) -> None:
        if self._mode != mode:
            if self._mode is not None:
                self.console.print()
            if mode == "reasoning":
                self.console.print("[dim italic]thinking…[/]")
            self._mode = mode

    def show(self, event: Event) -> None:
        p = event.payload
        t = event.type
        if t == EventType.REASONING_DELTA:
            self._switch("reasoning")
            self.console.print(Text(str(p.get("text", "")), style="dim"), end="")
        elif t == EventType.MESSAGE_DELTA:
            self._switch("answer")
            self.console.print(Text(str(p.get("text", ""))), end="")
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
            self.console.print(
                f"[cyan]⚙ {label}[/] [dim]{t.removeprefix('tool.')}[/]{detail}", highlight=False
            )
        elif t.startswith("cot.") and t != EventType.COT_COMPLETED:
            self._switch("cot")
            summary = p.get("summary")
            if summary:
                self.console.print(f"[magenta]• {summary}[/]", highlight=False)
        elif t == EventType.MESSAGE_PARTIALLY_COMPLETED:
            self._switch("note")
            self.console.print(f"[yellow]partial: {p.get('error') or p.get('reason')}[/]")
        elif t in (EventType.RUN_FAILED, EventType.RUN_ERROR):
            self._switch("note")
            self.console.print(f"[red]{t}: {p.get('error')}[/]", highlight=False)
        elif t == EventType.RUN_INTERRUPTED:
            self._switch("note")
            self.console.print(f"[yellow]interrupted: {p.get('reason')}[/]", highlight=False)

    def end(self) -> None:
        if self._mode is not None:
            self.console.print()


def _usage_text(usage: Mapping[str, Any]) -> str:
    if not usage:
        return "-"
    text = f"in {usage.get('input_tokens', 0)} · out {usage.get('output_tokens', 0)}"
    if "reasoning_tokens" in usage:  # withheld where reasoning itself is
        text += f" · reasoning {usage['reasoning_tokens']}"
    return text


_STATUS_STYLE = {"completed": "green", "partial": "yellow", "interrupted": "yellow"}


def _status_text(status: str) -> Text:
    return Text(status, style=_STATUS_STYLE.get(status, "bold red"))


def render_run(console: Console, view: RunView, *, role: str) -> None:
    """A run view (already filtered) as panels: header, then each task.

    A run that did not complete says so in its header, with its error, and so does each task
    panel: an empty answer box is never all a reader gets.
    """
    head = Table.grid(padding=(0, 2))
    head.add_row("run", view["run_id"])
    head.add_row("status", _status_text(view["status"]))
    head.add_row("model", str(view.get("model")))
    head.add_row("chain_of_thought", view["chain_of_thought"])
    head.add_row("viewing as", role)
    head.add_row("usage", _usage_text(view.get("usage") or {}))
    if view.get("error"):
        head.add_row("error", Text(str(view["error"]), style="red"))
    border = "green" if view["status"] == "completed" else "red"
    console.print(Panel(head, title="thoughtgate run", expand=False, border_style=border))
    for task in view["tasks"]:
        reasoning = task.get("reasoning")
        if reasoning:
            console.print(
                Panel(
                    Text(reasoning, style="dim"),
                    title=f"reasoning · task {task['index']}",
                    border_style="dim",
                )
            )
        body = Text(task.get("output") or "")
        if task["status"] != "completed" and task.get("error"):
            if body:
                body.append("\n\n")
            body.append(f"{task['status']}: {task['error']}", style="red")
        console.print(
            Panel(
                body,
                title=f"answer · task {task['index']} · {task['status']}",
                border_style="none" if task["status"] == "completed" else "red",
            )
        )


def _started(ts: float | None) -> str:
    if not ts:
        return ""
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def render_runs_table(console: Console, views: list[RunView]) -> None:
    """Full run ids (never cut, whatever the terminal's width) and when each run started."""
    table = Table("run_id", "started", "status", "mode", "model", "prompt")
    table.columns[0].no_wrap = True
    table.columns[0].min_width = max((len(v["run_id"]) for v in views), default=6)
    table.columns[1].no_wrap = True
    for v in views:
        table.add_row(
            v["run_id"],
            _started(v.get("created_at")),
            _status_text(v["status"]),
            v["chain_of_thought"],
            str(v.get("model")),
            (v.get("prompt") or "")[:60],
        )
    console.print(table)
