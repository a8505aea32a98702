"""A run's spec as the store keeps it: everything another process needs to execute the run.

The task prompts, models, system prompts, inline worker names and earlier conversation, and the
names of the tools the run may call (tools are code: a process that lacks one of them cannot
execute the run and never takes it). A conversation carried into a run holds no reasoning (ADR
0005), and neither does its spec: reasoning parts are stripped here as well. Continuity carriers a
caller put into the history are kept, as the event log keeps carriers: every execution -- in the
creating process or another -- hands the loop the history the caller gave, and the loop sends a
carrier only to the model that made it, dropping the others with a ``continuity.dropped`` record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any

from thoughtgate.errors import UsageError
from thoughtgate.types import Message, ReasoningPart, part_from_dict, part_to_dict

__all__ = ["SPEC_VERSION", "RunSpec", "TaskSpec"]

SPEC_VERSION = 1


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One task of a run; unset fields fall back to the run's."""

    prompt: str
    _: KW_ONLY
    model: str | None = None
    worker: str | None = None
    """Name of a registered inline worker (inline backend)."""
    system: str | None = None
    history: Sequence[Message] = ()
    """Earlier conversation (no reasoning: see ``conversation_from_events``)."""


@dataclass(frozen=True, slots=True)
class RunSpec:
    tasks: tuple[TaskSpec, ...]
    tools: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "version": SPEC_VERSION,
            "tasks": [_task_json(t) for t in self.tasks],
            "tools": list(self.tools),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunSpec:
        if data.get("version") != SPEC_VERSION:
            raise UsageError(
                f"this run was recorded by another thoughtgate version (spec version "
                f"{data.get('version')!r}; this one reads {SPEC_VERSION})"
            )
        tasks = tuple(
            TaskSpec(
                str(t["prompt"]),
                model=t.get("model"),
                worker=t.get("worker"),
                system=t.get("system"),
                history=tuple(
                    Message(m["role"], tuple(part_from_dict(p) for p in m["parts"]))
                    for m in t.get("history", ())
                ),
            )
            for t in data["tasks"]
        )
        return cls(tasks, tuple(str(n) for n in data.get("tools", ())))


def _task_json(task: TaskSpec) -> dict[str, Any]:
    return {
        "prompt": task.prompt,
        "model": task.model,
        "worker": task.worker,
        "system": task.system,
        "history": [_message_json(m) for m in task.history],
    }


def _message_json(message: Message) -> dict[str, Any]:
    kept: Sequence[Any] = [p for p in message.parts if not isinstance(p, ReasoningPart)]
    return {"role": message.role, "parts": [part_to_dict(p) for p in kept]}
