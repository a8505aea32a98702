"""Driving the web page in Debian chromium through Playwright (never a downloaded browser).

``make browser-deps`` installs chromium; Playwright launches it by its executable path. Also a
script that writes the README screenshots::

    PYTHONPATH=src:tests python -m support.browser docs/
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import (
    Browser,
    BrowserContext,
    Page,
    Playwright,
    Response,
    sync_playwright,
)

__all__ = [
    "CHROMIUM_ARGS",
    "Capture",
    "browser",
    "chromium_path",
    "launch",
    "open_run",
    "page_for",
    "sign_in",
    "snapshot",
]

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str | None:
    """Debian's chromium, or ``None`` when it is not installed."""
    for candidate in (shutil.which("chromium"), "/usr/bin/chromium"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


MISSING = (
    "Debian chromium is not installed (looked for `chromium` on PATH and /usr/bin/chromium). "
    "The browser tests drive it through Playwright by its executable path; install it with "
    "`make browser-deps` (apt-get install chromium). Never `playwright install`."
)


@contextmanager
def launch(extra_args: Sequence[str] = ()) -> Iterator[Browser]:
    """Chromium launched by its executable path (with ``extra_args`` after the usual ones);
    raises ``RuntimeError`` saying why it cannot."""
    path = chromium_path()
    if path is None:
        raise RuntimeError(MISSING)
    with sync_playwright() as playwright:
        browser = _launch(playwright, path, extra_args)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One chromium per test module (import this fixture into the module to use it); without
    chromium the tests that use it FAIL and say how to install it."""
    try:
        with launch() as b:
            yield b
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)


def _launch(playwright: Playwright, path: str, extra_args: Sequence[str] = ()) -> Browser:
    try:
        return playwright.chromium.launch(executable_path=path, args=[*CHROMIUM_ARGS, *extra_args])
    except Exception as exc:
        raise RuntimeError(f"chromium at {path} did not start: {exc}") from exc


@dataclass
class Capture:
    """Every response body and every server-sent event message a page's browser received.

    Response bodies come from Playwright (``response.body()``); SSE messages come straight from
    chromium's network domain (``Network.eventSourceMessageReceived``), each as it arrived, with
    its event name (a stream's body is never read: the run list's stream never ends)."""

    responses: list[Response] = field(default_factory=list)
    bodies: dict[str, list[bytes]] = field(default_factory=dict)
    sse_messages: list[str] = field(default_factory=list)
    sse_events: list[str] = field(default_factory=list)
    """The event name of each SSE message (``message`` unless the frame named one)."""
    streams: list[str] = field(default_factory=list)
    """URLs of the SSE responses received (their messages are in ``sse_messages``)."""

    def attach(self, context: BrowserContext, page: Page) -> None:
        page.on("response", lambda response: self.responses.append(response))
        cdp = context.new_cdp_session(page)
        cdp.send("Network.enable")
        cdp.on("Network.eventSourceMessageReceived", self._sse)

    def _sse(self, event: dict[str, Any]) -> None:
        self.sse_messages.append(event["data"])
        self.sse_events.append(event.get("eventName") or "message")

    def drain(self) -> None:
        """Read the bodies of the responses seen so far (before a reload makes them unreadable).

        An SSE stream's messages are in ``sse_messages`` (its body is not read: it may never
        end). Any other body that cannot be read fails the test: absence is only proven over
        everything received."""
        pending, self.responses = self.responses, []
        for response in pending:
            if 300 <= response.status < 400:
                continue  # 304 Not Modified (a cached copy, read when it came) or a redirect
            if "text/event-stream" in response.headers.get("content-type", ""):
                self.streams.append(response.url)
                continue
            self.bodies.setdefault(response.url, []).append(response.body())

    def everything(self, *, url_part: str = "") -> str:
        """All bodies (of URLs containing ``url_part``) and all SSE messages, as one text."""
        self.drain()
        chunks = [
            b.decode("utf-8", errors="replace")
            for url, bs in self.bodies.items()
            if url_part in url
            for b in bs
        ]
        return "\n".join([*chunks, *self.sse_messages])

    def urls(self) -> list[str]:
        return [*self.bodies, *self.streams]


@contextmanager
def page_for(
    browser: Browser, *, width: int = 1280, height: int = 900, timezone_id: str | None = None
) -> Iterator[tuple[Page, Capture]]:
    context = browser.new_context(
        viewport={"width": width, "height": height}, timezone_id=timezone_id, locale="en-US"
    )
    page = context.new_page()
    capture = Capture()
    capture.attach(context, page)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield page, capture
        assert not errors, f"errors on the page: {errors}"
    finally:
        context.close()


def sign_in(page: Page, base_url: str, key: str) -> None:
    page.goto(base_url + "/")
    page.fill("#key", key)
    page.click("#signin-form button[type=submit]")


def open_run(page: Page, run_id: str) -> None:
    """Refresh the run list and open the run from it, as a person would."""
    page.click("#refresh")
    page.click(f"#runs-list a[data-run='{run_id}']")


SNAPSHOT_JS = """(root) => {
  const text = (n) => (n ? n.innerText.trim() : null);
  const items = [...root.querySelectorAll('[data-testid=thread-items] [data-item]')].map((li) =>
    [li.dataset.testid || '', li.dataset.status || '', text(li)]);
  const pick = (id) => text(root.querySelector(`[data-testid=${id}]`));
  const raws = [...root.querySelectorAll('[data-testid=raw-text]')].map((n) => n.innerText);
  return { items, answer: pick('answer-text'), receipt: pick('receipt'),
           raw: raws.length ? raws.join('') : null, error: pick('answer-error') };
}"""


def snapshot(page: Page) -> dict[str, Any]:
    """The rendered thread: each item's kind, status and text, the answer, receipt and raw panel."""
    result: dict[str, Any] = page.eval_on_selector("[data-testid=thread-body]", SNAPSHOT_JS)
    return result


