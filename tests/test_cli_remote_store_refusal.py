"""``thoughtgate run --url`` / ``resume --url`` answering an approval while the daemon's store
refuses writes (ADR 0170). The daemon refuses the answer (``503 store_refuses_writes``) and the
approval stays pending (ADR 0165); before, the CLI sent the answer once and dropped the refusal
in a background task nobody awaited: the run waited on the daemon for an answer the command's
user believed given, until its approval timeout. Now the answer is sent again, with a line
saying why, until the store takes writes or a bound passes, and the live channel (which the
daemon lets go while its store refuses writes) is followed on meanwhile.

A real daemon on loopback over a SQLite store whose directory is moved away and back (the
harness of ``tests/test_store_readiness.py``); the command's body, ``_follow_to_end``, runs in
this process.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.daemon import Daemon, running_daemon
from support.durable import until

from thoughtgate.cli import remote
from thoughtgate.cli.remote import Remote, _follow_to_end, retry_wait
from thoughtgate.client import ThoughtgateClient
from thoughtgate.client.errors import DaemonError, raise_for_response
from thoughtgate.config import Config

WAIT_S = 30.0
"""Only a hang reaches it."""


class _Watching(httpx.AsyncHTTPTransport):
    """The client's own transport, noting the status of every approval answer it sends."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: list[int] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        if request.method == "POST" and "/approvals/" in request.url.path:
            self.answers.append(response.status_code)
        return response


@pytest.fixture
def waiting(tmp_path: Path) -> Iterator[tuple[Daemon, Path, Path, str]]:
    """A daemon, its store's directory and where it is moved, and a run waiting for approval."""
    directory, away = tmp_path / "store", tmp_path / "away"
    config = Config.from_mapping({"orchestration": {"approval_timeout_s": 120}})
    with running_daemon(sqlite_dir=directory, config=config) as daemon:
        run_id = daemon.awaiting_approval(WAIT_S)
        try:
            yield daemon, directory, away, run_id
        finally:
            if away.exists():
                away.rename(directory)


def _answers(daemon: Daemon, run_id: str) -> list[str]:
    events = daemon.get(f"/v1/runs/{run_id}/events", "owner").json()["events"]
    return [e["payload"]["decision"] for e in events if e["type"] == "tool.approval_response"]


@pytest.mark.inprocess
def test_an_answer_refused_while_the_store_refuses_writes_is_sent_again_until_it_is_taken(
    waiting: tuple[Daemon, Path, Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    daemon, directory, away, run_id = waiting
    directory.rename(away)
    watching = _Watching()

    async def follow() -> str:
        key = daemon.keys["member"]
        async with ThoughtgateClient(daemon.base_url, key, transport=watching) as tg:
            command = asyncio.create_task(
                _follow_to_end(tg, Remote(daemon.base_url, key), run_id, "member", True, True)
            )

            async def refused() -> bool:
                assert not command.done(), command  # (a failure: its error, at once)
                return 503 in watching.answers

            await until(refused, WAIT_S)
            away.rename(directory)  # the store takes writes again
            return await command

    assert asyncio.run(follow()) == "completed"
    said = capsys.readouterr()
    assert json.loads(said.out)["status"] == "completed"
    assert "the daemon's store refuses writes (store_removed)" in said.err
    assert "retrying" in said.err
    assert "the answer (approve) to tool dangerous was given" in said.err
    assert watching.answers[-1] == 200 and set(watching.answers[:-1]) == {503}
    assert _answers(daemon, run_id) == ["approve"]


@pytest.mark.inprocess
def test_past_the_bound_the_command_fails_clearly_and_the_approval_still_waits_on_the_daemon(
    waiting: tuple[Daemon, Path, Path, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bound is counted in the waits between tries (no clock in the test), and the live
    channel gives up after one idle reconnect: without following on while an answer waits for
    the store, the command would fail with "brought nothing new" before the bound."""
    daemon, directory, away, run_id = waiting
    monkeypatch.setattr(remote, "STORE_REFUSAL_WAIT_S", 2.0)
    monkeypatch.setattr(remote, "STORE_RETRY_S", (0.25, 0.1, 1.0))
    directory.rename(away)

    async def follow() -> str:
        key = daemon.keys["member"]
        async with ThoughtgateClient(daemon.base_url, key, max_reconnects=1) as tg:
            return await _follow_to_end(
                tg, Remote(daemon.base_url, key), run_id, "member", True, True
            )

    with pytest.raises(DaemonError) as failed:
        asyncio.run(follow())
    message = str(failed.value)
    assert failed.value.code == "store_refuses_writes"
    assert "gave up after 2 s" in message
    assert f"the answer (approve) to tool dangerous was not given, and run {run_id}" in message
    assert "still waits for it on the daemon" in message
    assert "brought nothing new" not in message
    assert "retrying for up to 2 s" in capsys.readouterr().err
    away.rename(directory)

    async def ready() -> bool:
        return daemon.get("/readyz").status_code == 200

    asyncio.run(until(ready, WAIT_S))
    assert _answers(daemon, run_id) == []  # still pending: answered now, it is taken
    with daemon.client("member") as c:
        taken = c.post(f"/v1/runs/{run_id}/approvals/call_danger", json={"decision": "reject"})
    assert taken.status_code == 200, taken.text
    assert daemon.wait_done(run_id, timeout=WAIT_S)["status"] == "completed"
    assert _answers(daemon, run_id) == ["reject"]


@pytest.mark.unit
@given(st.none() | st.floats(allow_nan=False, min_value=0, max_value=1e9))
def test_the_wait_between_tries_is_the_daemons_retry_after_within_bounds(
    retry_after: float | None,
) -> None:
    plain, least, most = remote.STORE_RETRY_S
    wait = retry_wait(retry_after)
    assert least <= wait <= most
    if retry_after is None:
        assert wait == plain
    elif least <= retry_after <= most:
        assert wait == retry_after


@pytest.mark.unit
@pytest.mark.parametrize(
    ("header", "seconds"),
    [("3", 3.0), ("0.5", 0.5), (None, None), ("Fri, 31 Dec 1999 23:59:59 GMT", None), ("-1", None)],
)
def test_an_answer_error_keeps_the_answers_retry_after_in_seconds(
    header: str | None, seconds: float | None
) -> None:
    headers: Any = {"Retry-After": header} if header is not None else {}
    body = {"error": {"code": "store_refuses_writes", "message": "refuses writes (x)"}}
    response = httpx.Response(503, json=body, headers=headers)
    with pytest.raises(DaemonError) as failed:
        raise_for_response(response)
    assert failed.value.retry_after == seconds
    assert seconds is None or math.isfinite(seconds)
