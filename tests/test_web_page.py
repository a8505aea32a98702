"""The web page in headless Debian chromium (Playwright, by executable path) against a real daemon
on loopback: sign in, list runs, open one, watch its thread live and after a reload; a viewer's
browser never receives raw reasoning, a developer sees the raw panel; a bad key is refused; and
the page's thread model (thread.js) builds exactly what ``thoughtgate.events.thread`` builds.

Without chromium these tests FAIL and say how to install it; they never skip."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from playwright.sync_api import Browser, Page
from support.browser import browser, open_run, page_for, sign_in, snapshot
from support.daemon import TOOL_CANARY_TOOLS, Daemon, tool_markers
from support.web import (
    MIRROR_STEP,
    SEEDED_EVENTS,
    STEP_TITLES,
    STORY_ANSWER,
    STORY_PROMPT,
    TOOL_WHYS,
    raw_marker,
    story_run,
    web_daemon,
)
from test_thread import event_lists

from thoughtgate.access.keys import create_key
from thoughtgate.events.schema import Event, NewEvent
from thoughtgate.events.thread import rebuild
from thoughtgate.events.visible import SOURCE_NOTES, VISIBLE_MARKER
from thoughtgate.inert import inert_text
from thoughtgate.store.records import ApiKeyRecord
from thoughtgate.testing.fake import FAKE_SCRIPTS
from thoughtgate.types import BAD_TOOL_NAME

pytestmark = pytest.mark.browser
__all__ = ["browser"]  # the fixture this module uses (one chromium per module)

T = TypeVar("T")


def _in_thread(fn: Callable[[], T]) -> T:
    """Run ``fn`` (which calls ``asyncio.run``) off Playwright's running loop."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result()


STATIC = Path(__file__).resolve().parents[1] / "src/thoughtgate/server/static"


def _new_key(daemon: Daemon, name: str, role: str) -> tuple[str, ApiKeyRecord]:
    """A key of this test's own (to change its role while a page uses it): secret and record."""

    async def make() -> tuple[str, ApiKeyRecord]:
        created = await create_key(daemon.store, name=name, role=role)
        return created.key, created.record

    return _in_thread(lambda: asyncio.run(make()))


def _demote(daemon: Daemon, record: ApiKeyRecord, role: str) -> None:
    demoted = dataclasses.replace(record, role=role)
    _in_thread(lambda: asyncio.run(daemon.store.save_api_key(demoted)))


def test_missing_chromium_fails_and_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import support.browser

    monkeypatch.setattr(support.browser, "chromium_path", lambda: None)
    with pytest.raises(RuntimeError, match=r"make browser-deps"), support.browser.launch():
        pass


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with web_daemon(shutdown_grace_s=0.1) as d:
        yield d


def _run_status(daemon: Daemon, run_id: str) -> str:
    return str(daemon.get(f"/v1/runs/{run_id}", "owner").json()["status"])


def _wait_finished(page: Page) -> None:
    page.wait_for_selector("[data-testid=run-status]:text-is('completed')", timeout=20_000)
    page.wait_for_selector("[data-testid=receipt]")
    assert page.locator("[data-testid=live]").count() == 0


def _kinds(snap: dict[str, Any]) -> list[str]:
    return [kind for kind, _, _ in snap["items"] if kind in ("vr-step", "tool-card")]


