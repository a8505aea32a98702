"""``--help`` as a user reads it: every command's options with their help texts, a flag without a
value placeholder (Typer 0.29 renders each flag, ``--help`` too, as ``--flag <bool>``: that is why
pyproject.toml keeps Typer below 0.29), every other option with the metavar it declares."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption
from typer.testing import CliRunner

from thoughtgate.cli import app

pytestmark = pytest.mark.unit

#: Wide enough that no cell wraps: each help text must appear on one line, as written.
WIDE = {"COLUMNS": "400"}


Command = TyperCommand | TyperGroup


def _commands() -> Iterator[tuple[tuple[str, ...], Command]]:
    """Every command and group, the root first, by the words that name it."""

    def walk(command: Command, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Command]]:
        yield path, command
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, (*path, name))

    yield from walk(typer.main.get_command(app), ())


COMMANDS = dict(_commands())


def _help(path: tuple[str, ...]) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], env=WIDE)
    assert result.exit_code == 0, result.output
    return result.output


def _squeezed(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def test_the_walk_finds_the_commands_a_user_types() -> None:
    """The parametrized tests below cover these, and the walk is not silently empty."""
    names = {" ".join(path) for path in COMMANDS}
    expected = {"", "run", "resume", "status", "runs", "events", "trace", "demo", "mcp"}
    expected |= {"emulate", "smoke", "serve", "check-index", "keys", "keys create", "keys list"}
    expected |= {"keys revoke"}
    assert expected <= names


def _row(shown: str, name: str) -> str:
    """The table row a parameter starts: its first word (after a required star) is ``name``."""
    for line in shown.splitlines():
        words = line.replace("│", " ").replace("*", " ").split()
        if words and words[0].strip("[].") == name.strip("[]."):
            return line
    raise AssertionError(f"{name} is not listed:\n{shown}")


@pytest.mark.parametrize("path", list(COMMANDS), ids=lambda p: " ".join(p) or "thoughtgate")
def test_help_shows_each_flag_bare_and_each_option_with_its_help(path: tuple[str, ...]) -> None:
    shown = _help(path)
    assert "<bool>" not in shown
    assert re.search(r"│ +--help +Show this message and exit\. +│", shown), shown
    for param in COMMANDS[path].params:
        assert isinstance(param, TyperOption | TyperArgument)
        assert param.help, param.opts
        if param.hidden:
            assert param.opts[0] not in shown.split()
            continue
        if isinstance(param, TyperArgument):
            name = param.metavar or (param.name or "").upper()
            row = _row(shown, name)
            # the name alone, then the help text: not Typer's ``<str>``, nor ``{NAME}`` in usage
            words = row.replace("│", " ").replace("*", " ").split()
            assert words[words.index(name) + 1] == param.help.split()[0], row
            usage = shown.split("Usage:")[1].splitlines()[0].split()
            assert name in usage and f"{{{name}}}" not in usage, usage
        else:
            row = _row(shown, param.opts[0])
            words = row.replace("│", " ").replace("*", " ").split()
            after = max(words.index(name) for name in (*param.opts, *param.secondary_opts))
            # a flag's names are followed by its help text, any other option's by its metavar
            first = param.help.split()[0] if param.is_flag else param.metavar
            assert words[after + 1] == first, row
        assert _squeezed(param.help) in _squeezed(shown), param.opts


@pytest.mark.parametrize("command", ["status", "events", "trace", "resume"])
def test_a_run_id_argument_reads_run_id_in_the_usage_and_the_arguments(command: str) -> None:
    """Typer wrote ``Usage: thoughtgate status [OPTIONS] {RUN_ID}`` and ``RUN_ID  <str>  The
    run's id…``: the name to type, in the form a user copies from the usage line."""
    shown = _help((command,))
    assert re.search(rf"Usage: .*\b{command} \[OPTIONS\] RUN_ID +\n", shown), shown
    assert re.search(r"│ \* +RUN_ID +The run's id, or any unique start of it", shown), shown
    assert "{RUN_ID}" not in shown and "<str>" not in shown


