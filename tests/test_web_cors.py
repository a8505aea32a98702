"""A browser AG-UI client on another origin, in headless Debian chromium (ADR 0164).

A page served from a second loopback origin calls the daemon across origins, as a browser
AG-UI client would: ``POST /v1/agui`` with ``Authorization`` and a JSON body (a preflight
first), reading the event stream as it arrives, and a JSON read. From an origin listed in
``server.cors_origins`` both succeed; from the same page on an origin not listed (the same
server under ``localhost``), chromium refuses them and the script reads nothing.

Without chromium these tests FAIL and say how to install it; they never skip."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser
from support.browser import launch, page_for
from support.daemon import Daemon, agui_input
from support.web import other_site, web_daemon

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def client_port() -> Iterator[int]:
    """The client's own server: ``http://127.0.0.1:PORT`` is listed, and
    ``http://localhost:PORT`` (the same page, another origin) is not."""
    with other_site(b"<!doctype html><title>an AG-UI client</title>") as port:
        yield port


@pytest.fixture(scope="module")
def daemon(client_port: int) -> Iterator[Daemon]:
    config = {"server": {"cors_origins": [f"http://127.0.0.1:{client_port}"]}}
    with web_daemon(config=config, shutdown_grace_s=0.1) as d:
        yield d


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    try:
        with launch() as b:
            yield b
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)


CALL = """async ([base, key, body]) => {
  const out = {};
  try {
    const me = await fetch(base + '/v1/me', { headers: { Authorization: 'Bearer ' + key } });
    out.me = (await me.json()).role;
  } catch (e) { out.me = 'refused'; }
  try {
    const r = await fetch(base + '/v1/agui', {
      method: 'POST',
      headers: { Authorization: 'Bearer ' + key, 'Content-Type': 'application/json',
                 Accept: 'text/event-stream' },
      body: JSON.stringify(body),
    });
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let text = '';
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      text += decoder.decode(value, { stream: true });
    }
    out.agui = text.split('\\n').filter((l) => l.startsWith('data:'))
      .map((l) => JSON.parse(l.slice(5)).type);
  } catch (e) { out.agui = 'refused'; }
  return out;
}"""

BODY = agui_input(model="fake:echo")


def _runs(daemon: Daemon) -> int:
    return len(daemon.get("/v1/runs?limit=100", "owner").json()["runs"])


def test_a_listed_origins_page_runs_an_agui_stream(
    browser: Browser, daemon: Daemon, client_port: int
) -> None:
    """From the listed origin chromium sends the preflight, then the POST, and hands the
    script the stream: the run's events, from ``RUN_STARTED`` to ``RUN_FINISHED``."""
    with page_for(browser) as (page, _):
        page.goto(f"http://127.0.0.1:{client_port}/")
        seen = page.evaluate(CALL, [daemon.base_url, daemon.keys["member"], BODY])
    assert seen["me"] == "member"
    assert seen["agui"][0] == "RUN_STARTED" and seen["agui"][-1] == "RUN_FINISHED", seen


def test_an_unlisted_origins_page_reads_nothing_and_starts_nothing(
    browser: Browser, daemon: Daemon, client_port: int
) -> None:
    """The same page on an origin not listed: chromium refuses both answers (no
    ``Access-Control-Allow-Origin`` for it), and its refused preflight keeps the POST from
    being sent at all, so no run starts, even with a key the page holds."""
    before = _runs(daemon)
    with page_for(browser) as (page, _):
        page.goto(f"http://localhost:{client_port}/")
        seen = page.evaluate(CALL, [daemon.base_url, daemon.keys["member"], BODY])
    assert seen == {"me": "refused", "agui": "refused"}, json.dumps(seen)
    assert _runs(daemon) == before


READ_ERROR = """async ([base, key]) => {
  try {
    const r = await fetch(base + '/v1/runs/run_boom', { headers: { Authorization: 'Bearer ' + key } });
    return [r.status, (await r.json()).error.code];
  } catch (e) { return 'refused'; }
}"""


def test_a_listed_origins_page_reads_the_daemons_500(
    browser: Browser, daemon: Daemon, client_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0170: the daemon's ``500`` named no origin (Starlette writes it outside the CORS
    middleware), so chromium handed the script a network error instead of the status."""
    read = daemon.store.get_run

    async def failing(run_id: str, *args: object, **kwargs: object) -> object:
        if run_id == "run_boom":
            raise RuntimeError("an unexpected failure")
        return await read(run_id, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(daemon.store, "get_run", failing)
    with page_for(browser) as (page, _):
        page.goto(f"http://127.0.0.1:{client_port}/")
        seen = page.evaluate(READ_ERROR, [daemon.base_url, daemon.keys["member"]])
    assert seen == [500, "internal_error"], seen