@pytest.mark.parametrize("role", ["viewer", "member"])
def test_a_run_live_and_after_reload_and_no_reasoning_for_viewers_and_members(
    browser: Browser, daemon: Daemon, role: str
) -> None:
    """Below developer, the thread as before (no model turns, tokens or totals), and the browser
    never receives reasoning -- nor, for a viewer, any tool detail -- in any response or SSE frame
    (the run's own stream and the run list's)."""
    token = f"{role}live"
    marker = raw_marker(token)
    with page_for(browser) as (page, capture):
        sign_in(page, daemon.base_url, daemon.keys[role])
        page.wait_for_selector(f"[data-testid=role]:text-is('{role}')")
        run_id = daemon.start_run(story_run(token, delay=0.4))
        open_run(page, run_id)

        # live: the first visible step is on screen while the run is still streaming
        page.wait_for_selector("[data-testid=live]")
        page.wait_for_selector("[data-testid=vr-step]")
        assert _run_status(daemon, run_id) == "running"
        early = snapshot(page)
        assert early["answer"] is None and early["receipt"] is None

        _wait_finished(page)
        live = snapshot(page)
        assert len(live["items"]) > len(early["items"])  # it grew without a reload
        assert [text for kind, _, text in live["items"] if kind == "vr-step"] == STEP_TITLES
        # visible steps interleaved with tool cards, then the answer
        assert _kinds(live) == ["vr-step", "tool-card", "vr-step", "tool-card", "vr-step"]
        cards = [(status, text) for kind, status, text in live["items"] if kind == "tool-card"]
        assert [s for s, _ in cards] == ["completed", "completed"]
        assert "check weather" in cards[0][1] and "find trains" in cards[1][1]
        whys = [
            [w.inner_text() for w in card.locator("[data-testid=tool-why]").all()]
            for card in page.locator("[data-testid=tool-card]").all()
        ]
        assert whys == TOOL_WHYS  # narrated beside each call, shown on its card
        assert live["answer"] == STORY_ANSWER
        assert "notes the agent wrote for you (5)" in live["receipt"]
        assert "only developers and above can read it" in live["receipt"]
        assert page.locator("[data-testid=reasoning-turn]").count() == 0
        assert live["raw"] is None
        tool_inputs = page.locator("[data-testid=tool-input]").count()
        assert tool_inputs == (0 if role == "viewer" else 2)  # a viewer: label + status
        assert page.inner_text("[data-testid=run-title]") == STORY_PROMPT
        assert marker not in page.content()
        # today's view: no model turns, tokens, totals or trace, nothing that names raw reasoning
        for testid in ("turn", "totals", "turn-metrics", "open-trace", "trace"):
            assert page.locator(f"[data-testid={testid}]").count() == 0, testid
        assert "raw reasoning" not in page.inner_text("body").lower()

        page.wait_for_load_state("networkidle")  # the refreshes that follow the end
        capture.drain()
        page.reload()
        _wait_finished(page)
        assert snapshot(page) == live  # reload shows exactly what live showed

        page.wait_for_load_state("networkidle")
        html = page.content()
        received = capture.everything()  # the page's own files too
        from_api = capture.everything(url_part="/v1/")
    # the browser did receive the run, live and on reload ...
    assert any("/stream?" in url for url in capture.urls())
    assert sum(url.endswith("/events?after=0&limit=1000") for url in capture.urls()) >= 1
    assert len(capture.sse_messages) > 10 and STORY_ANSWER.split()[0] in received
    assert any("/v1/runs/stream?" in url for url in capture.urls())  # the live run list too
    # ... and never the raw reasoning: not rendered, not in any body, not in any SSE message
    assert marker not in html and marker not in received
    assert '"reasoning.delta"' not in from_api
    assert not re.search(r'"reasoning(_parts|_chars|_kind|_tokens)?":(?!null)', from_api)
    # ... nor a billed token count, which would tell the reasoning's size (ADR 0163)
    assert not re.search(r'"(input|output|total|cache_read|cache_write)_tokens":', from_api)
    # tool arguments and results reach members, never viewers
    tool_detail = ["light wind", "07:05 (arr 10:02)", '"city":"Porto"', '"input":']
    for detail in tool_detail:
        assert (detail in received) == (role == "member"), detail


@pytest.mark.parametrize(
    ("model", "status", "answer"),
    [("fake:outage", "failed", None), ("fake:cut", "partial", "Half an ans")],
)
def test_a_run_that_did_not_complete_says_why_on_the_answer_and_in_the_list(
    browser: Browser, daemon: Daemon, model: str, status: str, answer: str | None
) -> None:
    with page_for(browser) as (page, _):
        sign_in(page, daemon.base_url, daemon.keys["viewer"])
        page.wait_for_selector("[data-testid=role]:text-is('viewer')")
        run_id = daemon.start_run({"prompt": f"honest {status}", "model": model})
        open_run(page, run_id)
        page.wait_for_selector("[data-testid=answer-error]")
        error = daemon.wait_done(run_id)["error"]
        assert error and ("HTTP 529" in error or "cut" in error)
        page.wait_for_selector(f"[data-testid=run-status]:text-is('{status}')")
        live = snapshot(page)
        assert live["error"] is not None and error in live["error"]
        assert live["answer"] == answer
        title = page.text_content("[data-testid=answer] h3")
        assert title == ("No answer" if answer is None else "Answer (partial)")
        listed = page.locator(f"#runs-list a[data-run='{run_id}']")
        listed.locator("[data-testid=run-list-error]").wait_for()
        assert error in listed.inner_text()
        assert listed.locator("[data-testid=run-list-status]").inner_text() == status
        page.reload()
        page.wait_for_selector("[data-testid=answer-error]")
        assert snapshot(page) == live, "reload says the same"


