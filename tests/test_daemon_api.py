"""The HTTP API on a real loopback server: auth and roles, runs, events, trace, approvals, keys,
bad input, the overhead header and the OpenAPI document."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.routing import Route
from support.daemon import ROLES, Daemon, auth, markers, running_daemon, stream_all

from thoughtgate.config import Config
from thoughtgate.providers.base import TurnRequest
from thoughtgate.server.middleware import OVERHEAD_HEADER
from thoughtgate.testing.fake import FAKE_SCRIPTS, text


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with running_daemon() as d:
        yield d


@pytest.fixture(scope="module")
def any_host_daemon() -> Iterator[Daemon]:
    """A daemon set to answer every ``Host`` (``server.allowed_hosts = ["*"]``)."""
    config = Config.from_mapping({"server": {"allowed_hosts": ["*"]}})
    with running_daemon(config=config) as d:
        yield d


@pytest.fixture(scope="module")
def finished_run(daemon: Daemon) -> str:
    run_id = daemon.start_run(
        {
            "prompt": f"canary {uuid.uuid4().hex[:8]}",
            "model": "fake:canary",
            "chain_of_thought": "surface",
            "tools": ["lookup"],
        }
    )
    assert daemon.wait_done(run_id)["status"] == "completed"
    return run_id


def _is_generic(response: httpx.Response, status: int) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    assert body["error"]["code"] == {401: "unauthorized", 403: "forbidden"}[status]


ROUTES: list[tuple[str, str, str, dict[str, Any] | None]] = [
    # method, path template, minimum role, body
    ("GET", "/v1/runs", "viewer", None),
    ("GET", "/v1/runs/{run}", "viewer", None),
    ("GET", "/v1/runs/{run}/events", "viewer", None),
    ("GET", "/v1/runs/{run}/trace", "developer", None),
    ("POST", "/v1/runs", "member", {"prompt": "hi", "model": "fake:echo"}),
    ("POST", "/v1/tickets", "viewer", {"run_id": "{run}"}),
    ("POST", "/v1/runs/{run}/approvals/call_x", "member", {"decision": "approve"}),
    ("GET", "/v1/me", "viewer", None),
    ("GET", "/v1/keys", "admin", None),
    ("POST", "/v1/keys", "admin", {"name": "{name}", "role": "viewer"}),
    ("DELETE", "/v1/keys/nobody", "admin", None),
]


@pytest.mark.parametrize(("method", "path", "minimum", "body"), ROUTES)
def test_auth_then_role_on_every_route(
    daemon: Daemon,
    finished_run: str,
    method: str,
    path: str,
    minimum: str,
    body: dict[str, Any] | None,
) -> None:
    url = path.replace("{run}", finished_run)

    def payload() -> Any:
        if body is None:
            return None
        return json.loads(
            json.dumps(body).replace("{run}", finished_run).replace("{name}", uuid.uuid4().hex[:10])
        )

    with daemon.client() as c:
        _is_generic(c.request(method, url, json=payload()), 401)
        _is_generic(c.request(method, url, json=payload(), headers=auth("tg_wrong")), 401)
        _is_generic(
            c.request(method, url, json=payload(), headers={"Authorization": "Basic x"}), 401
        )
    for role in ROLES:
        with daemon.client(role) as c:
            response = c.request(method, url, json=payload())
        if ROLES.index(role) < ROLES.index(minimum):
            _is_generic(response, 403)
            assert finished_run not in response.text
        else:
            assert response.status_code not in (401, 403), (role, response.text)


def test_public_routes(daemon: Daemon) -> None:
    with daemon.client() as c:
        health = c.get("/healthz")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        # anyone may ask, without a key: it says the daemon is up, nothing of its runs (how
        # many are under way told an outsider when someone was running something)
        assert set(health.json()) == {"status", "version"}
        assert c.get("/openapi.json").status_code == 200
    with daemon.client("developer") as c:
        me = c.get("/v1/me").json()
    assert me["role"] == "developer" and me["name"] == "developer-key"
    assert me["permissions"] == {
        "read_runs": True,
        "start_runs": True,
        "answer_approvals": True,
        "read_reasoning": True,
        "read_trace": True,
        "manage_keys": False,
    }


def test_run_views_events_paging_and_trace(daemon: Daemon, finished_run: str) -> None:
    with daemon.client("owner") as c:
        listed = c.get("/v1/runs", params={"limit": 500}).json()["runs"]
        assert finished_run in [r["run_id"] for r in listed]
        run = c.get(f"/v1/runs/{finished_run}").json()
        assert run["status"] == "completed" and run["tasks"][0]["output"] == "The answer is 42."
        seqs: list[int] = []
        after = 0
        while True:
            page = c.get(f"/v1/runs/{finished_run}/events", params={"after": after, "limit": 4})
            body = page.json()
            if not body["events"]:
                assert body["next_after"] == after
                break
            seqs += [e["seq"] for e in body["events"]]
            after = body["next_after"]
        assert seqs == list(range(1, len(seqs) + 1))
        types = [e["type"] for e in c.get(f"/v1/runs/{finished_run}/events").json()["events"]]
        assert types[-1] == "run.settlement.completed" and "tool.completed" in types
        trace = c.get(f"/v1/runs/{finished_run}/trace").json()["events"]
        assert [e["type"] for e in trace] == ["worker.completed"]
        assert "reasoning" in trace[0]["payload"]["trace"]
        assert c.get("/v1/runs/run_nope").status_code == 404
        assert c.get("/v1/runs/run_nope/events").json()["error"]["code"] == "not_found"


def test_bad_input_is_a_clear_4xx_and_a_provider_the_server_lacks_its_503(daemon: Daemon) -> None:
    cases: list[tuple[Any, int, str]] = [
        (b"{not json", 400, "not valid JSON"),
        (b"", 400, "empty"),
        (b"[1, 2]", 422, "JSON object"),
        ({"prompt": "x", "model": "nope:model"}, 400, "unknown provider"),
        ({"prompt": "x", "model": "fake:nope"}, 400, "no fake script"),
        (
            {"prompt": "x", "model": "fake:echo", "chain_of_thought": "loud"},
            422,
            "chain_of_thought",
        ),
        ({"prompt": "x", "model": "fake:echo", "base_url": "http://evil"}, 422, "base_url"),
        ({"prompt": "x", "model": "fake:echo", "api_key": "sk-x"}, 422, "api_key"),
        (
            {"prompt": "x", "model": "fake:echo", "tasks": [{"prompt": "a", "base_url": "u"}]},
            422,
            "base_url",
        ),
        ({"prompt": "x", "model": "fake:echo", "tools": ["rm_rf"]}, 400, "unknown tool"),
        ({"prompt": "", "model": "fake:echo"}, 422, "prompt"),
        ({"model": "fake:echo"}, 422, "prompt"),
        ({"prompt": "x"}, 400, "needs a model"),
        # not the caller's mistake: the server's 503 (ADR 0128, test_operator_errors.py)
        ({"prompt": "x", "model": "anthropic:claude-x"}, 503, "not configured for provider"),
        # one key twice: a proxy or an audit log reading the first value would disagree with a
        # daemon acting on the last (ADR 0122)
        (
            b'{"prompt": "x", "model": "fake:echo", "chain_of_thought": "hidden", '
            b'"chain_of_thought": "surface"}',
            400,
            "the key 'chain_of_thought' appears twice in one object",
        ),
        (
            b'{"prompt": "x", "model": "fake:echo", "tasks": [{"prompt": "a", "prompt": "b"}]}',
            400,
            "the key 'prompt' appears twice",
        ),
        (b'{"prompt": ' + b"9" * 5000 + b"}", 400, "a number of more than 4300 digits"),
        (b'{"prompt": "\xff"}', 400, "not UTF-8"),
    ]
    with daemon.client("member") as c:
        for body, status, needle in cases:
            if isinstance(body, bytes):
                r = c.post("/v1/runs", content=body, headers={"content-type": "application/json"})
            else:
                r = c.post("/v1/runs", json=body)
            assert r.status_code == status, (body, r.text)
            message = r.json()["error"]["message"]
            assert needle in message, (body, r.text)
            assert " --" not in message and "= None" not in message, "the fix in HTTP's words"
            assert "sys." not in message and "codec" not in message, "in the daemon's words"
        assert "sk-x" not in c.post("/v1/runs", json={"prompt": "x", "api_key": "sk-x"}).text
        # a form (curl -d, an HTML form) is not JSON: the error says what to send
        form = c.post("/v1/runs", data={"prompt": "x", "model": "fake:echo"})
        assert form.status_code == 400
        assert "application/x-www-form-urlencoded" in form.json()["error"]["message"]
        assert "Content-Type: application/json" in form.json()["error"]["message"]
        assert c.get("/v1/runs", params={"limit": "lots"}).status_code == 422
        assert c.get("/v1/runs", params={"limit": 0}).status_code == 422
        assert "unknown query parameter" in c.get("/v1/runs", params={"x": 1}).text
        assert daemon.get("/v1/runs", params={"x": 1}).status_code == 401  # auth first
        assert c.get("/v1/nope").json()["error"]["code"] == "not_found"
        assert c.put("/v1/runs").json()["error"]["code"] == "method_not_allowed"


CUT = "half an emoji: \ud83d"
"""A model's text cut inside a surrogate pair: Python's ``json`` reads a provider's
``"\\ud83d"`` as this, and a payload keeps it exactly (ADR 0114)."""


def _cut_emoji(request: TurnRequest, turn: int) -> Iterator[Any]:
    yield text(CUT)


def test_a_run_whose_answer_holds_a_lone_surrogate_reads_on_every_path(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """UTF-8 cannot carry a lone surrogate: the answers write it as a ``\\u`` escape (as the
    live stream always did), which every JSON reader turns back into the same text, instead of
    the events page failing with a 500 for every reader of the run."""
    monkeypatch.setitem(FAKE_SCRIPTS, "cut-emoji", _cut_emoji)
    run_id = daemon.start_run({"prompt": "hi", "model": "fake:cut-emoji"})
    assert daemon.wait_done(run_id)["status"] == "completed"
    for role in ("viewer", "developer"):
        with daemon.client(role) as c:
            run = c.get(f"/v1/runs/{run_id}")
            events = c.get(f"/v1/runs/{run_id}/events")
        assert run.status_code == 200, run.text
        assert run.json()["tasks"][0]["output"] == "half an emoji: \ufffd"  # the run index's
        assert events.status_code == 200, events.text
        texts = [e["payload"].get("text") for e in events.json()["events"]]
        assert CUT in texts, texts
        _, streamed = stream_all(daemon, run_id, role)
        assert "\\ud83d" in streamed


def test_oversized_bodies_are_413(daemon: Daemon) -> None:
    limit = daemon.app.state.thoughtgate.server.max_body_bytes
    big = json.dumps({"prompt": "x" * (limit + 10), "model": "fake:echo"}).encode()
    with daemon.client("member") as c:
        r = c.post("/v1/runs", content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413 and "max_body_bytes" in r.json()["error"]["message"]

        def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer
            for i in range(0, len(big), 65536):
                yield big[i : i + 65536]

        r = c.post("/v1/runs", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
        assert c.get("/healthz").status_code == 200


def _run_reads(daemon: Daemon, c: httpx.Client, run_id: str, role: str) -> list[httpx.Response]:
    """Every kind of answer that reads a run (or is refused after the key was checked)."""
    out = [
        c.get(f"/v1/runs/{run_id}"),
        c.get(f"/v1/runs/{run_id}/events", params={"after": 3, "limit": 1}),
        c.get(f"/v1/runs/{run_id}/host-metadata"),
        c.get(f"/v1/runs/{run_id}/trace"),
        c.get("/v1/runs"),
        c.get("/v1/runs/run_nope"),
        c.post("/v1/runs", json={}),
    ]
    ticket = daemon.ticket(run_id, role)
    with c.stream("GET", f"/v1/runs/{run_id}/stream", params={"ticket": ticket}) as s:
        out.append(s)
    follow = {
        "threadId": "t",
        "runId": "r",
        "messages": [],
        "forwardedProps": {"thoughtgate": {"run": run_id}},
    }
    with c.stream("POST", "/v1/agui", json=follow) as s:
        out.append(s)
    return out


@pytest.mark.parametrize("role", ROLES)
def test_the_overhead_header_times_run_reads_for_developers_only(
    daemon: Daemon, finished_run: str, role: str
) -> None:
    """The header times the daemon's own work, and reading a run is reading, decoding and
    filtering all of it, the reasoning a reader below developer may not see included: on SQLite
    a viewer's read of one ``agent.response`` took ~7 µs more per KB of the turn's withheld
    reasoning, which the header gave to the microsecond (ADR 0154). So every answer to a key
    below developer goes without it; a developer's, and an answer that read no run for
    nobody's key, keep it."""
    with daemon.client(role) as c:
        answers = _run_reads(daemon, c, finished_run, role)
    timed = role in ("developer", "admin", "owner")
    for r in answers:
        assert (OVERHEAD_HEADER in r.headers) is timed, (r.request.url, r.status_code)
        if timed:
            assert float(r.headers[OVERHEAD_HEADER]) >= 0
    for r in (
        daemon.get("/healthz"),
        daemon.get("/v1/me"),
        daemon.get("/"),
        daemon.get("/v1/nope"),
    ):
        assert float(r.headers[OVERHEAD_HEADER]) >= 0, r.request.url


