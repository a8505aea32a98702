"""What a host integration (an IDE panel, a chat app's run card) shows for a run.

One function, :func:`host_metadata`, builds it from the reader's run view (the one output
filter's :func:`~thoughtgate.access.filter.filter_run`), so it can never show more than any other
read path: the disclosure mode, each task's status, output and usage, and a task's ``reasoning`` only
when the run is in ``surface`` mode and the reader is ``developer`` or above. A ``telemetry_only``
run shows no reasoning to anyone, and continuity carriers never appear.
"""

from __future__ import annotations

from typing import Final, Literal

from thoughtgate.access.filter import RunSource, can_read_reasoning, filter_run
from thoughtgate.access.roles import Role, parse_role
from thoughtgate.events.views import HostMetadataView

__all__ = ["HOST_METADATA_VERSION", "host_metadata"]

HOST_METADATA_VERSION: Final[Literal[1]] = 1
"""Bumped when a field changes meaning or goes away (adding one does not bump it)."""


def host_metadata(run: RunSource, role: Role | str) -> HostMetadataView:
    """The host view of ``run`` for a reader with ``role``: the reader's run view
    (:func:`~thoughtgate.access.filter.filter_run`) with the reader's role and whether they may
    read the run's reasoning.

    ``reasoning`` appears on a task only when this reader may read it (``reasoning_visible``);
    otherwise the key is absent rather than null, so a host cannot mistake it for "no reasoning".
    """
    reader = parse_role(role)
    view = filter_run(run, reader)
    fields = {name: getattr(view, name) for name in view.model_fields_set}
    return HostMetadataView.model_construct(
        fields.keys() | {"version", "role", "reasoning_visible"},
        **fields,
        version=HOST_METADATA_VERSION,
        role=reader.label,
        reasoning_visible=can_read_reasoning(reader, view.chain_of_thought),
    )