def test_developer_sees_each_turns_reasoning_under_an_honest_label(
    browser: Browser, daemon: Daemon
) -> None:
    token = "devlive"
    marker = raw_marker(token)
    with page_for(browser) as (page, capture):
        sign_in(page, daemon.base_url, daemon.keys["developer"])
        page.wait_for_selector("[data-testid=role]:text-is('developer')")
        run_id = daemon.start_run(story_run(token, delay=0.1))
        open_run(page, run_id)
        _wait_finished(page)
        live = snapshot(page)
        assert live["raw"] is not None and marker in live["raw"]
        assert _kinds(live) == ["vr-step", "tool-card", "vr-step", "tool-card", "vr-step"]
        # one section per model turn, next to that turn's tool call, each part named for what
        # it is: the provider's summary is not called raw
        turns = [k for k, _, _ in live["items"] if k in ("reasoning-turn", "tool-card")]
        assert turns == [
            "reasoning-turn",
            "tool-card",
            "reasoning-turn",
            "tool-card",
            "reasoning-turn",
        ]
        sections = page.locator("[data-testid=reasoning-turn]").all()
        for section in sections:
            labels = [
                x.inner_text() for x in section.locator("[data-testid=reasoning-label]").all()
            ]
            assert labels == ["Reasoning (provider summary)", "Raw reasoning"]
            kinds = [
                x.get_attribute("data-kind")
                for x in section.locator("[data-testid=raw-text]").all()
            ]
            assert kinds == ["summary", "raw"]
        turn_one = page.locator("[data-testid=turn][data-turn='0']")
        assert turn_one.locator("h3").first.inner_text().lower() == "model turn 1"
        assert turn_one.locator("[data-testid=reasoning-turn]").count() == 1
        assert page.locator("[data-testid=tool-input]").count() == 2  # developer: tool details
        page.wait_for_load_state("networkidle")  # the refreshes that follow the end
        capture.drain()
        page.reload()
        _wait_finished(page)
        assert snapshot(page) == live
        # the capture that found nothing for the viewer does see it for a developer
        page.wait_for_load_state("networkidle")
        assert marker in capture.everything()
        assert any(marker in m for m in capture.sse_messages) or marker in "".join(
            b.decode() for url, bs in capture.bodies.items() if "/events" in url for b in bs
        )


def test_a_page_whose_key_loses_the_developer_role_drops_the_raw_reasoning_within_5_s(
    browser: Browser, daemon: Daemon
) -> None:
    """A developer watches a run live; their key is demoted to viewer mid-run. The live stream
    ends (``access_revoked``) and the page rebuilds the run as the key may now see it."""
    token = "demoted"
    marker = raw_marker(token)
    key, record = _new_key(daemon, "dev-to-demote", "developer")
    with page_for(browser) as (page, capture):
        sign_in(page, daemon.base_url, key)
        page.wait_for_selector("[data-testid=role]:text-is('developer')")
        run_id = daemon.start_run(story_run(token, delay=0.6))
        open_run(page, run_id)
        page.wait_for_selector(f"[data-testid=raw-text]:has-text('{marker}')", timeout=10_000)
        assert _run_status(daemon, run_id) == "running"
        _demote(daemon, record, "viewer")
        # (within 5 s: the wait's own bound, while the run is still going)
        page.wait_for_selector("[data-testid=reasoning-turn]", state="detached", timeout=5_000)
        assert _run_status(daemon, run_id) == "running"  # the run goes on; only the view changed
        rebuilt_at = len(capture.sse_messages)
        _wait_finished(page)
        assert snapshot(page)["raw"] is None and marker not in page.content()
        later = capture.sse_messages[rebuilt_at:]
        assert later and not any(marker in m for m in later)  # the viewer stream carries none


def test_signing_out_leaves_nothing_of_the_run_for_the_next_key_in_the_tab(
    browser: Browser, daemon: Daemon
) -> None:
    """A developer reads a run's raw reasoning and signs out; a viewer signs in in the same tab.
    The page the viewer gets (and the signed-out page before it) holds nothing the developer
    read: the open run, its reasoning and the run list go with the key."""
    token = "signedout"
    marker = raw_marker(token)
    run_id = daemon.start_run(story_run(token, delay=0.01))
    daemon.wait_done(run_id)
    with page_for(browser) as (page, _):
        sign_in(page, daemon.base_url, daemon.keys["developer"])
        page.wait_for_selector("[data-testid=role]:text-is('developer')")
        open_run(page, run_id)
        _wait_finished(page)
        assert marker in page.content()
        page.click("#signout")
        page.wait_for_selector("[data-testid=signin]", state="visible")
        assert marker not in page.content(), "the signed-out page still holds the reasoning"
        assert run_id not in page.content()
        page.fill("#key", daemon.keys["viewer"])
        page.click("#signin-form button[type=submit]")
        page.wait_for_selector("[data-testid=role]:text-is('viewer')")
        page.wait_for_selector(f"#runs-list a[data-run='{run_id}']")
        assert marker not in page.content(), "the viewer's page shows the developer's run"
        assert page.locator("[data-testid=thread-body]").count() == 0
        # an admin's page lists other keys' names (operator detail) in its "Started by" filter
        page.click("#signout")
        page.fill("#key", daemon.keys["admin"])
        page.click("#signin-form button[type=submit]")
        page.wait_for_selector("#f-key option:text-is('owner-key (owner)')", state="attached")
        page.click("#signout")
        page.fill("#key", daemon.keys["member"])
        page.click("#signin-form button[type=submit]")
        page.wait_for_selector("[data-testid=role]:text-is('member')")
        page.wait_for_selector(f"#runs-list a[data-run='{run_id}']")
        assert "owner-key" not in page.content(), "a member's page lists the admin's keys"