def _events(c: httpx.Client, run_id: str) -> list[dict[str, Any]]:
    return list(c.get(f"/v1/runs/{run_id}/events").json()["events"])


def _wait_for_event(c: httpx.Client, run_id: str, type_: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30  # only a hang: the run is executing in this process
    while time.monotonic() < deadline:
        for event in _events(c, run_id):
            if event["type"] == type_:
                return event
        time.sleep(0.02)
    raise AssertionError(f"no {type_} in {run_id}")


def test_approvals(daemon: Daemon) -> None:
    run_id = daemon.start_run(
        {"prompt": "approval", "model": "fake:approval", "tools": ["dangerous"]}
    )
    with daemon.client("member") as c:
        required = _wait_for_event(c, run_id, "tool.approval_required")
        call_id = required["payload"]["call_id"]
        url = f"/v1/runs/{run_id}/approvals/{call_id}"
        with daemon.client("viewer") as v:
            assert v.post(url, json={"decision": "approve"}).status_code == 403
        assert c.post(url, json={"decision": "maybe"}).status_code == 422
        both = b'{"decision": "reject", "decision": "approve"}'  # which one a reader sees varies
        refused = c.post(url, content=both, headers={"content-type": "application/json"})
        assert refused.status_code == 400 and "appears twice" in refused.text
        assert (
            c.post(
                f"/v1/runs/{run_id}/approvals/call_other", json={"decision": "approve"}
            ).status_code
            == 404
        )
        r = c.post(url, json={"decision": "approve"})
        assert r.status_code == 200 and r.json() == {
            "run_id": run_id,
            "call_id": call_id,
            "decision": "approve",
        }
        assert daemon.wait_done(run_id)["status"] == "completed"
        again = c.post(url, json={"decision": "reject"})
        assert again.status_code == 409 and "already" in again.json()["error"]["message"]
        assert (
            c.post("/v1/runs/run_nope/approvals/x", json={"decision": "approve"}).status_code == 404
        )
        response = [e for e in _events(c, run_id) if e["type"] == "tool.approval_response"]
        assert response[0]["payload"]["decision"] == "approve"
        assert "by" not in response[0]["payload"], "who answered is operator detail"
        with daemon.client("admin") as a:
            answered = [e for e in _events(a, run_id) if e["type"] == "tool.approval_response"]
        assert answered[0]["payload"]["by"] == "member-key"
        # a settled call on a live run is 409 too
        second = daemon.start_run(
            {"prompt": "approval", "model": "fake:approval", "tools": ["dangerous"]}
        )
        call = _wait_for_event(c, second, "tool.approval_required")["payload"]["call_id"]
        assert (
            c.post(f"/v1/runs/{second}/approvals/{call}", json={"decision": "reject"}).status_code
            == 200
        )
        assert daemon.wait_done(second)["tasks"][0]["output"] == "done after the approval step"
        rejected = [e for e in _events(c, second) if e["type"] == "tool.approval_response"]
        assert rejected[0]["payload"]["decision"] == "reject"


def test_no_answer_of_the_api_may_be_kept_by_a_shared_cache(daemon: Daemon) -> None:
    """Each answer is what one key's role may see now: a cache between client and daemon that
    kept one would hand a developer's run (its reasoning) to the next caller of the URL."""
    run_id = daemon.start_run({"prompt": "cache me", "model": "fake:reasoner"})
    daemon.wait_done(run_id)
    with daemon.client("developer") as dev, daemon.client() as nobody:
        answers = {
            "run": dev.get(f"/v1/runs/{run_id}"),
            "events": dev.get(f"/v1/runs/{run_id}/events"),
            "list": dev.get("/v1/runs"),
            "unknown run": dev.get("/v1/runs/run_nope"),
            "no key": nobody.get(f"/v1/runs/{run_id}"),
        }
    for name, answer in answers.items():
        assert answer.headers.get("cache-control") == "no-store", (name, answer.status_code)
    assert answers["run"].status_code == 200 and answers["no key"].status_code == 401


def test_keys_api(daemon: Daemon) -> None:
    with daemon.client("admin") as admin:
        made = admin.post("/v1/keys", json={"name": "ci-dev", "role": "developer"})
        assert made.status_code == 201 and made.headers["cache-control"] == "no-store"
        key = made.json()["key"]
        assert admin.post("/v1/keys", json={"name": "ci-dev", "role": "viewer"}).status_code == 400
        assert admin.post("/v1/keys", json={"name": "boss", "role": "owner"}).status_code == 403
        assert admin.post("/v1/keys", json={"name": "x", "role": "god"}).status_code == 422
        taken = admin.post("/v1/keys", json={"name": made.json()["key_id"], "role": "viewer"})
        assert (
            taken.status_code == 400 and "reserved for key ids" in taken.json()["error"]["message"]
        )
        listed = admin.get("/v1/keys").json()["keys"]
        assert "ci-dev" in [k["name"] for k in listed]
        assert key not in json.dumps(listed) and "hash" not in json.dumps(listed)
        with daemon.client() as anon:
            assert anon.get("/v1/me", headers=auth(key)).json()["role"] == "developer"
            assert admin.delete("/v1/keys/owner-key").status_code == 403
            gone = admin.delete("/v1/keys/ci-dev").json()
            assert gone["revoked"] is True and gone["name"] == "ci-dev"
            assert gone["key_id"] == made.json()["key_id"]
            assert anon.get("/v1/me", headers=auth(key)).status_code == 401
            assert admin.delete("/v1/keys/ci-dev").status_code == 404
    with daemon.client("owner") as owner:
        assert owner.post("/v1/keys", json={"name": "adm2", "role": "admin"}).status_code == 201


def test_openapi_covers_every_route_and_schema(daemon: Daemon) -> None:
    spec = daemon.get("/openapi.json").json()
    routes = [r for r in daemon.app.routes if isinstance(r, Route) and r.include_in_schema]
    assert len(routes) >= 14
    for route in routes:
        methods = (route.methods or set()) - {"HEAD"}
        for method in methods:
            assert method.lower() in spec["paths"][route.path], (method, route.path)
    schemas = spec["components"]["schemas"]
    text = json.dumps(spec)
    for ref in {part.split('"')[0] for part in text.split('"#/components/schemas/')[1:]}:
        assert ref in schemas, ref
    run_body = schemas["CreateRunBody"]
    assert run_body["additionalProperties"] is False
    assert set(run_body["properties"]) == {
        "prompt",
        "model",
        "chain_of_thought",
        "tools",
        "tasks",
        "system",
    }
    assert spec["paths"]["/v1/runs/{run_id}/trace"]["get"]["security"] == [{"bearer": []}]
    assert spec["paths"]["/v1/runs/{run_id}/stream"]["get"]["security"] == []


def test_markers_helper_is_unique() -> None:
    assert len(set(markers("abc").values())) == 3


def test_web_page_is_served(daemon: Daemon) -> None:
    with daemon.client() as c:
        page = c.get("/")
        assert page.status_code == 200 and "/static/app.js" in page.text
        assert "default-src 'self'" in page.headers["content-security-policy"]
        assert c.get("/static/app.js").status_code == 200
        assert "/" not in c.get("/openapi.json").json()["paths"]


@pytest.mark.parametrize(
    ("path", "to"),
    [
        ("/static", "/static/"),
        ("/static?a=1&b=%2F", "/static/?a=1&b=%2F"),
        ("/v1/runs/", "/v1/runs"),
        ("/healthz/", "/healthz"),
        ("/v1/runs%2F", "/v1/runs"),
    ],
)
@pytest.mark.parametrize("host", ["evil.example", "evil.example:443", "127.0.0.1:1@evil.example"])
def test_a_slash_redirect_stays_on_the_daemon_whatever_the_host_header(
    any_host_daemon: Daemon, path: str, to: str, host: str
) -> None:
    """The trailing-slash redirect's ``Location`` is a path on the daemon: a forged ``Host`` (a
    cache or proxy in front that keys on the path, a link a victim follows through one) is not
    echoed into an absolute URL that sends the browser elsewhere. (On loopback a name the
    daemon does not answer for is refused before any route, ADR 0159: this daemon answers
    every name, as one behind such a proxy may be set to.)"""
    with any_host_daemon.client() as c:
        moved = c.get(path, headers={"Host": host}, follow_redirects=False)
    assert moved.status_code == 307, moved.text
    assert moved.headers["location"] == to
    assert "evil" not in moved.text


@pytest.mark.parametrize(
    "path", ["/", "/static/index.html", "/static/app.js", "/static/favicon.svg"]
)
def test_every_file_of_the_page_carries_its_protections(daemon: Daemon, path: str) -> None:
    """The page is also a static file (``/static/index.html``): wherever it is opened from it may
    not be framed (clickjacking of its sign-in form), may load scripts only from the daemon, and
    no file of it is sniffed into another type."""
    with daemon.client() as c:
        served = c.get(path)
    assert served.status_code == 200
    policy = served.headers.get("content-security-policy", "")
    assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy, served.headers
    assert served.headers.get("x-content-type-options") == "nosniff"
    assert served.headers.get("referrer-policy") == "no-referrer"
