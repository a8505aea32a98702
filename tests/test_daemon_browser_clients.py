"""What ADR 0159 left for browsers, built (ADR 0164), over real HTTP on loopback.

* A daemon that would listen on an address other than loopback without
  ``server.allowed_hosts`` (where it would answer any ``Host``, a rebound name's too) refuses to
  start, naming the setting; ``["*"]`` opts out.
* ``server.cors_origins``: pages on the listed origins read the API from a browser (a preflight
  answered, the origin named, the headers a client reads exposed); no other origin is ever named,
  and without the setting nothing changes (``test_daemon_hostile_origin`` keeps that).
* The page and its files answer a browser's revalidation (``If-None-Match``) with ``304``.
* A request uvicorn cannot parse is answered with the headers of every answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.daemon import (
    REPO,
    Daemon,
    ThreadServer,
    agui_input,
    auth,
    cli_env,
    running_daemon,
    seed_keys,
)
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from thoughtgate.config import Config
from thoughtgate.errors import ConfigError
from thoughtgate.server.app import PAGE_POLICY, create_app
from thoughtgate.server.connections import ConnectionLimits, guarded_protocol
from thoughtgate.server.hosts import check_exposure
from thoughtgate.store.memory import MemoryStore

APP = "http://app.example:3000"
OTHER = "http://evil.example"


# ---- a daemon exposed beyond loopback names the hosts it answers for --------------------------


def _bound(host: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind((host, 0))  # bound only, never listening: nothing can connect
    return sock


def test_a_daemon_on_every_address_without_allowed_hosts_is_refused() -> None:
    """On ``0.0.0.0`` the daemon would answer any ``Host`` (its clients' names are not known
    to it), so a page that rebinds a name to the machine's LAN address reads the page, the
    version and the OpenAPI document as its own: refused, and the error says what to set."""
    with contextlib.closing(_bound("0.0.0.0")) as sock:
        with pytest.raises(ConfigError) as refused:
            check_exposure([sock], (), source="thoughtgate.toml")
        message = str(refused.value)
        assert message.startswith("thoughtgate.toml: server.allowed_hosts")
        assert "0.0.0.0" in message and '["*"]' in message
        check_exposure([sock], ("tg.example.com",))  # names listed: answered only for those
        check_exposure([sock], ("*",))  # the operator's explicit opt-out


def test_loopback_needs_no_list() -> None:
    """The tests, the bench, the CLI and clients all use loopback: the Host check refuses every
    other name there by itself."""
    with contextlib.closing(_bound("127.0.0.1")) as four:
        check_exposure([four], ())
        if socket.has_ipv6:
            with contextlib.suppress(OSError), contextlib.closing(_bound("::1")) as six:
                check_exposure([four, six], ())


def test_serve_app_refuses_before_it_listens() -> None:
    """``serve_app`` (what ``thoughtgate serve`` and the benches call) checks the sockets it
    serves on, also those it binds itself."""
    app = create_app(MemoryStore(), Config())

    async def serve() -> None:
        from thoughtgate.server.serve import serve_app

        await asyncio.wait_for(serve_app(app, host="0.0.0.0", port=0, log_level="warning"), 30)

    with pytest.raises(ConfigError, match=r"server\.allowed_hosts"):
        asyncio.run(serve())


@pytest.mark.external
@pytest.mark.parametrize(
    ("args", "env"),
    [
        (("--host", "0.0.0.0"), {}),
        ((), {"THOUGHTGATE_SERVER__HOST": "0.0.0.0"}),
    ],
)
def test_thoughtgate_serve_on_every_address_without_allowed_hosts_exits(
    args: tuple[str, ...], env: dict[str, str]
) -> None:
    """The command line and the configuration alike: exit 2 with one line naming the setting,
    before a bootstrap key is made (nobody would be shown it)."""
    done = subprocess.run(
        [sys.executable, "-m", "thoughtgate", "serve", "--port", "0", "--db", "memory://", *args],
        env=cli_env(THOUGHTGATE_DURABILITY__ENABLED="false", **env),
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "server.allowed_hosts" in done.stderr and "0.0.0.0" in done.stderr
    assert "listening" not in done.stderr and "created" not in done.stderr


# ---- CORS for the listed origins ---------------------------------------------------------------


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    config = Config.from_mapping({"server": {"cors_origins": [APP, "https://Other.Example/"]}})
    with running_daemon(config=config, shutdown_grace_s=0.1) as d:
        yield d


def _preflight(origin: str, method: str = "POST") -> dict[str, str]:
    return {
        "Origin": origin,
        "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": "authorization, content-type",
    }


def _listed(value: str) -> set[str]:
    return {v.strip().lower() for v in value.split(",")}


def test_a_listed_origins_preflight_is_answered(daemon: Daemon) -> None:
    """A browser asks before it sends ``Authorization`` or a JSON body across origins: the
    answer names that origin (never ``*``), the API's methods and the headers a client sends,
    allows no credentials, and says ``nosniff`` and ``no-store`` as every answer does."""
    for path, method in (("/v1/agui", "POST"), ("/v1/runs", "GET"), ("/v1/keys/k", "DELETE")):
        with daemon.client() as c:
            answer = c.options(path, headers=_preflight(APP, method))
        assert answer.status_code == 200, answer.text
        h = answer.headers
        assert h["access-control-allow-origin"] == APP
        assert method in {m.upper() for m in _listed(h["access-control-allow-methods"])}
        assert {"authorization", "content-type", "last-event-id"} <= _listed(
            h["access-control-allow-headers"]
        )
        assert "origin" in _listed(h["vary"])
        assert "access-control-allow-credentials" not in h
        assert h["x-content-type-options"] == "nosniff" and h["cache-control"] == "no-store"


def test_a_listed_origin_reads_the_api_and_its_streams(daemon: Daemon) -> None:
    """The answers a browser client reads -- JSON, an error, AG-UI's stream, a run's live
    stream -- name the listed origin, vary by it, and expose what a client reads beyond the
    body; the origin is matched as a browser sends it (the setting's ``https://Other.Example/``
    is ``https://other.example``)."""
    origin = {"Origin": APP}
    body = agui_input(model="fake:echo")
    run_id = daemon.start_run({"prompt": "hi", "model": "fake:echo"})
    daemon.wait_done(run_id)
    with daemon.client("member") as c:
        c.headers.update(origin)
        me = c.get("/v1/me")
        other = c.get("/v1/me", headers={"Origin": "https://other.example"})
        refused = c.get("/v1/runs/nope")
        with c.stream("POST", "/v1/agui", json=body) as agui:
            agui_text = agui.read().decode()
        ticket = c.post("/v1/tickets", json={"run_id": run_id}).json()["ticket"]
        with c.stream("GET", f"/v1/runs/{run_id}/stream", params={"ticket": ticket}) as live:
            live_text = live.read().decode()
    assert other.headers["access-control-allow-origin"] == "https://other.example"
    for answer in (me, refused, agui, live):
        assert answer.headers["access-control-allow-origin"] == APP, answer.request.url
        assert "origin" in _listed(answer.headers["vary"])
        exposed = _listed(answer.headers["access-control-expose-headers"])
        assert {"location", "retry-after", "www-authenticate"} <= exposed
        assert "access-control-allow-credentials" not in answer.headers
    assert me.status_code == 200 and refused.status_code == 404
    assert "RUN_FINISHED" in agui_text and "run.settlement.completed" in live_text


@pytest.mark.parametrize(
    "origin",
    [
        OTHER,
        "null",
        "http://app.example",  # the listed host on another port
        "https://app.example:3000",  # another scheme
        "http://app.example:3000.evil.example",
        "http://evil.app.example:3000",
        "http://app.example:30000",
        f"{APP}/",
        "HTTP://APP.EXAMPLE:3000",
        "*",
    ],
)
def test_an_unlisted_origin_is_never_named(daemon: Daemon, origin: str) -> None:
    """Whatever ``Origin`` a page sends that is not listed -- near misses included -- no answer
    names it (or ``*``): its preflight is refused, and the browser hands its script nothing."""
    with daemon.client() as c:
        preflight = c.options("/v1/agui", headers=_preflight(origin))
        simple = c.get("/healthz", headers={"Origin": origin})
        keyed = c.get("/v1/me", headers={"Origin": origin, **auth(daemon.keys["owner"])})
    assert preflight.status_code == 400
    # the daemon's JSON error, with the headers of every answer (ADR 0170): Starlette's was
    # text; it names what was refused, and no origin
    assert preflight.json()["error"]["code"] == "bad_request"
    assert "not allowed (its origin" in preflight.json()["error"]["message"]
    assert preflight.headers["content-type"] == "application/json"
    assert preflight.headers["x-content-type-options"] == "nosniff"
    assert preflight.headers["cache-control"] == "no-store"
    assert APP not in preflight.text and "app.example" not in preflight.text.lower()
    assert "other.example" not in preflight.text.lower()
    for answer in (preflight, simple, keyed):
        assert "access-control-allow-origin" not in answer.headers, answer.headers
        assert "access-control-allow-credentials" not in answer.headers
    assert "origin" in _listed(simple.headers["vary"])  # no cache hands it to a listed one


async def _allow_origin(app: Any, origin: str) -> str | None:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8765") as c:
        answer = await c.get("/healthz", headers={"Origin": origin})
        preflight = await c.options("/healthz", headers=_preflight(origin, "GET"))
    assert preflight.headers.get("access-control-allow-origin") == answer.headers.get(
        "access-control-allow-origin"
    )
    return answer.headers.get("access-control-allow-origin")


_ORIGINS_APP = create_app(MemoryStore(), Config.from_mapping({"server": {"cors_origins": [APP]}}))


@given(
    origin=st.one_of(
        st.just(APP),
        st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=40),
        st.builds(
            lambda scheme, host, port: f"{scheme}://{host}{port}",
            st.sampled_from(["http", "https", "HTTP"]),
            st.sampled_from(["app.example", "APP.example", "app.example.", "xapp.example"]),
            st.sampled_from(["", ":3000", ":3000/", ":03000", ":80"]),
        ),
    )
)
def test_only_the_listed_origin_is_ever_named(origin: str) -> None:
    """Property: for any ``Origin``, an answer names exactly the listed origin when that is what
    was sent, and no origin at all otherwise; it never reflects what it was sent."""
    named = asyncio.run(_allow_origin(_ORIGINS_APP, origin))
    assert named == (APP if origin == APP else None)


