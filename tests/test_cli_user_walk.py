"""What a new user meets walking the README: listings whose ids can be copied, options that
refuse what makes no sense, ``--help`` that says the defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.web import web_daemon
from typer.testing import CliRunner

from thoughtgate.cli import app

QUIET = {"THOUGHTGATE_DURABILITY__ENABLED": "false"}


def _tg(*args: str, columns: int = 80) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env={**QUIET, "COLUMNS": str(columns)})
    assert isinstance(result.exception, SystemExit | None), result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.inprocess
@pytest.mark.parametrize("columns", [80, 200])
def test_keys_list_shows_whole_ids_and_names_at_any_width(tmp_path: Path, columns: int) -> None:
    """``keys revoke`` takes a key's exact id or its name; at 80 columns (or in a pipe) the
    table cut both to an ellipsis (``key_4c4ff87d7c8e4…``, ``bootst…``)."""
    db = f"sqlite:///{tmp_path / 'store.db'}"
    names = ["bootstrap-owner", "a-rather-long-name-for-the-ci-pipeline-key"]
    for name in names:
        code, _, err = _tg("keys", "create", "--role", "viewer", "--name", name, "--db", db)
        assert code == 0, err
    code, out, _ = _tg("keys", "list", "--db", db, "--json")
    ids = [k["key_id"] for k in json.loads(out)]
    code, out, err = _tg("keys", "list", "--db", db, columns=columns)
    assert code == 0, err
    assert "…" not in out
    for key_id, name in zip(ids, names, strict=True):
        assert key_id in out.split() and name in out.split(), out


@pytest.mark.inprocess
def test_runs_says_when_nothing_matches_instead_of_an_empty_table(tmp_path: Path) -> None:
    """An empty box of column headers did not say whether the store or the filters were empty;
    stdout stays empty (``--json`` is ``[]``), the words go to stderr."""
    db = f"sqlite:///{tmp_path / 'store.db'}"
    code, _, err = _tg("keys", "create", "--role", "viewer", "--name", "ci", "--db", db)
    assert code == 0, err  # the store exists, with no runs
    assert _tg("runs", "--db", db) == (0, "", "no runs yet\n")
    code, _, err = _tg("run", "hello", "--model", "fake:echo", "--db", db, "--json")
    assert code == 0, err
    assert _tg("runs", "--db", db, "--status", "failed") == (0, "", "no runs match these filters\n")
    assert _tg("runs", "--db", db, "--search", "nothing like it", "--json") == (0, "[]\n", "")
    code, out, _ = _tg("runs", "--db", db)
    assert code == 0 and "hello" in out


@pytest.mark.inprocess
def test_keys_list_says_when_there_are_none_instead_of_an_empty_table(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'store.db'}"
    code, _, err = _tg("run", "hello", "--model", "fake:echo", "--db", db, "--json")
    assert code == 0, err  # the store exists, with no keys
    said = "no keys yet (thoughtgate keys create --role ROLE --name NAME)\n"
    assert _tg("keys", "list", "--db", db) == (0, "", said)
    assert _tg("keys", "list", "--db", db, "--json") == (0, "[]\n", "")


@pytest.mark.inprocess
def test_a_role_the_daemon_refuses_is_named_with_what_it_takes() -> None:
    """Through ``--url`` a viewer's ``run``, ``resume`` and ``trace`` said only the daemon's
    generic "forbidden: your role does not allow this"; locally the same refusal says which role
    it takes. Both now do, with the key's role."""
    with web_daemon(shutdown_grace_s=0.1) as daemon:
        run_id = daemon.start_run({"prompt": "hello", "model": "fake:echo"})
        daemon.wait_done(run_id)
        env = {"THOUGHTGATE_URL": daemon.base_url, "THOUGHTGATE_KEY": daemon.keys["viewer"]}
        said = {}
        for args in (["run", "hi", "--model", "fake:echo"], ["resume", run_id], ["trace", run_id]):
            result = CliRunner().invoke(app, args, env={**QUIET, **env, "COLUMNS": "60"})
            assert result.exit_code == 2, result.output
            said[args[0]] = result.stderr.strip()
        developer = {**env, "THOUGHTGATE_KEY": daemon.keys["developer"]}
        traced = CliRunner().invoke(app, ["trace", run_id, "--json"], env={**QUIET, **developer})
        assert traced.exit_code == 0, traced.output
    assert said == {
        "run": "error: starting a run requires role member or above; this key's role is viewer",
        "resume": "error: resuming a run requires role member or above; this key's role is viewer",
        "trace": "error: the trace requires role developer or above; this key's role is viewer",
    }


