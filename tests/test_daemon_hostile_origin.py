"""The daemon against a malicious web origin (ADR 0159), over real HTTP on loopback.

A page on another site can make a developer's browser send requests to the daemon on
``127.0.0.1``; it may also point its own name at ``127.0.0.1`` (DNS rebinding), which makes it
the same origin as whatever answers there. These tests send what such a page can make a browser
send, and assert that it gets nothing: a name the daemon does not answer for is refused on every
route, no answer invites a cross-origin reader (no ``Access-Control-*``), no request a page can
send without a custom header (a form, a ``text/plain`` body, a key in the query or a cookie)
changes anything, and every answer -- API, live streams, AG-UI, errors, the page's files --
carries headers that keep browsers and caches from doing more with it than it says.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.daemon import Daemon, auth, running_daemon

from thoughtgate.config import Config, load_config
from thoughtgate.errors import ConfigError
from thoughtgate.server.app import PAGE_POLICY, create_app
from thoughtgate.server.routes import all_endpoints
from thoughtgate.store.memory import MemoryStore

EVIL = "evil.example"
OPEN_PATHS = ("/", "/static/index.html", "/static/app.js", "/healthz", "/readyz", "/openapi.json")
"""What answers without a key: all a rebinding page could read."""


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with running_daemon() as d:
        yield d


@pytest.fixture(scope="module")
def run_id(daemon: Daemon) -> str:
    started = daemon.start_run({"prompt": "hi", "model": "fake:echo"})
    daemon.wait_done(started)
    return started


def _port(daemon: Daemon) -> str:
    return daemon.base_url.rsplit(":", 1)[1]


# ---- DNS rebinding: the Host header ------------------------------------------------------------


@pytest.mark.parametrize("path", [*OPEN_PATHS, "/v1/me", "/nowhere"])
@pytest.mark.parametrize(
    "host", [EVIL, "{EVIL}:{port}", "EVIL.example.:{port}", "127.0.0.1.nip.io"]
)
def test_a_name_rebound_to_loopback_reads_nothing(daemon: Daemon, path: str, host: str) -> None:
    """A page on evil.example that rebinds its name to 127.0.0.1 sends ``Host: evil.example``:
    refused before any route runs, with nothing of the page, the version or the API in it
    (even with a key, which such a page has not)."""
    header = host.format(EVIL=EVIL, port=_port(daemon))
    with daemon.client("owner") as c:
        answer = c.get(path, headers={"Host": header})
    assert answer.status_code == 400, (path, answer.text)
    assert answer.json()["error"]["code"] == "host_not_allowed"
    assert "thoughtgate" not in answer.text and "version" not in answer.text
    assert answer.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize(
    "host", ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST", "[::1]:{port}", "127.0.0.2"]
)
def test_loopback_names_and_addresses_are_answered(daemon: Daemon, host: str) -> None:
    """What a browser or client on the machine sends: an address has no name to rebind."""
    with daemon.client() as c:
        answer = c.get("/healthz", headers={"Host": host.format(port=_port(daemon))})
    assert answer.status_code == 200, answer.text


def test_a_request_without_a_host_is_answered(daemon: Daemon) -> None:
    """HTTP/1.0 needs no ``Host``, and no browser sends a request without one."""
    with socket.create_connection(("127.0.0.1", int(_port(daemon))), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        head = s.recv(4096)
    assert head.startswith(b"HTTP/1.1 200"), head


@contextlib.contextmanager
def _daemon_with(server: dict[str, Any]) -> Iterator[Daemon]:
    config = Config.from_mapping({"server": server})
    with running_daemon(config=config) as d:
        yield d


def test_the_operator_names_the_hosts_it_answers_for() -> None:
    """``server.allowed_hosts`` (a proxy in front that keeps its public name): those names
    answer on loopback, others still do not; ``"*"`` answers every name."""
    with _daemon_with({"allowed_hosts": ["TG.example.com"]}) as d, d.client() as c:
        assert c.get("/healthz", headers={"Host": "tg.example.com:443"}).status_code == 200
        assert c.get("/healthz", headers={"Host": EVIL}).status_code == 400
        assert c.get("/healthz").status_code == 200
    with _daemon_with({"allowed_hosts": ["*"]}) as d, d.client() as c:
        assert c.get("/healthz", headers={"Host": EVIL}).status_code == 200
    with _daemon_with({"host": "devbox.internal"}) as d, d.client() as c:
        assert c.get("/healthz", headers={"Host": "devbox.internal:8765"}).status_code == 200


async def _status(app: Any, base_url: str, host: str) -> int:
    transport = httpx.ASGITransport(app=app)  # its scope's server: the URL's host
    async with httpx.AsyncClient(transport=transport, base_url=base_url) as client:
        return (await client.get("/healthz", headers={"Host": host})).status_code


@pytest.mark.parametrize(
    ("allowed", "base_url", "host", "status"),
    [
        ((), "http://10.1.2.3:8765", EVIL, 200),  # another address, no names listed: any name
        (("tg.example.com",), "http://10.1.2.3:8765", EVIL, 400),  # listed: those only
        (("tg.example.com",), "http://10.1.2.3:8765", "tg.example.com", 200),
        (("tg.example.com",), "http://10.1.2.3:8765", "10.1.2.3:8765", 200),
        ((), "http://127.0.0.1:8765", EVIL, 400),
        ((), "http://[::1]:8765", EVIL, 400),
    ],
)
def test_which_names_answer_depends_on_the_address_the_request_came_to(
    allowed: tuple[str, ...], base_url: str, host: str, status: int
) -> None:
    """A daemon on another address answers a name an operator did not list (its clients use the
    names its network gives it) unless the operator lists names; on a loopback address (also
    reached on a daemon bound to 0.0.0.0) only loopback's."""
    app = create_app(MemoryStore(), Config.from_mapping({"server": {"allowed_hosts": allowed}}))
    assert asyncio.run(_status(app, base_url, host)) == status