def test_origins_are_spelled_as_a_browser_sends_them() -> None:
    config = Config.from_mapping(
        {"server": {"cors_origins": ["HTTPS://App.Example:443/", "http://[::1]:3000", APP]}}
    )
    assert config.server.cors_origins == ("https://app.example", "http://[::1]:3000", APP)


@pytest.mark.parametrize(
    "bad",
    ["*", "null", "https://*.example", "app.example", "https://app.example/x", "ftp://a.example"],
)
def test_cors_origins_takes_origins_only(bad: str) -> None:
    """No wildcard (every site would read the daemon's open routes) and no ``null`` (every
    sandboxed frame and ``file:`` page has it)."""
    with pytest.raises(ConfigError, match="cors_origins"):
        Config.from_mapping({"server": {"cors_origins": [bad]}})


# ---- the page answers a revalidation with 304 --------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/static/app.js"])
def test_a_revalidated_page_keeps_its_policy_and_a_changed_tag_gets_the_file(
    daemon: Daemon, path: str
) -> None:
    """The page says ``no-cache``: a browser asks again at each load with the ``ETag`` it kept
    (``test_daemon_hostile_origin``: ``304``). The ``304`` still carries the page's policy and
    ``no-cache`` (ADR 0159); a tag that is not the file's gets the file; a list holding the tag,
    weak or not, gets ``304``."""
    with daemon.client() as c:
        first = c.get(path)
        tag = first.headers["etag"]
        again = c.get(path, headers={"If-None-Match": tag})
        stale = c.get(path, headers={"If-None-Match": '"0000"'})
        either = c.get(path, headers={"If-None-Match": f'"0000", W/{tag}'})
    assert again.status_code == 304 and again.content == b""
    assert again.headers["etag"] == tag
    assert again.headers["cache-control"] == "no-cache"
    assert again.headers["content-security-policy"] == PAGE_POLICY
    assert again.headers["x-content-type-options"] == "nosniff"
    assert stale.status_code == 200 and stale.content == first.content
    assert either.status_code == 304