@pytest.mark.inprocess
def test_demo_names_its_store_without_a_password_and_hints_with_the_same_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo's first line printed ``--db`` as given, a PostgreSQL password included; its
    closing hint (``thoughtgate events RUN --view-as viewer``) left out the ``--db`` it was
    given, so it looked in another store, and for ``memory://`` pointed at a run that was gone."""
    from thoughtgate.cli import common
    from thoughtgate.store.memory import MemoryStore

    async def in_memory(url: str) -> MemoryStore:
        return MemoryStore()  # (no PostgreSQL here: what is printed is the subject)

    monkeypatch.setattr(common, "open_store", in_memory)
    code, out, err = _tg("demo", "--db", "postgresql://bob:hunter2@db.internal/app", columns=400)
    assert code == 0, err
    assert "hunter2" not in out + err
    assert "db.internal" in " ".join(out.split()[:20])  # the first line (wrapped at the width)
    hint = out.splitlines()[-1]
    assert hint.startswith("See what a viewer gets: thoughtgate events run_")
    assert hint.endswith(" --view-as viewer --db URL")
    monkeypatch.undo()
    db = tmp_path / "my runs.db"
    code, out, err = _tg("demo", "--db", f"sqlite:///{db}", columns=400)
    assert code == 0, err
    assert out.splitlines()[-1].endswith(f" --view-as viewer --db 'sqlite:///{db}'")
    code, out, err = _tg("demo", "--db", "memory://", columns=400)
    assert code == 0, err
    assert out.splitlines()[-1].startswith("The run was in memory:// and is gone")


@pytest.mark.unit
def test_an_answer_in_no_daemons_words_says_the_address_may_be_wrong() -> None:
    """``--url`` at the emulator's port (8766, not the daemon's 8765) said only ``[405 error]
    Method Not Allowed``. A 5xx in no daemon's words (a proxy's, or the daemon's own crash) keeps
    them; a daemon's JSON error is as before."""
    import httpx

    from thoughtgate.client.errors import DaemonError, RequestRejectedError, raise_for_response

    asked = httpx.Request("GET", "http://127.0.0.1:8766/v1/me")
    with pytest.raises(RequestRejectedError) as other:
        raise_for_response(httpx.Response(405, text="Method Not Allowed", request=asked))
    assert str(other.value) == (
        "[405 not_a_daemon] the server at http://127.0.0.1:8766/ answered GET /v1/me with HTTP "
        "405 Method Not Allowed, not as a thoughtgate daemon does: is that the daemon's address?"
    )
    with pytest.raises(DaemonError, match=r"^\[502\] upstream connect error$"):
        raise_for_response(httpx.Response(502, text="upstream connect error", request=asked))
    ours = {"error": {"code": "not_found", "message": "no such route: GET /v1/nope"}}
    with pytest.raises(RequestRejectedError, match=r"^\[404 not_found\] no such route"):
        raise_for_response(httpx.Response(404, json=ours, request=asked))


