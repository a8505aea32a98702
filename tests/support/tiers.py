"""Test tiers: every test is exactly one of ``unit``, ``inprocess`` or ``external``, and keeps to it.

``make test-fast`` runs ``unit`` and ``inprocess`` (``-m "not external"``); ``make test`` runs all
three. A test's tier is, in order:

1. its own tier marker (``@pytest.mark.external``), or its module's ``pytestmark``;
2. ``external`` when it is marked ``postgres`` or ``browser``;
3. the entry for its module, or for the test itself, in :data:`TIER_OF`.

A test with no tier, or with two, stops the collection with a message saying where to add one.

The tier is also checked while the test runs, so that the fast tiers stay honest: a ``unit`` test
that opens a network socket (even to loopback) or a SQLite database, or any ``unit`` or
``inprocess`` test that starts a subprocess or connects to PostgreSQL, fails with what it touched.
Whatever touches these from another thread counts for the test running at the time, except inside
:func:`the_sessions` (a session-scoped fixture's teardown, run within whichever test came last).
"""

from __future__ import annotations

import contextlib
import platform
import socket
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ALLOWED: dict[str, frozenset[str]] = {
    "unit": frozenset(),
    "inprocess": frozenset({"network", "sqlite"}),
    "external": frozenset({"network", "sqlite", "subprocess", "postgres"}),
}
"""The tiers, from the cheapest (described in pyproject.toml's markers), and what a test of each may
touch (see :func:`touched`). The fast run is every tier but the last."""

TIERS = tuple(ALLOWED)

EXTERNAL_MARKERS = ("postgres", "browser")