def test_a_changed_file_gets_a_new_tag_whatever_its_time_and_size(tmp_path: Path) -> None:
    """An upgrade whose installer keeps the files' times (a wheel's fixed ones) and changes a
    script without changing its size: a browser revalidating the old one gets the new one, not a
    ``304`` that would keep yesterday's script running against today's API."""
    from thoughtgate.server.app import _PageFiles

    script = tmp_path / "app.js"
    script.write_text("let a = 1;")
    stat = script.stat()

    files = _PageFiles(directory=tmp_path)  # one, as the daemon's: what it keeps is asked too

    async def fetch(tag: str | None = None) -> httpx.Response:
        transport = httpx.ASGITransport(app=files)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            return await c.get("/app.js", headers={"If-None-Match": tag} if tag else {})

    old = asyncio.run(fetch()).headers["etag"]
    script.write_text("let a = 2;")
    os.utime(script, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert script.stat().st_size == stat.st_size
    answer = asyncio.run(fetch(old))
    assert answer.status_code == 200 and answer.text == "let a = 2;"
    assert answer.headers["etag"] != old


# ---- uvicorn's own answer to what is no HTTP request -------------------------------------------


@pytest.fixture(scope="module", params=[HttpToolsProtocol, H11Protocol], ids=["httptools", "h11"])
def guarded(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    """The daemon's app behind the connection guard ``thoughtgate serve`` uses, on either of
    uvicorn's HTTP protocols (httptools is the daemon's, h11 where it is not installed)."""
    store = MemoryStore()
    seed_keys(store)
    app = create_app(store, Config(), shutdown_grace_s=0.1)
    protocol = guarded_protocol(request.param, ConnectionLimits(100, 10.0))
    with ThreadServer(app, http=protocol) as server:
        host, port = server.base_url.removeprefix("http://").split(":")
        yield host, int(port)


@pytest.mark.parametrize(
    "sent",
    [
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nno colon here\r\n\r\n",
        b"GET /\x00 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    ],
)
def test_a_request_uvicorn_cannot_parse_gets_the_daemons_headers(
    guarded: tuple[str, int], sent: bytes
) -> None:
    """uvicorn answered these itself: ``text/plain`` with none of the headers every other
    answer carries. Now the daemon's JSON error, ``nosniff`` and ``no-store``, and the
    connection closed."""
    with socket.create_connection(guarded, timeout=20) as sock:
        sock.sendall(sent)
        data = b""
        while more := sock.recv(65536):
            data += more
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}
    assert status.startswith("HTTP/1.1 400"), data
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["cache-control"] == "no-store"
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    assert json.loads(body)["error"]["code"] == "bad_request"


# ---- every error the daemon sends names a listed origin (ADR 0170) ----------------------------


class _Failing(MemoryStore):
    """A store whose read of one run fails as nothing the daemon expects: the daemon's ``500``."""

    async def get_run(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        if run_id == "run_boom":
            raise RuntimeError("an unexpected failure")
        return await super().get_run(run_id, *args, **kwargs)


@pytest.fixture(scope="module", params=[HttpToolsProtocol, H11Protocol], ids=["httptools", "h11"])
def cors_guarded(request: pytest.FixtureRequest) -> Iterator[tuple[tuple[str, int], Any, str]]:
    """A daemon listing ``APP``, behind the connection guard ``thoughtgate serve`` uses (its
    body deadline short, its head bound small), on either of uvicorn's HTTP protocols."""
    store = _Failing()
    keys = seed_keys(store)
    app = create_app(store, Config.from_mapping({"server": {"cors_origins": [APP]}}))
    limits = ConnectionLimits(100, 0.2, 0.2, 2048, frozenset({APP}))
    with ThreadServer(app, http=guarded_protocol(request.param, limits)) as server:
        host, port = server.base_url.removeprefix("http://").split(":")
        yield (host, int(port)), request.param, keys["owner"]


def _exchange(where: tuple[str, int], sent: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes, read the answer to the connection's close: status, headers, body."""
    with socket.create_connection(where, timeout=20) as sock:
        sock.sendall(sent)
        data = b""
        with contextlib.suppress(ConnectionResetError):
            while more := sock.recv(65536):
                data += more
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}
    return int(status.split()[1]), headers, body


def test_the_daemons_500_names_a_listed_origin(
    cors_guarded: tuple[tuple[str, int], Any, str],
) -> None:
    """Written by Starlette's ``ServerErrorMiddleware``, outside the CORS middleware, the
    ``500`` named no origin: a listed origin's script saw a network error, not the status."""
    (host, port), _, key = cors_guarded
    answers = []
    for origin in (APP, OTHER):  # a connection each: the server closes one after a failure
        with httpx.Client(base_url=f"http://{host}:{port}", headers=auth(key), timeout=20) as c:
            answers.append(c.get("/v1/runs/run_boom", headers={"Origin": origin}))
    listed, unlisted = answers
    for answer in (listed, unlisted):
        assert answer.status_code == 500
        assert answer.json() == {"error": {"code": "internal_error", "message": "internal error"}}
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert "origin" in _listed(answer.headers["vary"])
    assert listed.headers["access-control-allow-origin"] == APP
    assert "retry-after" in _listed(listed.headers["access-control-expose-headers"])
    assert "access-control-allow-origin" not in unlisted.headers
    assert "unexpected failure" not in listed.text


@pytest.mark.parametrize("origin", [APP, OTHER])
@pytest.mark.parametrize("what", ["408", "431", "400"])
def test_the_connections_own_answers_name_a_listed_origin(
    cors_guarded: tuple[tuple[str, int], Any, str], what: str, origin: str
) -> None:
    """The connection's ``408`` (a body that never came), ``431`` (a head past the bound) and
    ``400`` (a head that is no HTTP) name the listed origin the head sent -- as far as it was
    parsed: uvicorn's h11 parses no header of a head that is not whole, so its ``431`` and
    ``400`` can name none, and httptools hands a header over once the next one was read -- and
    never an unlisted one."""
    where, protocol, _ = cors_guarded
    head = f"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: {origin}\r\n".encode()
    sent = {
        "408": head + b"Content-Length: 10\r\n\r\n{",
        "431": head + b"X-Padding: " + b"a" * 4096 + b"\r\n",
        "400": head + b"Accept: */*\r\nno colon here\r\n\r\n",
    }[what]
    status, headers, body = _exchange(where, sent)
    assert status == int(what), body
    assert headers["content-type"] == "application/json" and json.loads(body)["error"]
    assert headers["x-content-type-options"] == "nosniff" and headers["connection"] == "close"
    named = headers.get("access-control-allow-origin")
    if origin != APP:
        assert named is None
    elif what == "408" or protocol is HttpToolsProtocol:
        assert named == APP
        assert "origin" in _listed(headers["vary"])
        assert "retry-after" in _listed(headers["access-control-expose-headers"])