@pytest.mark.unit
def test_a_servers_words_in_an_error_reach_the_terminal_without_its_control_characters(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A 5xx body in no daemon's words, and a daemon-shaped JSON error, are quoted in the error
    line: whatever server ``--url`` names (or a proxy in front of it) chose their bytes. An
    escape sequence in them (retitle the terminal, clear it, a hyperlink, C1's one-byte CSI)
    reached stderr as it was (red team, ADR 0135). Now each control character is shown, not
    obeyed."""
    import httpx
    import typer

    from thoughtgate.cli.common import one_line_errors
    from thoughtgate.client.errors import raise_for_response

    asked = httpx.Request("GET", "http://127.0.0.1:8765/v1/runs")
    answers = [
        httpx.Response(502, text="bad \x1b]0;PWNED\x07gateway\x1b[2J\r", request=asked),
        httpx.Response(
            404,
            json={"error": {"code": "x\x1b[8m", "message": "gone \x9b31m\x1b]8;;http://e\x1b\\"}},
            request=asked,
        ),
    ]
    for answer in answers:
        with pytest.raises(typer.Exit), one_line_errors():
            raise_for_response(answer)
    err = capsys.readouterr().err
    assert not any((ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0 for c in err), repr(err)
    assert "bad \\x1b]0;PWNED\\x07gateway\\x1b[2J" in err
    assert "gone \\x9b31m\\x1b]8;;http://e" in err


@pytest.mark.inprocess
def test_an_empty_run_id_is_a_usage_error_not_a_prefix_of_every_run(tmp_path: Path) -> None:
    """``thoughtgate status ""`` answered "'' matches several runs (...)": an empty id (or a
    blank one) was taken as the start of every run's id."""
    db = f"sqlite:///{tmp_path / 'store.db'}"
    for prompt in ("one", "two"):
        code, _, err = _tg("run", prompt, "--model", "fake:echo", "--db", db, "--json")
        assert code == 0, err
    said = "empty: give a run's id or a unique start of it (thoughtgate runs lists them)"
    for command in ("status", "events", "trace", "resume", "check-index"):
        for given in ("", "  "):
            code, out, err = _tg(command, given, "--db", db, columns=400)
            assert (code, out) == (2, ""), (command, err)
            assert err.startswith("error: Invalid value for ") and said in err, err
            assert "matches several" not in err
    code, out, err = _tg("status", "run_", "--db", db, columns=400)
    assert code == 2 and "'run_' matches several runs" in err  # a prefix typed is still one


@pytest.mark.inprocess
def test_a_key_exported_without_a_url_is_not_used_and_local_commands_work(tmp_path: Path) -> None:
    """With ``THOUGHTGATE_KEY`` exported for a daemon and no ``THOUGHTGATE_URL``, every local
    command was refused ("--key (or THOUGHTGATE_KEY) needs --url"). The key from the environment
    alone is not used (it is sent nowhere) and a note says so; a ``--key`` typed without
    ``--url`` is still a usage error."""
    db = f"sqlite:///{tmp_path / 'store.db'}"
    env = {
        **QUIET,
        "COLUMNS": "400",
        "THOUGHTGATE_KEY": "tg_for_the_daemon",
        "THOUGHTGATE_URL": None,
    }
    note = "note: THOUGHTGATE_KEY is not used without --url or THOUGHTGATE_URL (this command uses the local store)\n"

    def tg(*args: str) -> tuple[int, str, str]:
        result = CliRunner().invoke(app, list(args), env=env)
        assert isinstance(result.exception, SystemExit | None), result.exception
        return result.exit_code, result.stdout, result.stderr

    code, out, err = tg("run", "hello", "--model", "fake:echo", "--db", db, "--json")
    assert (code, err) == (0, note)
    run_id = json.loads(out)["run_id"]
    for command in (["status", run_id], ["events", run_id], ["trace", run_id], ["runs"]):
        code, out, err = tg(*command, "--db", db, "--json")
        assert (code, err) == (0, note), command
        assert run_id in out, command
    code, _, err = tg("resume", run_id, "--db", db)
    assert code == 2 and err.startswith(note), err  # (a completed run has nothing to resume)
    for command in (["runs"], ["status", run_id], ["resume", run_id]):
        code, out, err = tg(*command, "--db", db, "--key", "tg_typed")
        assert (code, out) == (2, ""), command
        assert err == "error: --key needs --url (or THOUGHTGATE_URL)\n", command
