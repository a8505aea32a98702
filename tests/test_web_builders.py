"""The web page for the people who build agents, in headless Debian chromium against a real daemon
on loopback: each model turn with its reasoning, what it said, its tool calls, tokens and timings;
errors where they happened; the trace of telemetry_only runs; run totals that match the event
log; a run list that lives, filters, searches and pages; starting a run; the reader's time zone;
the keyboard; a 390 px screen; no layout jump while streaming -- and for a viewer still nothing
that names reasoning they cannot see.

Without chromium these tests FAIL and say how to install it; they never skip."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from playwright.sync_api import Browser, Page
from support.browser import Capture, browser, page_for, sign_in
from support.daemon import Daemon
from support.web import (
    SAID_ANSWER,
    SAID_FIRST,
    raw_marker,
    said_marker,
    seed_run,
    story_run,
    web_daemon,
)

from thoughtgate.events.schema import NewEvent

pytestmark = pytest.mark.browser
__all__ = ["browser"]  # the fixture this module uses (one chromium per module)

PAGED = 60
"""Seeded runs named "paged run N": more than one page of the list (50)."""


def _seeds() -> list[Any]:
    seeds = [
        seed_run(
            f"run_paged{i:03d}", [NewEvent("run.started", {"prompt": "x"})], prompt=f"paged run {i}"
        )
        for i in range(PAGED)
    ]
    interrupted = [
        NewEvent("run.started", {"prompt": "an interrupted run"}),
        NewEvent("run.interrupted", {"status": "interrupted", "reason": "the daemon shut down"}),
    ]
    seeds.append(
        seed_run(
            "run_interrupted0",
            interrupted,
            prompt="an interrupted run",
            status="interrupted",
            error="the daemon shut down",
        )
    )
    return seeds


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with web_daemon(shutdown_grace_s=0.1, seeds=_seeds()) as d:
        yield d


def _signed_in(page: Page, daemon: Daemon, role: str) -> None:
    sign_in(page, daemon.base_url, daemon.keys[role])
    page.wait_for_selector(f"[data-testid=role]:text-is('{role}')")
    page.wait_for_selector("[data-testid=list-live]:visible")  # the list follows the daemon


def _open(page: Page, run_id: str) -> None:
    page.click(f"#runs-list a[data-run='{run_id}']")


def _done(page: Page, status: str = "completed") -> None:
    page.wait_for_selector(f"[data-testid=run-status]:text-is('{status}')", timeout=20_000)
    assert page.locator("[data-testid=live]").count() == 0


def _events(daemon: Daemon, run_id: str, role: str) -> list[dict[str, Any]]:
    return list(daemon.get(f"/v1/runs/{run_id}/events?limit=5000", role).json()["events"])


TURNS_JS = """() => [...document.querySelectorAll('[data-testid=turn]')].map((t) => ({
  turn: Number(t.dataset.turn),
  items: [...t.querySelectorAll('[data-item]')].map((i) => i.dataset.item),
  tokens: (() => { const n = t.querySelector('[data-testid=turn-tokens]');
    return n ? [n.dataset.in, n.dataset.out, n.dataset.reasoning] : null; })(),
  ttft: t.querySelector('[data-testid=turn-ttft]')?.dataset.value ?? null,
  duration: t.querySelector('[data-testid=turn-duration]')?.dataset.value ?? null,
  finish: t.querySelector('[data-testid=turn-finish]')?.innerText ?? null,
  model: t.querySelector('[data-testid=turn-model]')?.innerText ?? null,
  error: t.querySelector('[data-testid=turn-error]')?.innerText ?? null,
  calls: [...t.querySelectorAll('[data-testid=tool-card]')].map((c) => c.dataset.call),
}))"""


def _turns(page: Page) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = page.evaluate(TURNS_JS)
    return result


# --------------------------------------------------------------------------- per model turn


def test_developer_reads_each_turn_with_its_reasoning_next_to_its_tool_call(
    browser: Browser, daemon: Daemon
) -> None:
    token = "builderturns"
    with page_for(browser) as (page, capture):
        _signed_in(page, daemon, "developer")
        run_id = daemon.start_run(story_run(token, delay=0.2))
        _open(page, run_id)
        page.wait_for_selector("[data-testid=live]")
        page.wait_for_selector("[data-testid=turn][data-turn='0'] [data-testid=tool-card]")
        _done(page)
        live = _turns(page)
        # each turn: its reasoning, then what it narrated and the tool it called, in that turn
        assert [t["turn"] for t in live] == [0, 1, 2, 3]
        assert [t["calls"] for t in live] == [
            ["call_check_weather_0"],
            ["call_find_trains_1"],
            [],
            [],
        ]
        for t in live[:3]:
            assert t["items"][0] == "reasoning" and "step" in t["items"]
        assert live[0]["items"].index("reasoning") < live[0]["items"].index("tool")
        assert "reasoning" not in live[3]["items"]  # the answer turn had none
        labels = page.locator(
            "[data-testid=turn][data-turn='0'] [data-testid=reasoning-label]"
        ).all_inner_texts()
        assert labels == ["Reasoning (provider summary)", "Raw reasoning"]
        assert raw_marker(token) in page.inner_text("[data-testid=turn][data-turn='0']")
        # and per turn: model, tokens, time to first token, duration, finish reason
        responses = [
            e["payload"]
            for e in _events(daemon, run_id, "developer")
            if e["type"] == "agent.response"
        ]
        for shown, recorded in zip(live, responses, strict=True):
            usage = recorded["usage"]
            assert shown["tokens"] == [
                str(usage["input_tokens"]),
                str(usage["output_tokens"]),
                str(usage["reasoning_tokens"]),
            ]
            call = recorded["call"]
            assert float(shown["ttft"]) == call["first_chunk_at"] - call["started_at"]
            assert float(shown["duration"]) == call["ended_at"] - call["started_at"]
            assert shown["finish"] == recorded["finish_reason"]
            assert shown["model"] == recorded["model"]
        assert live[0]["finish"] == "tool_calls" and live[3]["finish"] == "stop"
        assert page.locator("[data-testid=tool-input]").count() == 2  # arguments ...
        assert page.locator("[data-testid=tool-output]").count() == 2  # ... and results
        page.wait_for_load_state("networkidle")
        capture.drain()
        page.reload()
        _done(page)
        assert _turns(page) == live  # after a reload: the same


def test_text_said_before_a_tool_call_stays_where_it_was_said(
    browser: Browser, daemon: Daemon
) -> None:
    with page_for(browser) as (viewer, _), page_for(browser) as (developer, _):
        _signed_in(viewer, daemon, "viewer")
        _signed_in(developer, daemon, "developer")
        body = {**story_run("", delay=0.6), "model": "fake:saytool", "tools": ["check_weather"]}
        run_id = daemon.start_run(body)
        for page in (viewer, developer):
            _open(page, run_id)
        # while it is said, it streams where an answer would
        viewer.wait_for_selector("[data-testid=answer-text]:has-text('Let me check')")
        # then the tool call comes: the words stay, before the card, and are no answer
        viewer.wait_for_selector("[data-testid=tool-card]")
        said = viewer.locator("[data-testid=said]")
        assert said.count() == 1 and said.inner_text().endswith(SAID_FIRST)
        kinds = viewer.eval_on_selector_all(
            "[data-testid=thread-items] [data-item]", "(ns) => ns.map((n) => n.dataset.item)"
        )
        assert kinds.index("said") < kinds.index("tool")
        for page in (viewer, developer):
            _done(page)
            page.wait_for_selector(f"[data-testid=answer-text]:text-is('{SAID_ANSWER}')")
            assert page.inner_text("[data-testid=said-text]") == SAID_FIRST
        first = _turns(developer)[0]
        assert [k for k in first["items"] if k != "phase"] == ["reasoning", "said", "tool"]
        viewer.reload()
        _done(viewer)
        assert viewer.inner_text("[data-testid=said-text]") == SAID_FIRST
        assert viewer.inner_text("[data-testid=answer-text]") == SAID_ANSWER


def test_run_totals_match_the_event_log(browser: Browser, daemon: Daemon) -> None:
    run_id = daemon.start_run(story_run("totals"))
    view = daemon.wait_done(run_id)
    events = _events(daemon, run_id, "developer")
    responses = [e for e in events if e["type"] == "agent.response"]
    calls = {e["payload"]["call_id"] for e in events if e["type"].startswith("tool.")}
    usage = [e["payload"]["usage"] for e in responses]
    duration = events[-1]["ts"] - next(e["ts"] for e in events if e["type"] == "run.started")
    with page_for(browser) as (page, _):
        _signed_in(page, daemon, "developer")
        _open(page, run_id)
        _done(page)
        totals = page.locator("[data-testid=totals]")
        assert int(
            totals.locator("[data-testid=total-turns]").get_attribute("data-value") or ""
        ) == len(responses)
        assert int(
            totals.locator("[data-testid=total-tools]").get_attribute("data-value") or ""
        ) == len(calls)
        tokens = totals.locator("[data-testid=total-tokens]")
        for attr, field in (("data-in", "input_tokens"), ("data-out", "output_tokens")):
            shown = int(tokens.get_attribute(attr) or "")
            assert shown == sum(u[field] for u in usage) == view["usage"][field]
        assert int(tokens.get_attribute("data-reasoning") or "") == sum(
            u["reasoning_tokens"] for u in usage
        )
        shown_duration = float(
            totals.locator("[data-testid=total-duration]").get_attribute("data-value") or ""
        )
        assert shown_duration == pytest.approx(duration, abs=1e-6)
        assert "4 model turns · 2 tool calls" in totals.inner_text()


# --------------------------------------------------------------------------- errors


def test_a_failed_run_shows_its_error_on_the_turn_and_the_run_with_its_type(
    browser: Browser, daemon: Daemon
) -> None:
    run_id = daemon.start_run({"prompt": "builder outage", "model": "fake:outage"})
    error = daemon.wait_done(run_id)["error"]
    with page_for(browser) as (page, _):
        _signed_in(page, daemon, "developer")
        listed = page.locator(f"#runs-list a[data-run='{run_id}']")
        listed.wait_for()
        assert listed.locator("[data-testid=run-list-status]").inner_text() == "failed"
        assert error in listed.locator("[data-testid=run-list-error]").inner_text()
        _open(page, run_id)
        _done(page, "failed")
        (turn,) = _turns(page)
        assert turn["error"] is not None and error in turn["error"]
        assert page.inner_text("[data-testid=turn-error-type]") == "overloaded"
        assert error in page.inner_text("[data-testid=answer-error]")
        assert page.inner_text("[data-testid=run-error-type]") == "overloaded"
        # the list marks every run that did not complete
        for status in ("failed", "interrupted"):
            assert page.locator(f"#runs-list a.s-{status}").count() >= 1
        interrupted = page.locator("#runs-list a[data-run='run_interrupted0']")
        if interrupted.count() == 0:  # on a later page: find it
            page.fill("#search", "an interrupted run")
            interrupted.wait_for()
        assert interrupted.locator("[data-testid=run-list-status]").inner_text() == "interrupted"


@pytest.mark.parametrize("role", ["developer", "viewer", "member"])
def test_a_failure_s_own_words_show_to_developers_and_leave_no_trace_for_others(
    browser: Browser, daemon: Daemon, role: str
) -> None:
    """ADR 0073: the provider's error text (``error_detail``) shows under the turn's and the
    run's error for developers; the server's one output filter withholds it from the others, and
    the page decides nothing -- no line, no element, no attribute, no byte received."""
    token = f"detail{role}"
    said = said_marker(token)
    run_id = daemon.start_run({**story_run(token), "model": "fake:story-outage"})
    assert daemon.wait_done(run_id)["status"] == "failed"
    with page_for(browser) as (page, capture):
        _signed_in(page, daemon, role)
        _open(page, run_id)
        _done(page, "failed")
        page.wait_for_selector("[data-testid=answer-error]")
        if role == "developer":
            run_detail = page.inner_text("[data-testid=run-error-detail]")
            assert said in run_detail and run_detail.startswith("said: ")
            assert said in page.inner_text("[data-testid=turn-error-detail]")
            assert said not in page.inner_text("[data-testid=answer-error]")  # public stays so
            return
        assert "HTTP 529" in page.inner_text("[data-testid=answer-error]")
        assert page.locator(".error-detail, [data-testid$=error-detail]").count() == 0
        assert said not in page.content()  # the DOM, attributes included
        assert said not in page.inner_text("body") and "said:" not in page.inner_text("body")
        assert said not in capture.everything()  # nor anything the browser received
        assert "error_detail" not in capture.everything(url_part=run_id)


# --------------------------------------------------------------------------- the trace


def test_the_trace_of_a_telemetry_only_run_opens_for_developers_only(
    browser: Browser, daemon: Daemon
) -> None:
    token = "buildertrace"
    marker = raw_marker(token)
    run_id = daemon.start_run({**story_run(token), "chain_of_thought": "telemetry_only"})
    daemon.wait_done(run_id)
    with page_for(browser) as (page, capture):
        _signed_in(page, daemon, "developer")
        _open(page, run_id)
        _done(page)
        assert page.locator("[data-testid=reasoning-turn]").count() == 0  # never on display
        assert "in the trace" in page.inner_text("[data-testid=receipt]")
        assert marker not in capture.everything()
        page.click("[data-testid=open-trace]")
        page.wait_for_selector("[data-testid=trace-reasoning]")
        assert marker in page.inner_text("[data-testid=trace]")
        assert len(_turns(page)) == 4  # the turns' tokens and timings are there all the same
    for role in ("viewer", "member"):
        with page_for(browser) as (page, capture):
            _signed_in(page, daemon, role)
            _open(page, run_id)
            _done(page)
            assert page.locator("[data-testid=open-trace]").count() == 0
            assert page.locator("[data-testid=turn]").count() == 0  # today's view
            page.wait_for_load_state("networkidle")
            assert marker not in capture.everything()
            assert "raw reasoning" not in page.inner_text("body").lower()


# --------------------------------------------------------------------------- the run list


def _list_reads(capture: Capture) -> int:
    capture.drain()
    return sum(len(bodies) for url, bodies in capture.bodies.items() if "/v1/runs?" in url)


def _listed(page: Page) -> list[str]:
    return page.eval_on_selector_all("#runs-list a", "(ns) => ns.map((n) => n.dataset.run)")


def test_the_run_list_updates_live_and_search_finds_a_run(browser: Browser, daemon: Daemon) -> None:
    word = f"zebra{time.monotonic_ns()}"
    with page_for(browser) as (page, capture):
        _signed_in(page, daemon, "viewer")
        lists_read = _list_reads(capture)
        run_id = daemon.start_run(
            {
                "prompt": f"approve the {word} release",
                "model": "fake:approval",
                "tools": ["dangerous"],
            }
        )
        listed = page.locator(f"#runs-list a[data-run='{run_id}']")
        listed.wait_for()  # no reload: the list stream brought it
        listed.locator("[data-testid=run-list-status]:text-is('running')").wait_for()
        with daemon.client("member") as c:
            c.post(f"/v1/runs/{run_id}/approvals/call_danger", json={"decision": "approve"})
        listed.locator("[data-testid=run-list-status]:text-is('completed')").wait_for()
        assert _list_reads(capture) == lists_read  # not re-read: it lives
        assert any("/v1/runs/stream?" in u for u in capture.urls())

        # search: only the run whose prompt says it, and a new one that says it arrives live
        page.fill("#search", word.upper())
        page.wait_for_function(
            "(id) => [...document.querySelectorAll('#runs-list a')].map((a) => a.dataset.run)"
            ".join() === id",
            arg=run_id,
        )
        other = daemon.start_run({"prompt": "nothing to see", "model": "fake:echo"})
        second = daemon.start_run({"prompt": f"also {word}", "model": "fake:echo"})
        page.locator(f"#runs-list a[data-run='{second}']").wait_for()
        daemon.wait_done(other)
        page.wait_for_timeout(500)
        assert _listed(page) == [second, run_id]

        # a filter: failed runs only, and a run that fails arrives in it live
        page.fill("#search", "")
        page.click("#more-filters summary")
        page.select_option("#f-status", "failed,error")
        failing = daemon.start_run({"prompt": f"{word} outage", "model": "fake:outage"})
        page.locator(f"#runs-list a[data-run='{failing}']").wait_for()
        statuses = page.locator("#runs-list [data-testid=run-list-status]").all_inner_texts()
        assert statuses and set(statuses) == {"failed"}


def test_pages_of_the_run_list_hold_together(browser: Browser, daemon: Daemon) -> None:
    with page_for(browser) as (page, _):
        _signed_in(page, daemon, "viewer")
        page.fill("#search", "paged run")
        page.wait_for_function(
            "() => { const p = [...document.querySelectorAll('#runs-list [data-testid=run-prompt]')];"
            " return p.length === 50 && p.every((n) => n.innerText.startsWith('paged run')); }"
        )
        page.click("[data-testid=more]")
        page.wait_for_function(
            f"() => document.querySelectorAll('#runs-list a').length === {PAGED}"
        )
        shown = _listed(page)
        assert len(set(shown)) == PAGED
        assert sorted(shown) == [f"run_paged{i:03d}" for i in range(PAGED)]
        assert page.locator("[data-testid=more]").is_hidden()


# --------------------------------------------------------------------------- starting a run


def test_a_member_starts_a_run_from_the_page_and_a_viewer_cannot(
    browser: Browser, daemon: Daemon
) -> None:
    with page_for(browser) as (page, _):
        _signed_in(page, daemon, "member")
        page.keyboard.press("n")
        page.wait_for_selector("[data-testid=new-run-form]")
        page.fill("[data-testid=nr-prompt]", "Is it sunny in Porto? (started from the page)")
        page.fill("[data-testid=nr-model]", "fake:saytool")
        page.select_option("[data-testid=nr-mode]", "surface")
        page.check("[data-testid=nr-tool][value=check_weather]")
        page.click("[data-testid=nr-submit]")
        page.wait_for_function("() => location.hash.startsWith('#run_')")
        run_id = page.evaluate("() => decodeURIComponent(location.hash.slice(1))")
        _done(page)
        assert page.inner_text("[data-testid=answer-text]") == SAID_ANSWER
        assert page.locator("[data-testid=tool-card][data-status=completed]").count() == 1
        view = daemon.get(f"/v1/runs/{run_id}", "owner").json()
        assert (view["chain_of_thought"], view["model"]) == ("surface", "fake:saytool")
        member_key = daemon.get("/v1/me", "member").json()["key_id"]
        assert view["started_by"] == member_key
        # "started by me" finds it
        page.click("#more-filters summary")
        page.select_option("#f-key", "me")
        page.locator(f"#runs-list a[data-run='{run_id}']").wait_for()
        # a bad model is refused with the daemon's words, and nothing is started
        page.click("#new-run")
        page.fill("[data-testid=nr-prompt]", "x")
        page.fill("[data-testid=nr-model]", "nosuch:model")
        page.click("[data-testid=nr-submit]")
        page.wait_for_selector("[data-testid=new-run-error]:not(:empty)")
        assert "nosuch" in page.inner_text("[data-testid=new-run-error]")
    with page_for(browser) as (page, _):
        _signed_in(page, daemon, "viewer")
        assert page.locator("#new-run").is_hidden()
        page.keyboard.press("n")
        assert page.locator("[data-testid=new-run-form]").count() == 0


# --------------------------------------------------------------------------- reading comfort


@pytest.mark.parametrize("zone", ["Asia/Tokyo", "America/Los_Angeles"])
def test_times_are_shown_in_the_readers_time_zone(
    browser: Browser, daemon: Daemon, zone: str
) -> None:
    run_id = daemon.start_run(story_run("tz"))
    created = daemon.wait_done(run_id)["created_at"]
    with page_for(browser, timezone_id=zone) as (page, _):
        _signed_in(page, daemon, "developer")
        _open(page, run_id)
        _done(page)
        shown = page.get_attribute("[data-testid=run-started]", "datetime")
        local = dt.datetime.fromtimestamp(int(created), ZoneInfo(zone))
        assert shown == local.isoformat(timespec="seconds")
        assert zone in (page.get_attribute("[data-testid=run-started]", "title") or "")
        started = page.locator("[data-testid=turn-started]").first.get_attribute("datetime") or ""
        assert started.endswith(local.isoformat()[-6:])  # the turns' times too: same offset


def test_the_keyboard_reaches_everything(browser: Browser, daemon: Daemon) -> None:
    run_id = daemon.start_run(story_run("keys"))
    daemon.wait_done(run_id)
    with page_for(browser) as (page, _):
        _signed_in(page, daemon, "developer")
        first_stop = "() => document.querySelector('a[href], button, input, select, textarea').id"
        assert page.evaluate(first_stop) == "skip"  # the first Tab stop skips header and list
        page.focus("#skip")
        page.keyboard.press("Enter")
        assert page.evaluate("() => document.activeElement.id") == "thread"
        page.keyboard.press("/")
        assert page.evaluate("() => document.activeElement.id") == "search"
        page.keyboard.press("Escape")
        page.focus("#runs-list a")
        first = page.evaluate("() => document.activeElement.dataset.run")
        page.keyboard.press("ArrowDown")
        second = page.evaluate("() => document.activeElement.dataset.run")
        assert second != first
        page.keyboard.press("ArrowUp")
        assert page.evaluate("() => document.activeElement.dataset.run") == first
        page.focus(f"#runs-list a[data-run='{run_id}']")
        page.keyboard.press("Enter")
        _done(page)
        for key, turn in (("j", "0"), ("j", "1"), ("j", "2"), ("k", "1")):
            page.keyboard.press(key)
            assert page.evaluate("() => document.activeElement.dataset.turn") == turn


@pytest.mark.parametrize("role", ["viewer", "developer"])
def test_readable_on_a_390_px_wide_screen(browser: Browser, daemon: Daemon, role: str) -> None:
    run_id = daemon.start_run(story_run("narrow"))
    daemon.wait_done(run_id)
    with page_for(browser, width=390, height=844) as (page, _):
        _signed_in(page, daemon, role)
        _open(page, run_id)
        _done(page)
        page.wait_for_selector("[data-testid=receipt]")
        assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
        for testid in ("run-title", "answer", "search"):
            box = page.locator(f"[data-testid={testid}]").bounding_box()
            assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390


SAMPLE_JS = """() => ({
  live: document.querySelector('[data-testid=live]') !== null,
  ended: document.querySelector('[data-testid=answer][data-outcome]') !== null,
  tops: Object.fromEntries([...document.querySelectorAll('#thread [data-key]')]
    .filter((n) => n.matches('[data-item], [data-testid=turn]'))
    .map((n) => [n.dataset.key, Math.round(n.getBoundingClientRect().top + scrollY)])),
})"""
"""Whether the run is live, whether it has ended, and where each shown item is: one reading of the
page (separate round trips could straddle a render, e.g. the one that ends the run)."""


@pytest.mark.parametrize("role", ["viewer", "developer"])
def test_nothing_already_shown_moves_while_a_run_streams(
    browser: Browser, daemon: Daemon, role: str
) -> None:
    """... nor when it ends: the page's last render of the run moves nothing either."""
    with page_for(browser) as (page, _):
        _signed_in(page, daemon, role)
        run_id = daemon.start_run(story_run("", delay=0.3))
        _open(page, run_id)
        page.wait_for_selector("[data-testid=live]")
        first_seen: dict[str, int] = {}
        moved: list[tuple[str, int, int]] = []
        while True:
            sample = page.evaluate(SAMPLE_JS)
            for key, top in sample["tops"].items():
                if key in first_seen and abs(first_seen[key] - top) > 1:
                    moved.append((key, first_seen[key], top))
                first_seen.setdefault(key, top)
            if sample["ended"]:
                assert not sample["live"]
                break
            page.wait_for_timeout(60)
        assert len(first_seen) >= 5, first_seen
        assert moved == []