def test_an_admin_page_whose_key_is_demoted_forgets_the_other_keys_names(
    browser: Browser, daemon: Daemon
) -> None:
    """Other keys' names and roles are operator detail: an admin's "Started by" filter lists
    them; once the page's key is demoted to member (the list stream ends, the page rebuilds
    itself for the key's new role) they are gone from the page."""
    key, record = _new_key(daemon, "admin-to-demote", "admin")
    with page_for(browser) as (page, _):
        sign_in(page, daemon.base_url, key)
        page.wait_for_selector("#f-key option:text-is('owner-key (owner)')", state="attached")
        page.wait_for_selector("[data-testid=list-live]", state="visible")
        _demote(daemon, record, "member")
        page.wait_for_selector("[data-testid=role]:text-is('member')", timeout=10_000)
        page.wait_for_selector("[data-testid=list-live]", state="visible")
        assert "owner-key" not in page.content(), "a member's page lists other keys"


@pytest.mark.parametrize("role", ["viewer", "member"])
def test_tool_detail_texts_reach_a_members_browser_and_never_a_viewers(
    browser: Browser, daemon: Daemon, role: str
) -> None:
    """Tool inputs quoted by a validation error, a tool's exception and a progress message: the
    viewer's browser receives none of them, live or on reload; its failed cards say what kind of
    failure it was. A member's browser receives them and shows the error text."""
    token = f"webtool{role}"
    marks = tool_markers(token)
    with page_for(browser) as (page, capture):
        sign_in(page, daemon.base_url, daemon.keys[role])
        page.wait_for_selector(f"[data-testid=role]:text-is('{role}')")
        run_id = daemon.start_run(
            {
                "prompt": f"toolcanary {token}",
                "model": "fake:toolcanary",
                "chain_of_thought": "surface",
                "tools": TOOL_CANARY_TOOLS,
            }
        )
        open_run(page, run_id)
        page.wait_for_selector("[data-testid=answer-text]:text-is('The tools have spoken.')")
        page.wait_for_load_state("networkidle")
        capture.drain()
        page.reload()
        page.wait_for_selector("[data-testid=answer-text]:text-is('The tools have spoken.')")
        page.wait_for_load_state("networkidle")
        html = page.content()
        errors = page.locator("[data-testid=tool-error]").all_inner_texts()
        received = capture.everything()
    assert any("/stream?" in url for url in capture.urls()), "followed live"
    assert len(errors) == 2
    for mark in marks.values():
        assert (mark in received) == (role == "member"), mark
    if role == "viewer":
        assert not any(mark in html for mark in marks.values())
        assert errors == [
            "The tool was called with arguments it does not accept.",
            "The tool failed.",
        ]
    else:
        assert marks["invalid"] in errors[0] and marks["raised"] in errors[1]


def test_a_member_answers_an_approval_and_a_viewer_only_watches(
    browser: Browser, daemon: Daemon
) -> None:
    run_id = daemon.start_run(
        {"prompt": "approval", "model": "fake:approval", "tools": ["dangerous"]}
    )
    with page_for(browser) as (member, _), page_for(browser) as (viewer, _):
        for page, role in ((member, "member"), (viewer, "viewer")):
            sign_in(page, daemon.base_url, daemon.keys[role])
            page.wait_for_selector(f"[data-testid=role]:text-is('{role}')")
            open_run(page, run_id)
            page.wait_for_selector("[data-testid=tool-card][data-status=pending]")
        assert viewer.locator("button.approve").count() == 0  # a viewer cannot answer
        member.click("[data-testid=tool-card] button.approve")
        for page in (member, viewer):  # approved: pending until it starts, then it runs
            page.wait_for_selector("[data-testid=tool-card][data-status=completed]")
            page.wait_for_selector(
                "[data-testid=answer-text]:text-is('done after the approval step')"
            )
        assert member.locator("button.approve").count() == 0


def test_a_bad_key_shows_the_sign_in_error(browser: Browser, daemon: Daemon) -> None:
    with page_for(browser) as (page, _):
        sign_in(page, daemon.base_url, "tg_this-is-not-a-key")
        error = page.locator("[data-testid=signin-error]")
        error.wait_for()
        assert "not accepted" in error.inner_text()
        assert page.is_visible("[data-testid=signin]") and not page.is_visible("#app")
        sign_in(page, daemon.base_url, daemon.keys["viewer"])  # and a good one gets in
        page.wait_for_selector("[data-testid=role]:text-is('viewer')")
        assert page.inner_text("[data-testid=signin-error]") == ""


def test_a_run_that_names_no_run_says_so(browser: Browser, daemon: Daemon) -> None:
    with page_for(browser) as (page, _):
        sign_in(page, daemon.base_url, daemon.keys["viewer"])
        page.wait_for_selector("[data-testid=role]")
        page.goto(f"{daemon.base_url}/#run_does_not_exist")
        assert page.locator("[data-testid=run-error]").inner_text() == "No such run."


# --------------------------------------------------------------------------- thread.js == thread.py


@pytest.fixture(scope="module")
def model_page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context()
    page = context.new_page()
    page.set_content("<!doctype html><title>thread.js</title>")
    page.add_script_tag(content=(STATIC / "thread.js").read_text())
    page.add_script_tag(
        content="window.build = (events) => { const t = new TG_THREAD.Thread();"
        " for (const e of events) t.feed(e); return t.toDict(); };"
    )
    yield page
    context.close()