@pytest.mark.parametrize(
    ("header", "name"),
    [("Evil.Example:80", "evil.example"), ("[::1]:8765", "::1"), ("[::1]", "::1"), ("a.b.", "a.b")],
)
def test_a_host_headers_name(header: str, name: str) -> None:
    from thoughtgate.server.hosts import host_name

    assert host_name(header) == name


@pytest.mark.parametrize("bad", ["http://tg.example.com", "tg.example.com:443", "", "a b"])
def test_allowed_hosts_takes_names_only(bad: str) -> None:
    with pytest.raises(ConfigError, match="allowed_hosts"):
        Config.from_mapping({"server": {"allowed_hosts": [bad]}})


def test_allowed_hosts_from_the_environment_is_comma_separated(tmp_path: Path) -> None:
    environ = {"THOUGHTGATE_SERVER__ALLOWED_HOSTS": "a.example, B.example"}
    config = load_config(environ=environ, cwd=tmp_path)
    assert config.server.allowed_hosts == ("a.example", "b.example")


# ---- CORS: no answer lets another origin read it ----------------------------------------------


def _paths(run_id: str) -> list[tuple[str, str]]:
    return [
        (e.method, e.path.format(run_id=run_id, call_id="call_x", key="nobody"))
        for e in all_endpoints()
    ]


def test_no_route_answers_a_preflight_or_names_an_origin(daemon: Daemon, run_id: str) -> None:
    """Without ``Access-Control-Allow-Origin`` a browser gives another origin's script no
    answer; without an answered preflight it sends no request carrying ``Authorization``. No
    route sends either, to any origin, with or without a key (ADR 0159: no CORS setting)."""
    origin = {"Origin": f"http://{EVIL}"}
    preflight = {
        **origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    seen = []
    with daemon.client() as c:
        for method, path in [*_paths(run_id), *(("GET", p) for p in OPEN_PATHS)]:
            seen.append(c.options(path, headers=preflight))
            seen.append(c.request(method, path, headers={**origin, **auth(daemon.keys["owner"])}))
            seen.append(c.request(method, path, headers=origin))
    for answer in seen:
        cors = [h for h in answer.headers if h.lower().startswith("access-control-")]
        assert not cors, (answer.request.method, answer.request.url, cors)
        assert answer.status_code != 204 or answer.request.method != "OPTIONS"


# ---- CSRF: what a page can send without a custom header changes nothing -------------------------


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/x-www-form-urlencoded", b"prompt=pwned&model=fake%3Aecho"),
        (
            "text/plain",
            b'{"prompt": "pwned", "model": "fake:echo", "name": "pwned", "role": "owner"}',
        ),
        (
            "multipart/form-data; boundary=x",
            b'--x\r\nContent-Disposition: form-data; name="prompt"\r\n\r\npwned\r\n--x--\r\n',
        ),
    ],
)
def test_a_simple_cross_origin_request_changes_nothing(
    daemon: Daemon, run_id: str, content_type: str, body: bytes
) -> None:
    """A form or a ``fetch`` with ``mode: "no-cors"`` sends no ``Authorization``: a key is read
    from that header only, never from the query string or a cookie, so every route that
    changes something answers 401 and no run, key or approval comes of it."""
    key = daemon.keys["owner"]
    before = daemon.get("/v1/runs?limit=100", "owner").json()
    keys_before = daemon.get("/v1/keys", "owner").json()
    headers = {
        "Origin": f"http://{EVIL}",
        "Content-Type": content_type,
        "Cookie": f"tg_key={key}; key={key}; authorization=Bearer%20{key}",
    }
    with daemon.client() as c:
        for method, path in _paths(run_id):
            if method == "GET":
                continue
            for query in ("", f"?key={key}", f"?api_key={key}", f"?authorization=Bearer%20{key}"):
                answer = c.request(method, path + query, headers=headers, content=body)
                assert answer.status_code == 401, (method, path, query, answer.text)
    assert daemon.get("/v1/runs?limit=100", "owner").json() == before
    assert daemon.get("/v1/keys", "owner").json() == keys_before


