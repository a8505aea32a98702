"""What a reader below developer can still measure of a run's reasoning once its text and its
token counts are withheld (ADR 0169): on a real daemon on loopback, a viewer and a member read
two runs whose provider failed the same way after reasoning of two different sizes, and every
error text they are given -- the run view's and its tasks', every event's ``error`` on the
events page and the live stream, the run list's row, AG-UI's ``RUN_ERROR`` -- must be the same
for both. A developer reads the measurement in ``error_detail`` (``surface`` runs), where the
reasoning itself is.

The failures are those whose text could carry a figure derived from the reasoning: a stream
event cut inside its reasoning (json says where it stopped; the adapter said how long the event
was), an event that is a string or a list (the adapter said its length), a delta for a block
that never started (the adapter named its index, which counts the thinking blocks before it:
Anthropic's format), a provider's context length error (the tokens requested include the
reasoning sent back in a tool loop) and a rate limit quoting the tokens used (which include the
reasoning's, billed as output).

The same daemon, with a browser origin listed (ADR 0164), holds the headers' rows of the ADR:
what CORS exposes, the overhead header, compression, ETags.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from support.daemon import Daemon, agui_input, running_daemon, sse_events, stream_all
from support.replay import provider_with

from thoughtgate.config import Config
from thoughtgate.providers.base import Provider, ProviderSettings
from thoughtgate.providers.openrouter import OpenRouterProvider
from thoughtgate.server.cors import EXPOSED_HEADERS
from thoughtgate.server.middleware import OVERHEAD_HEADER

pytestmark = pytest.mark.inprocess

MODEL = "openrouter:anthropic/claude-sonnet-4.5"
ANTHROPIC = "anthropic:claude-sonnet-4-5"
SIZES = (7, 4093)
"""Two sizes of reasoning (characters): the runs differ in nothing else."""
FAILURES = (
    "cut inside the reasoning",
    "a string",
    "a list",
    "a block that never started",
    "context length",
    "tokens per min",
)
ORIGIN = "http://127.0.0.1:9"
"""A listed browser origin (ADR 0164): its answers expose the headers a client reads."""

_ASKED = re.compile(r"size (\d+): ([a-z ]+)\.")


def _sse(data: Any) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


def _answer(request: httpx.Request) -> httpx.Response:
    """The provider: the prompt (``size N: FAILURE.``) says how long to reason and how to fail."""
    found = _ASKED.search(request.content.decode("utf-8"))
    assert found is not None, request.content
    size, failure = int(found.group(1)), found.group(2)
    reasoning = "x" * size
    if failure == "context length":
        said = (
            "This model's maximum context length is 8192 tokens. However, you requested "
            f"{8192 + size} tokens ({size} in the messages, 0 in the completion)."
        )
        body = {"error": {"code": 400, "message": said, "type": "context_length_exceeded"}}
        return httpx.Response(400, json=body)
    if failure == "tokens per min":
        said = (
            "Rate limit reached for o3 on tokens per min (TPM): Limit 30000, "
            f"Used {29000 + size}, Requested 1500."
        )
        return httpx.Response(429, json={"error": {"code": 429, "message": said}})
    if failure == "a block that never started":
        return _anthropic_blocks(reasoning)
    head = {"id": "gen-1", "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant"}}]}
    delta = {"id": "gen-1", "choices": [{"index": 0, "delta": {"reasoning": reasoning}}]}
    if failure == "cut inside the reasoning":
        text = json.dumps(delta)
        broken = text[: text.index(reasoning) + size]  # json stops at the end of the event
    elif failure == "a string":
        broken = json.dumps(reasoning)
    else:
        broken = json.dumps(list(reasoning))
    stream = _sse(head) + _sse(delta) + _sse(broken)
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, text=stream)


def _anthropic_blocks(reasoning: str) -> httpx.Response:
    """Anthropic's format: the reasoning in thinking blocks of at most 1,000 characters, then a
    delta for the block after them, which never started."""
    pieces = [reasoning[i : i + 1000] for i in range(0, len(reasoning), 1000)]
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": {"id": "msg_1", "model": "m"}})
    ]
    for i, piece in enumerate(pieces):
        block = {"type": "thinking", "thinking": piece, "signature": ""}
        events += [
            (
                "content_block_start",
                {"type": "content_block_start", "index": i, "content_block": block},
            ),
            ("content_block_stop", {"type": "content_block_stop", "index": i}),
        ]
    delta = {"type": "text_delta", "text": "The answer"}
    events.append(
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": len(pieces), "delta": delta},
        )
    )
    body = "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events)
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, text=body)


def _provider(model: str) -> Provider:
    if model.startswith("anthropic:"):
        return provider_with(httpx.MockTransport(_answer))
    settings = ProviderSettings(
        base_url="http://replay.invalid", api_key="k", max_retries=0, timeout_s=5.0
    )
    client = httpx.AsyncClient(transport=httpx.MockTransport(_answer))
    return OpenRouterProvider(model.split(":", 1)[1], settings, client=client)


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    config = Config.from_mapping({"server": {"cors_origins": [ORIGIN]}})
    with running_daemon(provider_factory=_provider, config=config) as d:
        yield d


@pytest.fixture(scope="module")
def runs(daemon: Daemon) -> dict[tuple[str, int], str]:
    """(failure, size) -> a finished ``surface`` run that reasoned that much, then failed so."""
    out = {}
    for failure in FAILURES:
        for size in SIZES:
            model = ANTHROPIC if failure == "a block that never started" else MODEL
            body = {"prompt": f"size {size}: {failure}.", "model": model}
            out[failure, size] = daemon.start_run({**body, "chain_of_thought": "surface"})
    for run_id in out.values():
        assert daemon.wait_done(run_id)["status"] in ("failed", "error")
    return out


def _errors(value: Any) -> list[str]:
    """Every ``error`` and ``error_detail`` text in a JSON value, in order."""
    if isinstance(value, dict):
        here = [v for k, v in value.items() if k in ("error", "error_detail") and v]
        return here + [t for v in value.values() for t in _errors(v)]
    if isinstance(value, list):
        return [t for v in value for t in _errors(v)]
    return []


def _read(daemon: Daemon, run_id: str, role: str) -> dict[str, list[str]]:
    """Every error text ``role`` is given of the run, per surface."""
    with daemon.client(role) as c:
        view = c.get(f"/v1/runs/{run_id}").json()
        events = c.get(f"/v1/runs/{run_id}/events", params={"limit": 1000}).json()
        listed = c.get("/v1/runs", params={"limit": 500}).json()
        body = json.dumps(agui_input(run=run_id))
        headers = {"content-type": "application/json"}
        with c.stream("POST", "/v1/agui", content=body, headers=headers) as r:
            agui = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    _, stream = stream_all(daemon, run_id, role)
    rows = [row for row in listed["runs"] if row["run_id"] == run_id]
    return {
        "run view": _errors(view),
        "events": _errors(events["events"]),
        "stream": _errors(sse_events(stream)),
        "run list": _errors(rows),
        "ag-ui": [e["message"] for e in agui if e["type"] == "RUN_ERROR"],
    }


@pytest.mark.parametrize("role", ["viewer", "member"])
@pytest.mark.parametrize("failure", FAILURES)
def test_a_failed_run_s_error_texts_below_developer_do_not_measure_its_reasoning(
    daemon: Daemon, runs: dict[tuple[str, int], str], role: str, failure: str
) -> None:
    """Before ADR 0169 a malformed answer's public text said the event's length (``in 4158
    characters``), where json stopped, a string's or list's length, or a block's index: on every
    surface below, for every reader. A reader below developer must learn that and how the run
    failed, the same words whatever the reasoning's size."""
    short, long = (_read(daemon, runs[failure, size], role) for size in SIZES)
    for surface, texts in short.items():
        assert texts, f"{surface}: a {role} still reads that and how the run failed"
    assert short == long, "an error text a reader below developer reads varies with the reasoning"
    assert not any(str(SIZES[1]) in t for texts in long.values() for t in texts)


