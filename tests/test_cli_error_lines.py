"""An error is one line on stderr, whatever its length: a path, URL or run id in it must survive
being copied from a terminal or matched by a script, so the CLI never wraps it at the width."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from thoughtgate.cli import app
from thoughtgate.cli.exit_codes import ExitCode


@pytest.mark.inprocess
def test_a_long_error_naming_a_path_is_one_unbroken_line(tmp_path: Path) -> None:
    deep = tmp_path.joinpath(*(f"directory-{i:02d}" for i in range(12)), "store.db")
    result = CliRunner().invoke(
        app, ["status", "run_abc", "--db", f"sqlite:///{deep}"], env={"COLUMNS": "60"}
    )
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and str(deep) in lines[0]
    assert not deep.parent.exists()


BAD_INPUT = [
    # Typer's own parsing: found before any thoughtgate code runs
    (["bogus-command"], "No such command 'bogus-command'. (see thoughtgate --help)"),
    (["run"], "Missing argument 'PROMPT'. (see thoughtgate run --help)"),
    (["keys", "bogus"], "No such command 'bogus'. (see thoughtgate keys --help)"),
    (["runs", "--limit", "0"], "'--limit': 0 is not in the range x>=1."),
    # beyond what the stores' integers hold: SQLite stopped with a traceback
    (
        ["runs", "--limit", "9223372036854775808"],
        "'--limit': 9223372036854775808 is too large (at most 9223372036854775807).",
    ),
    (
        ["events", "run_x", "--after", "99999999999999999999"],
        "'--after': 99999999999999999999 is too large (at most 9223372036854775807).",
    ),
    (["events", "run_x", "--limit", "9223372036854775808"], "'--limit': 9223372036854775808 is"),
    (["events", "run_x", "--after", "-1"], "'--after': -1 is not in the range x>=0."),
    # (below the range: a port above it, before the check, was started on modulo 65536)
    (["serve", "--port", "-5"], "'--port': -5 is not in the range 0<=x<=65535."),
    (["emulate", "--port", "-1"], "'--port': -1 is not in the range 0<=x<=65535."),
    # a negative grace was taken as given
    (["serve", "--shutdown-grace", "-1"], "'--shutdown-grace': -1.0 is not in the range x>=0.0."),
    # thoughtgate's own checks
    (["serve", "--log-level", "loud"], "unknown --log-level 'loud'; allowed: debug, info"),
    (["emulate", "--scenario", "nope"], "unknown scenario 'nope'; known: "),
    (["status", "run_x", "--view-as", "wizard"], "unknown role 'wizard'; allowed: viewer"),
    (["runs", "--url", "not-a-url", "--key", "k"], "--url 'not-a-url' is not a daemon's address"),
]


@pytest.mark.unit
@pytest.mark.parametrize(("args", "says"), BAD_INPUT, ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_bad_input_is_one_error_line_and_exit_code_2(args: list[str], says: str) -> None:
    result = CliRunner().invoke(app, args, prog_name="thoughtgate", env={"COLUMNS": "60"})
    assert result.exit_code == ExitCode.USAGE, result.output
    assert result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and says in lines[0], lines[0]


BAD_CONFIG = [
    ("not toml [[[", "{file}: not valid TOML: Expected '=' after a key"),
    (
        "[server]\nport = 70000\n",
        "{file}: server.port = 70000: expected a whole number from 0 to 65535",
    ),
    ("[server]\nport = -1\n", "{file}: server.port = -1: expected a whole number from 0 to 65535"),
    ("[server]\nport = 'high'\n", "{file}: server.port = 'high': expected a whole number from 0"),
    ("[server]\nprot = 8000\n", "{file}: server.prot: no such key (check the spelling"),
    ("[servr]\nport = 8000\n", "{file}: servr: no such section (check the spelling)"),
    ("server = 8000\n", "{file}: server = 8000: expected a table of settings"),
    (
        "[access]\nlocal_role = 'boss'\n",
        "{file}: access.local_role = 'boss': expected one of viewer,",
    ),
    (
        "[store]\nurl = 'mysql://db/app'\n",
        "{file}: store.url = 'mysql://db/app': expected sqlite:///PATH, memory:// or postgresql://",
    ),
]


@pytest.mark.unit
@pytest.mark.parametrize(("text", "says"), BAD_CONFIG, ids=[t for t, _ in BAD_CONFIG])
def test_a_bad_config_file_is_one_line_naming_the_file_the_key_and_what_is_expected(
    tmp_path: Path, text: str, says: str
) -> None:
    bad = tmp_path / "thoughtgate.toml"
    bad.write_text(text, encoding="utf-8")
    result = CliRunner().invoke(app, ["serve", "--config", str(bad)], env={"COLUMNS": "60"})
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: " + says.format(file=bad)), lines[0]


@pytest.mark.unit
@pytest.mark.parametrize(
    "text",
    [
        '[providers.openai]\napi_kye = "sk-live-secret-0123"\n',
        '[providers.openai]\napi_key = ["sk-live-secret-0123"]\n',
        '[providers.opnai]\napi_key = "sk-live-secret-0123"\n',
    ],
    ids=["misspelt key", "wrong kind of value", "misspelt section"],
)
def test_a_config_error_never_repeats_a_value_that_may_be_a_secret(
    tmp_path: Path, text: str
) -> None:
    bad = tmp_path / "thoughtgate.toml"
    bad.write_text(text, encoding="utf-8")
    result = CliRunner().invoke(app, ["serve", "--config", str(bad)], env={"COLUMNS": "60"})
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "api_k" in result.stderr or "opnai" in result.stderr, result.stderr
    assert "sk-live-secret-0123" not in result.output + result.stderr


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            "[server]\nport = 70000\nhost = 5\n[orchestration]\nmax_turn = 3\n",
            [
                "orchestration.max_turn: no such key (check the spelling and the section)",
                "server.host = 5: expected a string",
                "server.port = 70000: expected a whole number from 0 to 65535",
            ],
        ),
        # A secret's value is not repeated (it may be a key, or a URL with a password), but it
        # was set: the line says what the key takes, not "is not set".
        (
            "[providers.anthropic]\napi_key = 12345678\n[server]\nsecret = true\n"
            "[store]\nurl = 'postgress://bob:hunter2@db/app'\n",
            [
                "providers.anthropic.api_key: expected a string (the value is not shown)",
                "server.secret: expected a string (the value is not shown)",
                "store.url: expected sqlite:///PATH, memory:// or postgresql://... "
                "(the value is not shown)",
            ],
        ),
    ],
    ids=["three problems", "secrets of the wrong kind"],
)
def test_each_problem_of_a_config_file_is_a_line_of_its_own(
    tmp_path: Path, text: str, says: list[str]
) -> None:
    bad = tmp_path / "thoughtgate.toml"
    bad.write_text(text)
    result = CliRunner().invoke(app, ["serve", "--config", str(bad)], env={"COLUMNS": "60"})
    assert result.exit_code == ExitCode.USAGE, result.output
    lines = sorted(line for line in result.stderr.splitlines() if line.strip())
    assert lines == [f"error: {bad}: {line}" for line in says]


@pytest.mark.unit
def test_a_bad_environment_variable_is_named_instead_of_the_file(tmp_path: Path) -> None:
    good = tmp_path / "thoughtgate.toml"
    good.write_text("[server]\nport = 8000\n")
    result = CliRunner().invoke(
        app,
        ["serve", "--config", str(good)],
        env={"COLUMNS": "60", "THOUGHTGATE_SERVER__PORT": "high"},
    )
    assert result.exit_code == ExitCode.USAGE, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [
        "error: THOUGHTGATE_SERVER__PORT: server.port = 'high': "
        "expected a whole number from 0 to 65535"
    ]


@pytest.mark.unit
def test_a_config_file_that_is_not_there_is_named_with_what_named_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    result = CliRunner().invoke(app, ["serve", "--config", str(missing)], env={"COLUMNS": "60"})
    assert result.exit_code == ExitCode.USAGE, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [f"error: {missing}: no such file (named by --config)"]


@pytest.mark.unit
def test_no_arguments_still_print_the_help() -> None:
    result = CliRunner().invoke(app, [], prog_name="thoughtgate")
    assert result.exit_code == ExitCode.USAGE
    assert "Usage: thoughtgate [OPTIONS] COMMAND" in result.output
    assert "error:" not in result.output


@pytest.mark.inprocess
@pytest.mark.parametrize("credentials", ["", "bob:hunter2@"], ids=["plain", "with a password"])
def test_an_unreachable_daemon_is_named_in_plain_words(credentials: str) -> None:
    """A reverse proxy's basic-auth password in ``--url`` is not repeated."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed when the block ends: nothing listens there
    url = f"http://{credentials}127.0.0.1:{port}"
    result = CliRunner().invoke(app, ["status", "run_x", "--url", url, "--key", "k"])
    assert result.exit_code == ExitCode.FAILED
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: cannot reach the daemon at http://127.0.0.1:{port}: ")
    assert "Error(" not in lines[0]  # httpx's words, not an exception's repr
    assert "hunter2" not in result.output + result.stderr


