"""Host-adapter metadata: mode, tasks, statuses, usage; reasoning only on surface for developer+."""

from __future__ import annotations

import json

import pytest

from thoughtgate.access.roles import Role
from thoughtgate.host_metadata import host_metadata
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.store.memory import MemoryStore
from thoughtgate.store.records import RunRecord, TaskRecord
from thoughtgate.testing.fake import REASONER_MARKER


@pytest.mark.parametrize("role", list(Role))
@pytest.mark.parametrize("mode", ["hidden", "surface", "telemetry_only"])
async def test_host_metadata_per_role_and_mode(role: Role, mode: str) -> None:
    runtime = Runtime(MemoryStore())
    run = await runtime.run(RunRequest("Q?", model="fake:reasoner"), chain_of_thought=mode)
    meta = host_metadata(run, role.label).to_json()

    readable = mode == "surface" and role >= Role.DEVELOPER
    assert meta["reasoning_visible"] is readable
    assert (REASONER_MARKER in json.dumps(meta)) is readable
    assert meta["chain_of_thought"] == mode
    assert meta["status"] == "completed" and meta["role"] == role.label
    # reasoning token counts are reasoning: shown only where the reasoning is
    assert meta["usage"].get("reasoning_tokens") == (8 if readable else None)
    # billed counts include the reasoning's tokens: a developer's (ADR 0163)
    if role >= Role.DEVELOPER:
        assert meta["usage"]["input_tokens"] > 0
    else:
        assert meta["usage"] == {}
    (task,) = meta["tasks"]
    assert task["status"] == "completed" and task["output"] == "The answer is 42."
    assert task["usage"].get("output_tokens") == (20 if role >= Role.DEVELOPER else None)
    assert ("reasoning" in task) is readable


def test_reasoning_stored_on_a_telemetry_only_run_is_still_withheld_from_owners() -> None:
    # Belt and braces: even if a record carried reasoning, the filter decides by mode.
    run = RunRecord("run_x", "p", chain_of_thought="telemetry_only", status="completed")
    run.tasks = [TaskRecord("task_x", "run_x", 0, "p", status="completed", reasoning="SECRET")]
    meta = host_metadata(run, Role.OWNER).to_json()
    assert "SECRET" not in json.dumps(meta)
    assert meta["reasoning_visible"] is False


def test_unknown_role_is_an_error() -> None:
    from thoughtgate.errors import UnknownRoleError

    with pytest.raises(UnknownRoleError):
        host_metadata(RunRecord("run_x", "p"), "superuser")