def _wire(events: list[Event]) -> list[dict[str, Any]]:
    return [json.loads(json.dumps(e.to_dict())) for e in events]


def _assert_same(page: Page, events: list[Event] | list[dict[str, Any]]) -> None:
    wire = [e if isinstance(e, dict) else e.to_dict() for e in events]
    wire = json.loads(json.dumps(wire))
    python = json.loads(json.dumps(rebuild(wire).to_dict()))
    assert page.evaluate("(events) => build(events)", wire) == python


def _seq(news: list[NewEvent]) -> list[Event]:
    return [
        Event(i, "run_x", n.type, n.payload, task_id=n.task_id, ts=1.0)
        for i, n in enumerate(news, start=1)
    ]


def _vr(etype: str, **payload: Any) -> NewEvent:
    base = {"marker": VISIBLE_MARKER, "step_id": "s", "summary": "ok", "phase": "thinking", "ts": 1}
    return NewEvent(etype, {**base, **payload})


def _receipt(**over: Any) -> NewEvent:
    body = {
        "mode": "surface",
        "raw_reasoning_exists": True,
        "opaque_reasoning_exists": False,
        "raw_reasoning_visible_to": "developer",
        "raw_reasoning_surface": "display",
        "steps_shown": 2,
        "phases_shown": 1,
        "steps_dropped_by_policy": 1,
        "dropped_by_reason": {"credential": 1},
        "summarizers": ["phases"],
        "summarizer_failures": 0,
        **over,
    }
    return NewEvent("cot.completed", {"marker": VISIBLE_MARKER, "ts": 1, "receipt": body})