@pytest.mark.unit
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--key", "k"], "error: --url 'ftp://db.internal' is not a daemon's address"),
        ([], "error: --url http://db.internal needs an API key"),
    ],
    ids=["bad scheme", "no key"],
)
def test_a_refused_daemon_url_is_named_without_its_password(args: list[str], says: str) -> None:
    scheme = "ftp" if args else "http"
    url = f"{scheme}://bob:hunter2@db.internal"
    result = CliRunner().invoke(app, ["runs", "--url", url, *args], env={"COLUMNS": "60"})
    assert result.exit_code == ExitCode.USAGE, result.output
    assert result.stderr.startswith(says), result.stderr
    assert "hunter2" not in result.output + result.stderr


WITH_BASE_URL = ("--db", "memory://", "--base-url")


@pytest.mark.unit
@pytest.mark.parametrize(
    "url",
    ["ftp://api.example.com", "localhost:8000", "http://host:port", "http://"],
)
def test_a_base_url_no_request_can_go_to_is_a_usage_error_before_any_run(url: str) -> None:
    """Not a run that fails with httpx's ``UnsupportedProtocol``: exit 2, no run created."""
    result = CliRunner().invoke(
        app,
        [
            "run",
            "hi",
            "--model",
            "anthropic:claude-sonnet-4-5",
            "--api-key",
            "k",
            *WITH_BASE_URL,
            url,
        ],
        env={"COLUMNS": "60"},
    )
    assert result.exit_code == ExitCode.USAGE, result.output
    assert result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: providers.anthropic.base_url = "), lines[0]
    assert "expected an http:// or https:// URL" in lines[0]


