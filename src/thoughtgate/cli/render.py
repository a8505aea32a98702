"""Rich output for people: a run's live thread and its summary (always from filtered data)."""

from __future__ import annotations

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
            self.console.print(f"[red]{t}: {p.get('error')}[/]")

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


def render_run(console: Console, view: RunView, *, role: str) -> None:
    """A run view (already filtered) as panels: header, then each task."""
    head = Table.grid(padding=(0, 2))
    head.add_row("run", view["run_id"])
    head.add_row("status", view["status"])
    head.add_row("model", str(view.get("model")))
    head.add_row("chain_of_thought", view["chain_of_thought"])
    head.add_row("viewing as", role)
    head.add_row("usage", _usage_text(view.get("usage") or {}))
    if view.get("error"):
        head.add_row("error", str(view["error"]))
    console.print(Panel(head, title="thoughtgate run", expand=False))
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
        console.print(
            Panel(
                Text(task.get("output") or ""),
                title=f"answer · task {task['index']} · {task['status']}",
            )
        )


def render_runs_table(console: Console, views: list[RunView]) -> None:
    table = Table("run_id", "status", "mode", "model", "prompt")
    for v in views:
        table.add_row(
            v["run_id"],
            v["status"],
            v["chain_of_thought"],
            str(v.get("model")),
            (v.get("prompt") or "")[:60],
        )
    console.print(table)