EDGE_CASES: dict[str, list[NewEvent]] = {
    "seeded client rules": SEEDED_EVENTS,
    "approvals": [
        NewEvent("tool.approval_required", {"call_id": "a", "tool_key": "t"}),
        NewEvent("tool.approval_response", {"call_id": "a", "decision": "approve"}),
        NewEvent("tool.approval_required", {"call_id": "b", "tool_key": "t"}),
        NewEvent("tool.approval_response", {"call_id": "b", "decision": "reject"}),
        NewEvent("tool.approval_required", {"call_id": "c", "tool_key": "t"}),
        NewEvent("tool.approval_response", {"call_id": "c", "approved": False}),
        NewEvent("tool.approval_required", {"call_id": "d", "tool_key": "t"}),
        NewEvent("tool.approval_timeout", {"call_id": "d", "timeout_s": 5}),
        NewEvent("tool.approval_required", {"call_id": "e", "key": "k"}),
        NewEvent("tool.approval_response", {"call_id": "e", "decision": "Denied"}),
        NewEvent("tool.started", {"call_id": "a", "tool_key": "t"}),
    ],
    "undeclared keys and malformed tool payloads": [
        NewEvent("tool.started", {"toolCallId": 7, "key": "k", "args": {"q": 1}}),
        NewEvent("tool.progress", {"call_id": 7, "activity": {"status": "bogus"}}),
        NewEvent("tool.completed", {"call_id": "7", "data": "x", "output": "y"}),
        NewEvent("tool.progress", {"call_id": "7", "message": "late"}),
        NewEvent("tool.started", {"tool_key": "anon"}),
        NewEvent("tool.started", {"tool_key": "anon", "label": ""}),
        NewEvent("tool.degraded", {"call_id": "z", "error": "slow", "error_kind": "tool_error"}),
        NewEvent("tool.failed", {"call_id": "z", "error": "", "error_kind": "fallback_failed"}),
        NewEvent("tool.failed", {"call_id": "v", "error_kind": "invalid_arguments"}),
    ],
    "steps": [
        _vr("cot.step", step_id="a", summary="First"),
        _vr("cot.phase", step_id="a", summary="Phase with the same id", phase="planning"),
        _vr("cot.step", step_id="a", summary="First, updated"),
        _vr("cot.step", step_id="b", summary="x" * 280, source="model"),
        _vr("cot.step", step_id="c", summary="x" * 281),
        _vr("cot.step", step_id="d", summary="é" * 280),
        _vr("cot.step", step_id="e", summary="ok", ts=True),
        _vr("cot.step", step_id="f", summary="ok", source="raw"),
        _vr("cot.step", step_id="g", summary="ok", tool_call_id=""),
        _vr("cot.step", step_id="i" * 129),
        _vr("cot.step", step_id=5),
        _vr("cot.step", step_id="h", marker="visible_reasoning_v2"),
        _vr("cot.other", step_id="j"),
        NewEvent("tool.started", {"call_id": "c1", "tool_key": "t"}),
        _vr("cot.tool.reasoning", step_id="k", summary="Why", tool_call_id="c1"),
        _vr("cot.tool.reasoning", step_id="k", summary="Why, updated", tool_call_id="c1"),
        _vr("cot.tool.reasoning", step_id="l", summary="No call"),
        _vr("cot.tool.reasoning", step_id="m", summary="Elsewhere", tool_call_id="c9"),
    ],
    "receipts": [
        _receipt(),
        _receipt(steps_dropped_by_policy=3),
        _receipt(dropped_by_reason={"credential": 1, "path": 0}),
        _receipt(raw_reasoning_visible_to=None),
        _receipt(steps_shown=-1),
        _receipt(summarizers=[1]),
        NewEvent("cot.completed", {"marker": VISIBLE_MARKER, "receipt": []}),
        _receipt(
            mode="telemetry_only",
            raw_reasoning_surface="trace",
            steps_dropped_by_policy=0,
            dropped_by_reason={},
        ),
    ],
    "receipts with sources and notes": [
        _receipt(step_sources={"narration": 2, "phases": 1}, notes=[]),
        _receipt(step_sources={"phases": 1, "model": 0}, notes=[]),
        _receipt(
            summarizers=["provider_summaries", "model", "phases"],
            step_sources={"provider_summary": 2},
            notes=[SOURCE_NOTES["provider_summaries"], SOURCE_NOTES["model"]],
        ),
        _receipt(summarizers=["provider_summaries"], notes=[]),  # a note left out
        _receipt(summarizers=["provider_summaries"]),  # recorded before notes existed
        _receipt(notes=["made up"]),
        _receipt(step_sources={"phases": -1}),
        _receipt(step_sources=None),
        _receipt(step_sources=[]),
    ],
    "reasoning per model turn": [
        NewEvent(
            "reasoning.delta", {"text": "a", "turn": 0, "reasoning_kind": "raw"}, task_id="t1"
        ),
        NewEvent(
            "reasoning.delta", {"text": "b", "turn": 0, "reasoning_kind": "raw"}, task_id="t1"
        ),
        NewEvent(
            "reasoning.delta",
            {"text": "**S**", "turn": 0, "reasoning_kind": "summary", "index": 1},
            task_id="t1",
        ),
        NewEvent("tool.started", {"call_id": "c1", "tool_key": "t"}, task_id="t1"),
        NewEvent(
            "reasoning.delta", {"delta": "c", "turn": 1, "reasoning_kind": "raw"}, task_id="t1"
        ),
        NewEvent(
            "reasoning.delta", {"text": "d", "turn": 0, "reasoning_kind": "raw"}, task_id="t2"
        ),
        NewEvent("reasoning.delta", {"text": "e", "turn": 1.5, "reasoning_kind": 3}),
        NewEvent("reasoning.delta", {"text": "f", "turn": "2", "reasoning_kind": "encrypted"}),
        NewEvent("reasoning.delta", {"text": "g", "turn": True, "index": False}),
    ],
    "turns, what they said, timings, the ending": [
        NewEvent("run.started", {"prompt": "p"}),
        NewEvent("message.delta", {"text": "Let me ", "turn": 0}, task_id="t1"),
        NewEvent(
            "reasoning.delta", {"text": "hm", "turn": 0, "reasoning_kind": "raw"}, task_id="t1"
        ),
        NewEvent("message.delta", {"text": "look.", "turn": 0}, task_id="t1"),
        NewEvent(
            "agent.response",
            {
                "turn": 0,
                "model": "m",
                "usage": {"input_tokens": 3, "output_tokens": 4, "reasoning_tokens": 2},
                "call": {"started_at": 0.5, "first_chunk_at": 0.625, "ended_at": 1.25},
                "finish_reason": "tool_use",
                "tool_calls": [{"call_id": "c1", "name": "t", "input": {}}],
            },
            task_id="t1",
        ),
        _vr("cot.step", step_id="n1", summary="Looking it up"),
        NewEvent("tool.started", {"call_id": "c1", "tool_key": "t", "turn": 0}, task_id="t1"),
        _vr("cot.step", step_id="n1", summary="Looked it up"),
        NewEvent("message.delta", {"text": "Done", "turn": 1}, task_id="t1"),
        NewEvent(
            "agent.response",
            {
                "turn": 1,
                "usage": {"input_tokens": 9},
                "error": "cut",
                "error_type": "E",
                "error_detail": "the provider said so",
            },
            task_id="t1",
        ),
        NewEvent("message.delta", {"text": "x", "turn": 2}, task_id="t2"),
        NewEvent(
            "run.failed",
            {"status": "failed", "error": "cut", "error_type": "E", "error_detail": 7},
        ),
    ],
    "notices, undeclared types, message, terminal": [
        NewEvent("capability.resolved", {"chain_of_thought": "surface", "model": "m"}),
        NewEvent("capability.resolved", {"capability": "search", "label": "Web search"}),
        NewEvent("plan.step_added", {"title": "Look"}),
        NewEvent("plan.step_added", {"stepId": "p1", "summary": "Compare"}),
        NewEvent("plan.step_added", {"stepId": "p1", "summary": "Compare, again"}),
        NewEvent("artifact.created", {"artifactId": "a1", "filename": "plan.md"}),
        NewEvent("artifact.ready", {"artifactId": "a1", "size": 3}),
        NewEvent("preview.updated", {"title": "Preview"}),
        NewEvent("reasoning.delta", {"text": "raw "}),
        NewEvent("reasoning.delta", {"delta": "more"}),
        NewEvent("message.delta", {"text": "Hel"}),
        NewEvent("message.delta", {"delta": "lo"}),
        NewEvent("message.delta", {}),
        NewEvent("message.partially_completed", {}),
        NewEvent("run.settlement.completed", {}),
    ],
    "the run's verdict wins over its last task's": [
        NewEvent("message.completed", {"text": "task two"}),
        NewEvent("run.settlement.completed", {"status": "partial"}),
    ],
    "an unknown verdict changes nothing": [
        NewEvent("message.partially_completed", {"text": "cut", "status": "completed"}),
        NewEvent("run.settlement.completed", {"status": "bogus"}),
    ],
    "a failed run with an error status": [
        NewEvent("message.completed", {"text": "x"}),
        NewEvent("run.error", {"status": "error"}),
    ],
    "final text replaces deltas, failure": [
        NewEvent("message.delta", {"text": "draft"}),
        NewEvent("message.completed", {"text": "final"}),
        NewEvent("run.failed", {"error": "x"}),
    ],
}