@pytest.mark.unit
@pytest.mark.parametrize(
    "url",
    ["ftp://bob:hunter2@api.example.com", "bob:hunter2@api.example.com", "http://bob:hunter2@"],
)
def test_a_bad_base_url_is_named_without_its_password(url: str) -> None:
    result = CliRunner().invoke(
        app,
        ["run", "hi", "--model", "openai:gpt-5", "--api-key", "k", *WITH_BASE_URL, url],
    )
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "providers.openai.base_url" in result.stderr
    assert "hunter2" not in result.output + result.stderr


@pytest.mark.unit
def test_a_mistyped_store_scheme_is_named_without_the_urls_password() -> None:
    result = CliRunner().invoke(app, ["runs", "--db", "postgress://bob:hunter2@db.internal/app"])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert result.stderr.startswith("error: unsupported store url 'postgress:")
    assert "'postgress://db.internal/app'" in result.stderr  # where it pointed, without who
    assert "hunter2" not in result.output + result.stderr


@pytest.mark.unit
@pytest.mark.parametrize(
    ("kind", "says"), [("directory", "a directory, not a file"), ("pipe", "not a regular file")]
)
def test_a_config_path_that_is_no_file_says_what_it_is(
    tmp_path: Path, kind: str, says: str
) -> None:
    """The file is read more than once, and a pipe (``--config <(...)``) gives its text only to
    the first read: refused, rather than loaded with settings (``access.local_role``) lost."""
    path = tmp_path / kind
    if kind == "directory":
        path.mkdir()
    else:
        os.mkfifo(path)
    result = CliRunner().invoke(app, ["runs", "--config", str(path)], env={"COLUMNS": "60"})
    assert result.exit_code == ExitCode.USAGE, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [f"error: {path}: {says} (named by --config)"]


def _on_a_port_in_use(args: list[str]) -> tuple[int, list[str]]:
    """The port another socket listens on, and the error lines of ``args --port`` that port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(app, [*args, "--port", str(port)], env={"COLUMNS": "60"})
    assert result.exit_code == ExitCode.FAILED, result.output
    assert "Traceback" not in result.output
    return port, [line for line in result.stderr.splitlines() if line.strip()]


@pytest.mark.inprocess
def test_serve_on_a_port_in_use_is_one_line_before_it_opens_its_store(tmp_path: Path) -> None:
    """Found before start-up: no store is created and no bootstrap owner key is made that would
    never be shown (the next start, finding a key, prints none)."""
    store = tmp_path / "store.db"
    port, lines = _on_a_port_in_use(["serve", "--db", f"sqlite:///{store}"])
    assert lines == [
        f"error: cannot listen on 127.0.0.1:{port}: the port is already in use (another server "
        "holds it: stop it, or choose another port; 0 picks a free one)"
    ]
    assert not store.exists()


@pytest.mark.inprocess
def test_emulate_on_a_port_in_use_is_one_line_not_a_traceback() -> None:
    port, lines = _on_a_port_in_use(["emulate"])
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot listen on 127.0.0.1:{port}: ")


@pytest.mark.inprocess
def test_the_largest_limit_lists_the_runs_of_a_sqlite_store(tmp_path: Path) -> None:
    """``--limit 9223372036854775807`` is allowed: the store asks for one run more than the page
    (whether another page follows) without going past SQLite's integers."""
    db = f"sqlite:///{tmp_path / 'store.db'}"
    # not durable: DBOS launched inside CliRunner would log to its captured stderr ever after
    started = CliRunner().invoke(
        app,
        ["run", "hi", "--model", "fake:echo", "--db", db],
        env={"THOUGHTGATE_DURABILITY__ENABLED": "false"},
    )
    assert started.exit_code == ExitCode.COMPLETED, started.output
    listed = CliRunner().invoke(app, ["runs", "--limit", str(2**63 - 1), "--json", "--db", db])
    assert listed.exit_code == ExitCode.COMPLETED, listed.output
    assert len(json.loads(listed.stdout)) == 1


