"""The web page against hostile text and a hostile origin, in headless Debian chromium (ADR 0159).

Every string a provider, a tool or a member controls -- a prompt, an answer, a step, a tool's
name, input, output and error, raw reasoning, a run's error and its id -- holds markup that would
run script, load a sentinel URL or add elements if the page ever wrote it as HTML: nothing runs,
nothing is fetched, no element appears, and the page's content security policy is never
violated (the page needs no inline script or style). A page on another origin reads nothing of
the daemon, and one that rebinds its own name to the daemon's address is refused.

Without chromium these tests FAIL and say how to install it; they never skip."""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import quote

import pytest
from playwright.sync_api import Browser, Page
from support.browser import launch, page_for, sign_in
from support.daemon import Daemon
from support.web import other_site, seed_run, step_event, web_daemon

from thoughtgate.events.schema import NewEvent

pytestmark = pytest.mark.browser

EVIL = "evil.example"
SENTINEL = "sentinel.invalid"
HOSTILE = (
    '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script></script>'
    '<svg onload="window.__pwned=3"></svg><a id=tg-link href="javascript:window.__pwned=4">x</a>'
    f'[link](javascript:window.__pwned=5)<img src="http://{SENTINEL}/p.png">'
    "<iframe srcdoc='<script>parent.__pwned=6</script>'></iframe>"
    "<style>body{display:none}</style><b id=tg-injected>bold</b>\u202e"
)
"""Markup, a markdown link and a bidi override: text to show, never to run."""
HOSTILE_WORD = f"<svg/onload=window.__pwned=7><img/src=//{SENTINEL}/w.png>"
"""The same without spaces, for the fake scripts' ``token=`` (raw reasoning)."""
HOSTILE_ID = "run_'\"><img src=x onerror=window.__pwned=8>"
JS_ID = "javascript:window.__pwned=9"
INJECTED = "#tg-injected, #tg-link, img[src=x], iframe, svg:not(.logo svg), style:not(head style)"

WATCH = """
window.__csp = [];
document.addEventListener('securitypolicyviolation',
  (e) => window.__csp.push(`${e.violatedDirective} ${e.blockedURI}`));
"""
"""Each violation of the content security policy, as the page meets it."""