def write_screenshots(out_dir: Path) -> list[Path]:
    """The viewer's and the developer's page for a finished tool-loop run, and the developer's
    page for a run that failed in its second model turn."""
    from support.web import story_run, web_daemon

    written = []
    with web_daemon() as daemon, launch() as browser:
        for prompt in ("Summarize yesterday's incident report", "Which city is warmer today?"):
            daemon.wait_done(daemon.start_run({"prompt": prompt, "model": "fake:echo"}))
        failed = daemon.start_run(
            {
                **story_run("", delay=0.05),
                "prompt": "Plan a day trip to Braga",
                "model": "fake:story-outage",
            }
        )
        daemon.wait_done(failed)
        run_id = daemon.start_run(story_run("", delay=0.05))  # no marker in the raw reasoning
        daemon.wait_done(run_id)
        shots = (
            ("viewer", run_id, "web-page.png"),
            ("developer", run_id, "web-page-developer.png"),
            ("developer", failed, "web-page-failed.png"),
        )
        for role, shown, name in shots:
            with page_for(browser, height=800, timezone_id="Europe/Lisbon") as (page, _):
                sign_in(page, daemon.base_url, daemon.keys[role])
                page.wait_for_selector("[data-testid=list-live]:visible")
                page.click(f"#runs-list a[data-run='{shown}']")
                page.wait_for_selector("[data-testid=answer]")
                page.wait_for_selector("[data-testid=live]", state="detached")
                path = out_dir / name
                page.screenshot(path=str(path), full_page=True)
                written.append(path)
    return written


if __name__ == "__main__":
    from support import fakes

    with fakes.registered():  # the web scripts (fake:story, ...), as the tests' session has them
        for written in write_screenshots(Path(sys.argv[1] if len(sys.argv) > 1 else "docs")):
            print(written)