TIER_OF: dict[str, str] = {
    # -- unit
    "providers/test_recorded_shapes.py": "unit",
    "test_store_outage_kinds.py": "unit",
    "providers/test_json_events.py": "unit",
    "providers/test_request_build.py": "unit",
    "providers/test_think_tags.py": "unit",
    "test_access_keys_tickets.py": "unit",
    "test_architecture_doc.py": "unit",
    "test_cli_render.py": "unit",
    "test_config.py": "unit",
    "test_event_catalogue.py": "unit",
    "test_fanout.py": "unit",
    "test_filter.py": "unit",
    "test_governance_attacks.py": "unit",
    "test_host_metadata.py": "unit",
    "test_install_extras.py": "unit",
    "test_install_extras.py::test_the_core_modules_import_none_of_the_extras": "external",
    "test_install_extras.py::test_a_durable_run_on_the_core_install_needs_no_postgres_extra": (
        "external"
    ),
    "test_layers.py": "unit",
    "test_live_direct.py": "unit",
    "test_live_replay_memory.py": "inprocess",
    "test_loop.py": "unit",
    "test_mcp.py": "unit",
    "test_mcp.py::test_stdio_end_to_end_role_by_mode": "external",
    "test_mcp.py::test_stdio_with_tools_and_plain_log_lines_on_stderr": "external",
    "test_mcp.py::test_the_typescript_sdk_client_as_a_host_sees_what_its_role_may": "external",
    "test_public_surface.py": "unit",
    "test_recorder.py": "unit",
    "test_registries.py": "unit",
    "test_resolution.py": "unit",
    "test_resume_steps.py": "unit",
    "test_run_leases.py": "unit",
    "test_runtime.py": "unit",
    "test_sse_decoder.py": "unit",
    "test_store_memory.py": "unit",
    "test_sync_tools_off_the_loop.py": "unit",
    "test_sync_tools_off_the_loop.py::"
    "test_a_tool_thread_blocked_for_good_does_not_keep_the_process_from_exiting": "external",
    "test_thread.py": "unit",
    "test_turn_timings.py": "unit",
    "test_types.py": "unit",
    "test_visibility_property.py": "unit",
    "test_visible_policy_corpus.py": "unit",
    "test_visible_runtime.py": "unit",
    "test_visible_steps.py": "unit",
    # -- inprocess
    "emulator/test_documented_scenarios.py": "inprocess",
    "emulator/test_openai_sdk_oracle.py": "inprocess",
    "emulator/test_openai_sdk_oracle.py::test_raw_chat_stream_matches_the_adapter": "external",
    "providers/test_h11_body.py": "inprocess",
    "providers/test_http_errors.py": "inprocess",
    "providers/test_netio.py": "inprocess",
    "providers/test_openai_compatible.py": "inprocess",
    "providers/test_provider_conformance.py": "inprocess",
    "providers/test_registry.py": "inprocess",
    "providers/test_openai_family_runtime.py": "inprocess",
    "providers/test_openai_responses.py": "inprocess",
    "providers/test_openrouter.py": "inprocess",
    "providers/test_recorded_server_families.py": "inprocess",
    "test_agui.py": "inprocess",
    "test_agui.py::test_the_ag_ui_client_runs_as_developer_and_follows_as_viewer_without_reasoning": "external",
    "test_agui.py::test_no_reasoning_events_outside_surface_runs_even_for_owners": "external",
    "test_agui.py::test_a_run_that_did_not_complete_ends_with_run_error": "external",
    "test_anthropic_capture.py": "inprocess",
    "test_anthropic_emulator.py": "inprocess",
    "test_anthropic_errors.py": "inprocess",
    "test_anthropic_request.py": "inprocess",
    "test_anthropic_smoke.py": "inprocess",
    "test_approval_state.py": "inprocess",
    "test_client.py": "inprocess",
    "test_daemon_api.py": "inprocess",
    "test_daemon_bounds.py": "inprocess",
    "test_daemon_hostile_origin.py": "inprocess",
    "test_daemon_browser_clients.py": "inprocess",
    "test_daemon_canary.py": "inprocess",
    "test_daemon_canary.py::test_cli_reads_show_tool_detail_texts_to_members_only": "external",
    "test_daemon_canary.py::test_the_cli_with_a_remote_key_says_billed_counts_are_withheld": "external",
    "test_daemon_fuzz.py": "inprocess",
    "test_daemon_sse.py": "inprocess",
    "test_endpoint_rules.py": "inprocess",
    "test_faults.py": "inprocess",
    "test_faults.py::test_kill_9_mid_run_loses_and_duplicates_nothing_a_reader_saw": "external",
    "test_faults.py::test_a_thousand_live_readers_each_get_every_event": "external",
    "test_listening.py": "inprocess",
    "test_live_access.py": "inprocess",
    "test_stream_after_end.py": "inprocess",
    "test_narration.py": "inprocess",
    "test_observed_endings.py": "inprocess",
    "test_observed_endings.py::test_a_run_closed_by_the_lease_sweep_ends_its_trace": "external",
    "test_provider_clients.py": "inprocess",
    "test_provider_clients.py::test_cli_run_turns_share_one_connection": "external",
    "test_provider_clients.py::test_mcp_server_runs_share_one_connection": "external",
    "test_quotas.py": "inprocess",
    "test_reasoning_canary_formats.py": "inprocess",
    "test_reasoning_apart.py": "inprocess",
    "test_apart_backfill.py": "inprocess",
    "test_durable_checkpoints.py": "inprocess",
    "test_run_list_api.py": "inprocess",
    "test_run_spec_persisted.py": "inprocess",
    "test_run_view_surfaces.py": "inprocess",
    "test_run_view_surfaces.py::test_the_cli_prints_that_view_locally_and_through_the_daemon": (
        "external"
    ),
    "test_server_rules.py": "inprocess",
    "test_store_private_files.py": "inprocess",
    "test_store_private_files.py::test_another_local_user_cannot_read_the_store_or_its_secret": (
        "external"
    ),
    "test_store_sqlite.py": "inprocess",
    "test_store_sqlite.py::test_several_processes_opening_a_new_file_at_once": "external",
    "test_store_sqlite.py::test_read_only_file_reads_work_and_writes_say_read_only": "external",
    "test_store_sqlite.py::test_read_only_directory_reads_work_and_writes_say_read_only": "external",
    "test_store_sqlite.py::test_writers_in_several_processes_get_gap_free_sequences": "external",
    "test_store_sqlite.py::test_tail_sees_events_appended_by_another_process": "external",
    "test_telemetry.py": "inprocess",
    "test_telemetry_otlp.py": "inprocess",
    "test_tool_loop_adapters.py": "inprocess",
    "test_tool_loop_adapters.py::test_cli_loads_tools_and_approves_all": "external",
    "test_tool_loop_adapters.py::test_cli_without_a_tty_lets_the_approval_time_out": "external",
    "test_tool_loop_adapters.py::test_cli_asks_on_a_terminal": "external",
    # -- external
    "test_cli.py": "external",
    "test_cli_providers.py": "external",
    "test_cli_remote.py": "external",
    "test_cli_run_selection.py": "external",
    "test_daemon_head_writes.py": "inprocess",
    "test_daemon_connections.py": "external",
    "test_daemon_docs.py": "external",
    "test_doc_examples.py": "external",
    "test_daemon_process.py": "external",
    "test_durable_replicas.py": "external",
    "test_replicas_postgres.py": "external",
    "test_run_endings.py": "external",
    "test_store_postgres.py": "external",
    "test_web_builders.py": "external",
    "test_web_hostile.py": "external",
    "test_web_cors.py": "external",
    "test_web_page.py": "external",
    # store conformance cases that need a dead process id (a lease of a process that is gone)
    "test_store_memory.py::test_the_sweep_closes_each_orphan_once_tasks_first": "external",
    "test_store_sqlite.py::test_the_sweep_closes_each_orphan_once_tasks_first": "external",
    "test_store_memory.py::test_observers_see_every_committed_batch_once_whoever_appends_it": (
        "external"
    ),
    "test_store_sqlite.py::test_observers_see_every_committed_batch_once_whoever_appends_it": (
        "external"
    ),
}
"""Module path (relative to ``tests/``) -> tier, and ``path::test_name`` for a test (every case of
a parametrized one) whose tier differs from its module's."""

TESTS = Path(__file__).resolve().parents[1]

_current: dict[str, Any] = {"item": None, "tier": None, "touched": []}