@pytest.mark.parametrize("failure", FAILURES)
def test_a_developer_reads_the_failure_s_measure_in_its_detail(
    daemon: Daemon, runs: dict[tuple[str, int], str], failure: str
) -> None:
    """Where reasoning itself is shown (a developer, a ``surface`` run), the detail still says
    what the provider said or how large the broken event was: diagnosis loses nothing."""
    short, long = (_read(daemon, runs[failure, size], "developer") for size in SIZES)
    assert short["events"] != long["events"]
    assert short["run view"] == long["run view"], "the run view's error is the public one"


@pytest.mark.parametrize("role", ["viewer", "member", "developer"])
def test_a_listed_origin_is_exposed_the_same_headers_and_the_overhead_one_by_developers_only(
    daemon: Daemon, runs: dict[tuple[str, int], str], role: str
) -> None:
    """CORS (ADR 0164) exposes a fixed list, the same for every role; the overhead header it
    names -- a read's own timing, which measured withheld data (ADR 0154) -- is sent to
    developers only, so a page on a listed origin holding a lower key reads none; and no answer
    is compressed (a compressed length mixing the reader's own input with withheld data is a
    size oracle) nor tagged (an ``ETag`` of a run read)."""
    run_id = runs["a string", SIZES[1]]
    headers = {"origin": ORIGIN, "accept-encoding": "gzip, br, deflate"}
    with daemon.client(role) as c:
        for path in (f"/v1/runs/{run_id}", f"/v1/runs/{run_id}/events", "/v1/runs"):
            r = c.get(path, headers=headers)
            assert r.status_code == 200
            exposed = r.headers["access-control-expose-headers"].lower().split(", ")
            assert exposed == [h.lower() for h in EXPOSED_HEADERS]
            assert (OVERHEAD_HEADER in r.headers) == (role == "developer"), path
            for header in ("content-encoding", "etag", "server-timing"):
                assert header not in r.headers, (path, header)