@pytest.mark.inprocess
@pytest.mark.parametrize(
    ("command", "where", "says"),
    [
        (["runs"], "directory", "it is a directory, not a file (name a file in it: sqlite:///"),
        (["run", "hi", "--model", "fake:echo"], "directory", "it is a directory, not a file"),
        (["run", "hi", "--model", "fake:echo"], "under a file", "a part of its path is a file"),
    ],
)
def test_a_store_path_that_cannot_hold_a_database_is_one_line_not_a_traceback(
    tmp_path: Path, command: list[str], where: str, says: str
) -> None:
    """``--db sqlite:///DIR`` (a folder, not a file in it) or a path through a regular file
    stopped every command with a Python traceback (``IsADirectoryError``)."""
    if where == "directory":
        path = tmp_path / "runs"
        path.mkdir()
    else:
        (tmp_path / "notes.txt").write_text("mine\n")
        path = tmp_path / "notes.txt" / "store.db"
    result = CliRunner().invoke(
        app,
        [*command, "--db", f"sqlite:///{path}"],
        env={"COLUMNS": "60", "THOUGHTGATE_DURABILITY__ENABLED": "false"},
    )
    assert result.exit_code == ExitCode.FAILED, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # not IsADirectoryError
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: cannot open SQLite database {path}: {says}"), lines
    assert lines[0].endswith("Point the store at another path (store.url / --db / THOUGHTGATE_DB).")
    if where == "directory":
        assert list(path.iterdir()) == []  # nothing was created in it


@pytest.mark.inprocess
def test_a_store_this_user_may_not_read_is_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(Simulated: the tests may run as root, whom file modes do not stop.)"""
    store = tmp_path / "store.db"
    store.write_bytes(b"")
    opened = Path.open

    def refused(self: Path, *args: object, **kwargs: object) -> object:
        if self == store:
            raise PermissionError(13, "Permission denied", str(self))
        return opened(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "open", refused)
    result = CliRunner().invoke(app, ["runs", "--db", f"sqlite:///{store}"], env={"COLUMNS": "60"})
    assert result.exit_code == ExitCode.FAILED, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert [line for line in result.stderr.splitlines() if line.strip()] == [
        f"error: cannot open SQLite database {store}: Permission denied; check that it and its "
        "directory are readable. Point the store at another path (store.url / --db / "
        "THOUGHTGATE_DB)."
    ]


@pytest.mark.inprocess
@pytest.mark.parametrize(
    "command", [["run", "hi", "--model", "fake:reasoner", "--cot", "surface"], ["serve"], ["mcp"]]
)
def test_a_model_summarizer_without_its_model_is_refused_before_a_run_or_a_store(
    tmp_path: Path, command: list[str]
) -> None:
    """Without a summarizer model every surface run would be created and then fail: the command
    refuses the config at start instead, naming both keys, before its store is opened."""
    config = tmp_path / "thoughtgate.toml"
    config.write_text('[visible_reasoning]\nsummarizers = ["phases", "model"]\n', encoding="utf-8")
    store = tmp_path / "store.db"
    result = CliRunner().invoke(
        app,
        [*command, "--config", str(config), "--db", f"sqlite:///{store}"],
        env={"COLUMNS": "60", "THOUGHTGATE_DURABILITY__ENABLED": "false"},
    )
    assert result.exit_code == ExitCode.USAGE, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [
        "error: visible_reasoning.summarizer_model is not set; it needs PROVIDER:MODEL when "
        "visible_reasoning.summarizers includes model"
    ]
    assert not store.exists()


@pytest.mark.inprocess
def test_serving_on_every_address_without_a_config_names_the_setting_not_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no thoughtgate.toml and no variable, the refusal of a non-loopback address starts
    with the key to set, not with ``defaults:``, which named no place a user could look."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        app,
        ["serve", "--host", "0.0.0.0", "--port", "0", "--db", "memory://"],
        env={"COLUMNS": "60"},
    )
    assert result.exit_code == ExitCode.USAGE, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: server.allowed_hosts: is empty, and the daemon would listen")
    assert "0.0.0.0" in lines[0]