def test_every_option_says_what_it_is_and_what_to_type() -> None:
    """Each parameter has a help text, and each one that takes a value a metavar chosen for it
    (``URL``, ``ROLE``, ``SECONDS``), not the type's name Typer would print."""
    missing: list[str] = []
    for path, command in COMMANDS.items():
        for param in command.params:
            where = " ".join(("thoughtgate", *path, param.opts[0] if param.opts else ""))
            if not getattr(param, "help", None):
                missing.append(f"{where}: no help text")
            flag = isinstance(param, TyperOption) and param.is_flag
            if not flag and param.metavar in (None, "INTEGER", "FLOAT"):
                missing.append(f"{where}: metavar {param.metavar!r}")
    assert missing == []


def _option(path: tuple[str, ...], flag: str) -> TyperOption:
    found = [p for p in COMMANDS[path].params if isinstance(p, TyperOption) and flag in p.opts]
    assert len(found) == 1, (path, flag)
    return found[0]


def test_an_option_whose_default_is_a_setting_names_the_setting_and_its_own_default() -> None:
    """``serve --help`` said ``Address to listen on (server.host)``: not what it listens on when
    nothing is set. An option that defaults to nothing (None) says what it falls back to."""
    from thoughtgate.config import ServerConfig

    server = ServerConfig()
    host = _option(("serve",), "--host").help or ""
    port = _option(("serve",), "--port").help or ""
    assert f"default: server.host, else {server.host}" in host
    # listening off loopback is refused without this setting: the help says so before a user
    # meets the refusal (ADR 0164)
    assert "needs server.allowed_hosts" in host
    assert f"default: server.port, else {server.port}" in port
    assert "default: all" in (_option(("events",), "--limit").help or "")
    assert "default: your local role, access.local_role" in (
        _option(("status",), "--view-as").help or ""
    )
    approve = _option(("run",), "--approve-all").help or ""
    assert "asked on a terminal" in approve and "orchestration.approval_timeout_s" in approve


@pytest.mark.parametrize(
    ("path", "flag", "shown"),
    [
        (("runs",), "--limit", "N [x>=1]"),
        (("events",), "--limit", "N [x>=1]"),
        (("events",), "--after", "SEQ [x>=0]"),
    ],
)
def test_a_count_option_shows_its_lower_bound_only(
    path: tuple[str, ...], flag: str, shown: str
) -> None:
    """``runs --help`` read ``N [1<=x<=9223372036854775807]``: the stores' largest integer,
    which a value above is still refused by (``test_cli_error_lines.py``), is no help."""
    line = next(line for line in _help(path).splitlines() if f" {flag} " in line)
    assert shown in line, line
    assert "9223372036854775807" not in _help(path)


def test_smoke_describes_its_provider_options_as_run_does() -> None:
    """The same flags with the same precedence (flag > variable > file): the same words."""
    for flag in ("--base-url", "--api-key"):
        assert _option(("smoke",), flag).help == _option(("run",), flag).help
        assert "beats" in (_option(("smoke",), flag).help or "")


@pytest.mark.parametrize("group", [(), ("keys",)], ids=["thoughtgate", "keys"])
def test_a_command_list_shows_each_summary_on_one_line(group: tuple[str, ...]) -> None:
    """The summaries of ``resume``, ``trace``, ``check-index`` and ``keys revoke`` broke where
    their docstrings wrap in the code, mid-sentence, however wide the terminal."""
    shown = _help(group).splitlines()
    for name, command in getattr(COMMANDS[group], "commands", {}).items():
        summary = _squeezed((command.help or "").split("\n\n")[0])
        rows = [_squeezed(line.replace("│", " ")) for line in shown]
        assert f"{name} {summary}" in rows, (name, summary, shown)


def test_version_prints_the_version_and_exits_0() -> None:
    """``thoughtgate --version`` was "No such option" (exit 2); the version was only in
    ``/healthz`` and MCP's ``serverInfo``."""
    from thoughtgate import __version__

    result = CliRunner().invoke(app, ["--version"])
    assert (result.exit_code, result.stdout) == (0, f"thoughtgate {__version__}\n")