@pytest.mark.parametrize("name", list(EDGE_CASES))
def test_thread_js_builds_what_thread_py_builds(model_page: Page, name: str) -> None:
    events = _seq(EDGE_CASES[name])
    _assert_same(model_page, events)
    # replayed overlap (a resume from an earlier id) changes nothing
    _assert_same(model_page, events[:3] + events[1:])


def test_thread_js_on_real_runs_for_every_role(model_page: Page, daemon: Daemon) -> None:
    run_id = daemon.start_run(story_run("parity"))
    daemon.wait_done(run_id)
    for role in ("viewer", "member", "developer", "owner"):
        events = daemon.get(f"/v1/runs/{run_id}/events", role).json()["events"]
        assert events
        _assert_same(model_page, events)


@settings(max_examples=200, deadline=None)
@given(events=event_lists)
def test_thread_js_matches_thread_py_on_random_interleavings(
    model_page: Page, events: list[Event]
) -> None:
    _assert_same(model_page, events)


def test_the_page_loads_without_errors_or_outside_requests(
    browser: Browser, daemon: Daemon
) -> None:
    with page_for(browser) as (page, capture):
        sign_in(page, daemon.base_url, daemon.keys["viewer"])
        page.wait_for_selector("[data-testid=role]")
        capture.drain()
    assert all(url.startswith(daemon.base_url) for url in capture.urls())


HOSTILE = (
    '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'
    "<b id=tg-injected>bold</b>"
)
"""Markup where the page shows a prompt and a model's answer: text to show, never to run."""


@pytest.mark.parametrize("path", ["/", "/static/index.html"])
def test_markup_in_a_prompt_and_an_answer_is_shown_as_text_and_never_runs(
    browser: Browser, daemon: Daemon, path: str
) -> None:
    run_id = daemon.start_run({"prompt": HOSTILE, "model": "fake:echo"})
    daemon.wait_done(run_id)
    with page_for(browser) as (page, _):
        page.goto(daemon.base_url + path)
        page.fill("#key", daemon.keys["member"])
        page.click("#signin-form button[type=submit]")
        page.wait_for_selector("[data-testid=role]:text-is('member')")
        open_run(page, run_id)
        page.wait_for_selector("[data-testid=run-status]:text-is('completed')")
        page.wait_for_selector("[data-testid=answer-text]")
        assert page.inner_text("[data-testid=run-title]") == HOSTILE
        assert page.inner_text("[data-testid=answer-text]") == f"Echo: {HOSTILE}"
        assert HOSTILE in page.inner_text("#runs-list")
        assert page.locator("#tg-injected, img[src=x]").count() == 0
        assert page.evaluate("window.__pwned") is None


@pytest.mark.parametrize("fragment", ["%E0%A4%A", "%", "run_%00", "%ED%A0%80"])
def test_a_link_to_a_run_id_no_run_has_says_so_without_a_page_error(
    browser: Browser, daemon: Daemon, fragment: str
) -> None:
    """A shared link is the run id in the address's fragment; one that is not a run id (cut
    short, not UTF-8, NUL) leaves the page working and signed in, with no script error."""
    with page_for(browser) as (page, _):  # page_for fails the test on any error on the page
        sign_in(page, daemon.base_url, daemon.keys["viewer"])
        page.wait_for_selector("[data-testid=role]:text-is('viewer')")
        page.goto(f"{daemon.base_url}/#{fragment}")
        page.wait_for_selector("[data-testid=role]:text-is('viewer')")
        page.wait_for_load_state("networkidle")
        assert page.inner_text("[data-testid=run-error]") == "No such run."
        assert page.locator("#app").is_visible()