def touched(kind: str, detail: object) -> None:
    """Note that the running test touched ``kind`` (network, sqlite, subprocess, postgres)."""
    tier = _current["tier"]
    if tier is None or kind in ALLOWED[tier]:
        return
    _current["touched"].append(f"{kind}: {detail!r}"[:200])


@contextlib.contextmanager
def the_sessions() -> Iterator[None]:
    """What runs inside is the session's, not the running test's: a session-scoped fixture is torn
    down within whichever test the process happened to run last, a unit test's perhaps."""
    tier = _current["tier"]
    _current["tier"] = None
    try:
        yield
    finally:
        _current["tier"] = tier


def _tier_markers(item: pytest.Item) -> set[str]:
    return {m.name for m in item.iter_markers() if m.name in TIERS}


def _table_tier(item: pytest.Item) -> str | None:
    path = Path(str(item.path)).resolve().relative_to(TESTS).as_posix()
    name = getattr(item, "originalname", None) or item.name
    return TIER_OF.get(f"{path}::{name}") or TIER_OF.get(path)


def tier_of(item: pytest.Item) -> str:
    """The one tier of ``item``, or a ``pytest.UsageError`` saying what is wrong."""
    explicit = _tier_markers(item)
    if len(explicit) > 1:
        raise pytest.UsageError(f"{item.nodeid} has several tiers: {sorted(explicit)}")
    needs_external = any(item.get_closest_marker(m) for m in EXTERNAL_MARKERS)
    tier = next(iter(explicit), None) or ("external" if needs_external else _table_tier(item))
    if tier is None:
        raise pytest.UsageError(
            f"{item.nodeid} has no tier: add its module to TIER_OF in tests/support/tiers.py "
            f"or mark it with one of {', '.join(TIERS)}"
        )
    if needs_external and tier != "external":
        raise pytest.UsageError(f"{item.nodeid} needs PostgreSQL or chromium but is {tier}")
    return tier


def pytest_configure(config: pytest.Config) -> None:
    _install()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item)
        if not _tier_markers(item):
            item.add_marker(tier)
        item.stash[_TIER] = tier


_TIER = pytest.StashKey[str]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _current.update(item=item, tier=item.stash.get(_TIER, None), touched=[])
    try:
        return (yield)
    finally:
        _current.update(item=None, tier=None, touched=[])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    result = yield
    _check(item)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    result = yield
    _check(item)
    return result


def _check(item: pytest.Item) -> None:
    found, _current["touched"] = _current["touched"], []
    if found:
        tier = item.stash.get(_TIER, "?")
        pytest.fail(
            f"a {tier} test may not touch this (tiers: tests/support/tiers.py): "
            + "; ".join(dict.fromkeys(found)),
            pytrace=False,
        )


# ----------------------------------------------------------------------------- the watch


def _install() -> None:
    """Wrap the few doors to the outside once per session. The network is watched by conftest's
    guard (``note_connect``), which replaces ``socket.connect`` for every test."""
    # Probes libraries make once per process, whichever test comes first: not a test's process.
    platform.processor()  # `uname -p`, cached (the OpenAI SDK's platform headers ask for it)
    with contextlib.suppress(ImportError):
        import croniter  # noqa: F401 - DBOS's; its import runs `file` (platform.architecture)

    popen_init = subprocess.Popen.__init__

    def watched_popen(self: subprocess.Popen[Any], args: Any, *a: Any, **k: Any) -> None:
        touched("subprocess", args)
        popen_init(self, args, *a, **k)

    subprocess.Popen.__init__ = watched_popen  # type: ignore[assignment,method-assign]

    bind = socket.socket.bind

    def watched_bind(self: socket.socket, address: Any) -> None:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            touched("network", address)
        bind(self, address)

    socket.socket.bind = watched_bind  # type: ignore[method-assign]

    connect_sqlite = sqlite3.connect

    def watched_sqlite(*a: Any, **k: Any) -> sqlite3.Connection:
        touched("sqlite", a[0] if a else k.get("database"))
        return connect_sqlite(*a, **k)

    sqlite3.connect = watched_sqlite

    try:
        import psycopg
    except ImportError:  # pragma: no cover - the test extras bring it
        return
    sync_connect = psycopg.Connection.connect.__func__  # type: ignore[attr-defined]
    async_connect = psycopg.AsyncConnection.connect.__func__  # type: ignore[attr-defined]

    def watched_pg(cls: Any, *a: Any, **k: Any) -> Any:
        touched("postgres", "connect")
        return sync_connect(cls, *a, **k)

    async def watched_apg(cls: Any, *a: Any, **k: Any) -> Any:
        touched("postgres", "connect")
        return await async_connect(cls, *a, **k)

    psycopg.Connection.connect = classmethod(watched_pg)  # type: ignore[assignment,method-assign]
    psycopg.AsyncConnection.connect = classmethod(watched_apg)  # type: ignore[assignment,method-assign]


def note_connect(sock: socket.socket, address: Any) -> None:
    """Called by conftest's network guard for every ``connect``."""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        touched("network", address)