def test_a_ticket_opens_one_runs_stream_and_nothing_else(daemon: Daemon, run_id: str) -> None:
    """A ticket travels in a URL (an EventSource cannot send headers): one that leaked opens
    that run's stream for its minute, and is no key anywhere else."""
    with daemon.client("viewer") as c:
        ticket = c.post("/v1/tickets", json={"run_id": run_id}).json()["ticket"]
    with daemon.client() as c:
        assert c.get("/v1/me", headers=auth(ticket)).status_code == 401
        assert c.get(f"/v1/runs/{run_id}?ticket={ticket}").status_code in (401, 422)
        assert c.get(f"/v1/runs/stream?ticket={ticket}").status_code == 403
        with c.stream("GET", f"/v1/runs/{run_id}/stream?ticket={ticket}") as live:
            assert live.status_code == 200


# ---- Headers on every answer --------------------------------------------------------------------


def _answers(daemon: Daemon, run_id: str) -> list[tuple[str, httpx.Response]]:
    """One answer of each kind every route gives: success, each error, each live stream."""
    owner = auth(daemon.keys["owner"])
    out: list[tuple[str, httpx.Response]] = []

    def keep(name: str, answer: httpx.Response) -> None:
        out.append((name, answer))

    with daemon.client() as c:
        for method, path in _paths(run_id):
            if "stream" in path or path in ("/v1/runs/follow", "/v1/agui"):
                continue  # live streams: below, with bodies that open them
            keep(f"{method} {path} no key", c.request(method, path))
            body = {"json": {}} if method == "POST" else {}
            keep(f"{method} {path} owner", c.request(method, path, headers=owner, **body))
        keep("404 route", c.get("/v1/nothing", headers=owner))
        keep("405", c.put("/v1/runs", headers=owner))
        keep("413", c.post("/v1/runs", headers=owner, content=b"x" * 2_000_000))
        keep("400 json", c.post("/v1/runs", headers=owner, content=b"{"))
        keep("404 run", c.get("/v1/runs/run_nope", headers=owner))
        keep("redirect", c.get("/healthz/", follow_redirects=False))
        keep("400 host", c.get("/healthz", headers={"Host": EVIL}))
        ticket = c.post("/v1/tickets", headers=owner, json={"run_id": run_id}).json()["ticket"]
        keep("204 stream", c.get(f"/v1/runs/{run_id}/stream?ticket={ticket}&last_event_id=99"))
        keep("401 ticket", c.get(f"/v1/runs/{run_id}/stream?ticket=v1.forged.mac"))
        lister = c.post("/v1/tickets", headers=owner, json={"scope": "runs"}).json()["ticket"]
        streams = [
            ("GET", f"/v1/runs/{run_id}/stream?ticket={ticket}", {}),
            ("GET", f"/v1/runs/stream?ticket={lister}", {}),
            ("POST", "/v1/runs/follow", {"json": {"prompt": "hi", "model": "fake:echo"}}),
            (
                "POST",
                "/v1/agui",
                {
                    "json": {
                        "threadId": "t",
                        "runId": "r",
                        "state": {},
                        "messages": [],
                        "tools": [],
                        "context": [],
                        "forwardedProps": {"thoughtgate": {"run": run_id}},
                    }
                },
            ),
        ]
        for method, path, options in streams:
            with c.stream(method, path, headers=owner, **options) as live:
                keep(f"{method} {path} live", live)
    return out


def test_every_answer_is_not_sniffed_and_not_kept(daemon: Daemon, run_id: str) -> None:
    """Every answer that is not the page's -- JSON, a live stream, AG-UI, a 204, a redirect,
    each error -- says ``nosniff`` (a browser reads it as what it says, never as a script or
    a page) and ``no-store`` (no browser cache or shared proxy keeps a developer's reasoning, or
    anything one key was sent, for the next reader)."""
    answers = _answers(daemon, run_id)
    streams = [a for name, a in answers if name.endswith(" live")]
    assert len(streams) == 4 and all(a.status_code == 200 for a in streams)
    assert all("text/event-stream" in a.headers["content-type"] for a in streams)
    for name, answer in answers:
        assert answer.headers.get("x-content-type-options") == "nosniff", (name, answer.headers)
        assert answer.headers.get("cache-control") == "no-store", (name, answer.headers)


@pytest.mark.parametrize("path", ["/", "/static/index.html", "/static/app.js", "/static/app.css"])
def test_the_pages_files_are_asked_again_and_carry_the_policy(daemon: Daemon, path: str) -> None:
    """The page's files hold no one's data; a browser may keep them but asks again each time
    (``no-cache``: a 304 while unchanged), so an upgraded daemon never runs yesterday's scripts."""
    with daemon.client() as c:
        served = c.get(path)
        again = c.get(path, headers={"If-None-Match": served.headers["etag"]})
    assert served.headers["cache-control"] == "no-cache"
    assert served.headers["x-content-type-options"] == "nosniff"
    assert served.headers["content-security-policy"] == PAGE_POLICY
    assert again.status_code == 304  # the page too (ADR 0164)