HOSTILE_EVENTS = [
    NewEvent("run.started", {"prompt": HOSTILE}),
    step_event("cot.step", "s1", HOSTILE),
    NewEvent("agent.response", {"turn": 0, "answer": "", "reasoning": HOSTILE}),
    NewEvent(
        "tool.started",
        {"call_id": "c1", "tool_key": HOSTILE, "label": HOSTILE, "input": {HOSTILE: HOSTILE}},
    ),
    step_event("cot.step", "s2", HOSTILE, tool_call_id="c1"),
    NewEvent("tool.completed", {"call_id": "c1", "tool_key": HOSTILE, "output": HOSTILE}),
    NewEvent("message.delta", {"text": HOSTILE}),
    NewEvent("message.completed", {"text": HOSTILE, "reasoning": HOSTILE}),
    NewEvent("run.settlement.completed", {"status": "failed"}),
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Chromium that resolves ``evil.example`` to 127.0.0.1: a rebound name, as its attacker's
    DNS would answer once the page is loaded."""
    try:
        with launch([f"--host-resolver-rules=MAP {EVIL} 127.0.0.1"]) as b:
            yield b
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    seeds = [
        seed_run(HOSTILE_ID, HOSTILE_EVENTS, prompt=HOSTILE, status="failed", error=HOSTILE),
        seed_run(JS_ID, HOSTILE_EVENTS[:2], prompt=JS_ID, status="failed", error=JS_ID),
    ]
    with web_daemon(seeds=seeds, shutdown_grace_s=0.1) as d:
        yield d


def _watched(page: Page) -> list[str]:
    """The URLs the page asks for, from now on (a sentinel one means markup was obeyed)."""
    asked: list[str] = []
    page.add_init_script(WATCH)
    page.on("request", lambda request: asked.append(request.url))
    return asked


def _open(page: Page, daemon: Daemon, run_id: str, model: str) -> None:
    """Open the run by its link, and wait until its own header (its model) is on screen."""
    page.goto(f"{daemon.base_url}/#{quote(run_id, safe='')}")
    page.wait_for_selector(f"[data-testid=run-model]:text-is('{model}')")
    page.wait_for_selector("[data-testid=live]", state="detached")
    page.wait_for_load_state("networkidle")


def _assert_inert(page: Page, asked: list[str]) -> None:
    if page.locator("[data-testid=open-trace]").count():
        page.click("[data-testid=open-trace]")
    closed = page.locator("#thread details:not([open]) > summary")
    for _ in range(50):  # every panel shown: reasoning, trace, tools
        if not closed.count():
            break
        closed.first.click()
    page.wait_for_load_state("networkidle")
    assert page.evaluate("window.__pwned") is None
    assert page.evaluate("window.__csp") == []
    assert page.locator(INJECTED).count() == 0, page.content()[:2000]
    assert not [url for url in asked if SENTINEL in url or not url.startswith("http://127.")]
    assert page.locator("body").is_visible()


def test_markup_in_every_text_a_run_holds_is_shown_and_never_obeyed(
    browser: Browser, daemon: Daemon
) -> None:
    """A developer (who is sent everything: raw reasoning, tool detail, a failure's words)
    opens runs whose every text is hostile: a run seeded with it in its id, prompt, steps, tool
    name, label, input and output, reasoning, answer and error; a live run that mirrors it
    into a tool's name, input, output and error and its answer; one whose raw reasoning holds
    it; and one whose id is a ``javascript:`` URL, opened from its link in the list."""
    mirrored = daemon.start_run(
        {
            "prompt": HOSTILE,
            "model": "fake:mirror",
            "chain_of_thought": "surface",
            "tools": ["lookup", "explode"],
        }
    )
    thought = daemon.start_run(
        {
            "prompt": HOSTILE_WORD,
            "model": "fake:story",
            "chain_of_thought": "surface",
            "tools": ["check_weather", "find_trains"],
            "system": f"token={HOSTILE_WORD} delay=0",
        }
    )
    for run_id in (mirrored, thought):
        daemon.wait_done(run_id)
    with page_for(browser) as (page, _):
        asked = _watched(page)
        sign_in(page, daemon.base_url, daemon.keys["developer"])
        page.wait_for_selector("[data-testid=role]:text-is('developer')")
        page.wait_for_selector(f"#runs-list a[data-run={json.dumps(HOSTILE_ID)}]")
        page.fill("#search", "<")
        page.press("#search", "Enter")  # a form the page's script handles: posts nowhere
        page.fill("#search", "")
        page.press("#search", "Enter")
        page.wait_for_selector(f"#runs-list a[data-run={json.dumps(JS_ID)}]")
        opened = ((HOSTILE_ID, "fake:seeded"), (mirrored, "fake:mirror"), (thought, "fake:story"))
        for run_id, model in opened:
            _open(page, daemon, run_id, model)
            _assert_inert(page, asked)
        assert page.inner_text("[data-testid=run-title]") == HOSTILE_WORD
        assert HOSTILE_WORD in page.inner_text("#thread")  # the raw reasoning, as text
        _open(page, daemon, HOSTILE_ID, "fake:seeded")
        shown = HOSTILE.replace("\u202e", "\\u202e")
        assert page.inner_text("[data-testid=run-title]") == shown
        assert shown in page.inner_text("#thread")
        page.click(f"#runs-list a[data-run={json.dumps(JS_ID)}]")
        page.wait_for_selector(f"[data-testid=run-title]:text-is({json.dumps(JS_ID)})")
        _assert_inert(page, asked)
        assert page.url.endswith("#" + quote(JS_ID, safe=""))
        assert not page.locator("a[href^='javascript:' i]").count()


def test_a_name_rebound_to_the_daemons_address_gets_no_page(
    browser: Browser, daemon: Daemon
) -> None:
    """DNS rebinding: ``http://evil.example:PORT`` now resolves to 127.0.0.1, so its page is
    the same origin as what answers there. The daemon answers it 400 with no page (no sign-in
    form to collect a key under the attacker's name), and a script on it reads nothing."""
    port = daemon.base_url.rsplit(":", 1)[1]
    with page_for(browser) as (page, _):
        first = page.goto(f"http://{EVIL}:{port}/")
        assert first is not None and first.status == 400
        assert page.locator("#signin-form").count() == 0
        for path in ("/healthz", "/openapi.json", "/static/app.js"):
            answer = page.evaluate("(p) => fetch(p).then((r) => r.status)", path)
            assert answer == 400, path


@pytest.fixture(scope="module")
def elsewhere() -> Iterator[str]:
    """Another site's page, on loopback too (``support.web.other_site``)."""
    with other_site() as port:
        yield f"http://127.0.0.1:{port}/"


READ_ACROSS = """async ([base, runId, ticket]) => {
  const out = {};
  for (const path of ['/healthz', '/openapi.json', '/', `/v1/runs/${runId}/stream?ticket=${ticket}`]) {
    try { await (await fetch(base + path)).text(); out[path] = 'read'; }
    catch (e) { out[path] = 'refused'; }
  }
  out.sse = await new Promise((done) => {
    const es = new EventSource(`${base}/v1/runs/${runId}/stream?ticket=${ticket}`);
    es.onmessage = () => { es.close(); done('message'); };
    es.onerror = () => { es.close(); done('error'); };
  });
  const sent = await fetch(base + '/v1/runs', { method: 'POST', mode: 'no-cors',
    headers: { 'content-type': 'text/plain' },
    body: JSON.stringify({ prompt: 'from elsewhere', model: 'fake:echo' }) });
  out.post = sent.type;  // "opaque": sent, its answer unreadable
  return out;
}"""


def test_a_page_on_another_origin_reads_nothing_even_with_a_leaked_ticket(
    browser: Browser, daemon: Daemon, elsewhere: str
) -> None:
    """A page on another site calls the daemon on loopback: no answer is readable to it (no
    CORS header), not even a live stream opened with a ticket that leaked to it, and its
    simple POST starts no run."""
    with daemon.client("developer") as c:
        ticket = c.post("/v1/tickets", json={"run_id": HOSTILE_ID}).json()["ticket"]
    before = daemon.get("/v1/runs?limit=100", "owner").json()["runs"]
    with page_for(browser) as (page, _):
        page.goto(elsewhere)
        seen = page.evaluate(READ_ACROSS, [daemon.base_url, quote(HOSTILE_ID, safe=""), ticket])
    assert seen.pop("post") == "opaque"
    assert set(seen.values()) <= {"refused", "error"}, seen
    assert daemon.get("/v1/runs?limit=100", "owner").json()["runs"] == before
