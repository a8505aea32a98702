"""What a host integration (an IDE panel, a chat app's run card) shows for a run.

One function, :func:`host_metadata`, builds it from the run record through the one output filter
(:func:`~thoughtgate.access.filter.filter_run`), so it can never show more than any other read
path: the disclosure mode, each task's status, output and usage, and a task's ``reasoning`` only
when the run is in ``surface`` mode and the reader is ``developer`` or above. A ``telemetry_only``
run shows no reasoning to anyone, and continuity carriers never appear.
"""

from __future__ import annotations

from typing import Final, Literal

from thoughtgate.access.filter import can_read_reasoning, filter_run
from thoughtgate.access.roles import Role, parse_role
from thoughtgate.events.views import HostMetadataView, HostTaskView
from thoughtgate.store.records import RunRecord

__all__ = ["HOST_METADATA_VERSION", "host_metadata"]

HOST_METADATA_VERSION: Final[Literal[1]] = 1
"""Bumped when a field changes meaning or goes away (adding one does not bump it)."""


def host_metadata(run: RunRecord, role: Role | str) -> HostMetadataView:
    """The host view of ``run`` for a reader with ``role``.

    ``reasoning`` appears on a task only when this reader may read it (``reasoning_visible``);
    otherwise the key is absent rather than null, so a host cannot mistake it for "no reasoning".
    Every field comes from the filtered run view, so the declarations of
    ``thoughtgate.events.views`` decide them, as for every other read path.
    """
    reader = parse_role(role)
    view = filter_run(run, reader)
    tasks: list[HostTaskView] = []
    for task in view["tasks"]:
        item: HostTaskView = {
            "task_id": task["task_id"],
            "index": task["index"],
            "status": task["status"],
            "model": task["model"],
            "output": task["output"],
            "usage": task["usage"],
            "error": task["error"],
        }
        reasoning = task.get("reasoning")
        if reasoning is not None:
            item["reasoning"] = reasoning
        tasks.append(item)
    return {
        "version": HOST_METADATA_VERSION,
        "run_id": view["run_id"],
        "status": view["status"],
        "chain_of_thought": view["chain_of_thought"],
        "reasoning_visible": can_read_reasoning(reader, view["chain_of_thought"]),
        "model": view["model"],
        "created_at": view["created_at"],
        "updated_at": view["updated_at"],
        "usage": view["usage"],
        "error": view["error"],
        "role": reader.label,
        "tasks": tasks,
    }