BIDI_PROMPT = "mirror invoice\u202etxt.exe \u2066isolated\u2069 \u05e9\u05dc\u05d5\u05dd\u200f \u05e2\u05d5\u05dc\u05dd"
"""What ``fake:mirror`` puts into a tool's input, output, error and name and into the answer: an
override (U+202E) and an isolate (U+2066 .. U+2069) a browser obeys -- ``invoice\\u202etxt.exe``
reads ``invoiceexe.txt`` -- and Hebrew with an RLM, which right-to-left text needs as it is."""

BIDI_CONTROLS = [chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))]


def test_bidi_controls_a_model_chose_are_shown_not_obeyed_and_hebrew_stays(
    browser: Browser, daemon: Daemon
) -> None:
    """The page shows what the CLI shows (``inert_text``): the prompt in the run list and the
    title, a step, a tool card's input, output and error, and the answer show ``\\u202e``
    where the run holds U+202E, and no such control is anywhere in the page (text or
    attribute) to reorder it; the Hebrew and its RLM are shown as they are. The API still
    returns the prompt as it was given."""
    run_id = daemon.start_run(
        {
            "prompt": BIDI_PROMPT,
            "model": "fake:mirror",
            "chain_of_thought": "surface",
            "tools": ["lookup", "explode"],
        }
    )
    daemon.wait_done(run_id)
    shown = inert_text(BIDI_PROMPT)
    assert "invoice\\u202etxt.exe \\u2066isolated\\u2069" in shown
    with page_for(browser) as (page, _):
        sign_in(page, daemon.base_url, daemon.keys["member"])
        page.wait_for_selector("[data-testid=role]:text-is('member')")
        open_run(page, run_id)
        page.wait_for_selector("[data-testid=answer-text]")
        listed = page.inner_text(f"#runs-list a[data-run='{run_id}'] .run-prompt")
        title = page.inner_text("[data-testid=run-title]")
        answer = page.inner_text("[data-testid=answer-text]")
        thread = page.inner_text("[data-testid=thread-items]")
        inputs = page.locator("[data-testid=tool-input]").all_text_contents()
        outputs = page.locator("[data-testid=tool-output]").all_text_contents()
        errors = page.locator("[data-testid=tool-error]").all_inner_texts()
        labels = page.locator("[data-testid=tool-card] .tool-label").all_inner_texts()
        html = page.content()
    assert listed == title == shown
    assert answer == f"Echo: {shown}"
    assert inert_text(MIRROR_STEP) in thread
    as_json = json.dumps({"query": BIDI_PROMPT}, indent=2, ensure_ascii=False)
    assert inputs == [inert_text(as_json)] * 2  # lookup's and explode's
    assert outputs == [f"result for {shown}"]
    assert any(e.endswith(f"nothing found for {shown}") for e in errors)
    # the tool the model named with the prompt, which no tool is: a name that is no plain
    # identifier is recorded as the unknown tool's (ADR 0168), so no control reaches the label
    assert BAD_TOOL_NAME in labels
    assert not [c for c in BIDI_CONTROLS if c in html]
    assert "\u05e9\u05dc\u05d5\u05dd\u200f \u05e2\u05d5\u05dc\u05dd" in answer
    assert daemon.get(f"/v1/runs/{run_id}", "member").json()["prompt"] == BIDI_PROMPT


def test_a_model_name_the_filter_suggests_is_shown_inert_and_filters_by_the_name_as_it_is(
    browser: Browser, daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runs filter suggests the models of the runs listed, in a ``<datalist>``; an
    ``<option value>`` is what the dropdown shows and what picking it puts in the field, so a
    bidi control in a model's name reordered both, and the page left it raw because the value
    goes back to the API. Now the suggestion is the inert name, and the filter (or a new run's
    form) sends a suggestion picked as the model it stands for: the list filters to that run."""
    name = "echo\u202etxt.exe"
    monkeypatch.setitem(FAKE_SCRIPTS, name, FAKE_SCRIPTS["echo"])
    model, plain = f"fake:{name}", "fake:echo"
    run_id = daemon.start_run({"prompt": "a model named with an override", "model": model})
    other = daemon.start_run({"prompt": "a plain model", "model": plain})
    daemon.wait_done(run_id)
    daemon.wait_done(other)
    with page_for(browser) as (page, _):
        sign_in(page, daemon.base_url, daemon.keys["member"])
        page.wait_for_selector("[data-testid=role]:text-is('member')")
        page.click("#refresh")
        page.wait_for_selector(f"#runs-list a[data-run='{run_id}']")
        suggested = page.eval_on_selector_all("#models option", "os => os.map((o) => o.value)")
        assert inert_text(model) in suggested and plain in suggested, suggested
        assert not [c for c in BIDI_CONTROLS if c in page.content()]
        page.click("#more-filters summary")
        page.fill("#f-model", inert_text(model))  # what picking the suggestion puts there
        page.press("#f-model", "Enter")
        page.wait_for_selector(f"#runs-list a[data-run='{other}']", state="detached")
        listed = page.eval_on_selector_all("#runs-list a", "as => as.map((a) => a.dataset.run)")
    assert listed == [run_id]
