"""A store URL's password is in none of the texts the store and the CLI build of it -- where a
store is, its driver's errors, the URL as a message shows it -- whatever was typed in it: ``@``,
``:``, ``/``, ``?``, ``#``, a bad ``%`` escape, a single character. libpq reads a password typed
without its escapes into the host, the port or the database; the texts mask it there too, and
keep the host and the database readable where the URL reads as it was meant (ADR 0135)."""

from __future__ import annotations

import asyncio
import re
from urllib.parse import quote

import psycopg
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from thoughtgate.errors import UsageError, public_url
from thoughtgate.store.pg_errors import describe_target, translate_error
from thoughtgate.store.postgres import split_schema_param
from thoughtgate.store.urls import describe_store

pytestmark = pytest.mark.unit

_WORD = "A-Za-z0-9_"


def _standalone(piece: str, text: str) -> bool:
    """Whether ``piece`` is in ``text`` as its own word: not inside a longer one (a password
    ``7`` is not in a port ``5432``), as the masking reads it."""
    head = f"(?<![{_WORD}])" if re.match(f"[{_WORD}]", piece[0]) else ""
    tail = f"(?![{_WORD}])" if re.match(f"[{_WORD}]", piece[-1]) else ""
    return re.search(head + re.escape(piece) + tail, text) is not None


def _driver_errors(conninfo: str) -> list[psycopg.Error]:
    """What libpq says of this connection string: its parse error, or words quoting what it
    parsed (the host, the port, the database, the user), as a failed connection's do."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as exc:
        return [exc]
    except UnicodeDecodeError:  # refused before connecting, naming nothing (the test below)
        return []
    host, port = params.get("host", ""), params.get("port", "5432")
    dbname, user = params.get("dbname", ""), params.get("user", "")
    server = f'connection to server at "{host}" (127.0.0.1), port {port} failed: FATAL:  '
    return [
        psycopg.OperationalError(f'failed to resolve host "{host}": Name or service not known'),
        psycopg.OperationalError(f'invalid integer value "{port}" for connection option "port"'),
        psycopg.OperationalError(f'{server}database "{dbname}" does not exist'),
        psycopg.OperationalError(f'{server}password authentication failed for user "{user}"'),
    ]


_PASSWORDS = st.one_of(
    st.sampled_from("XYZ789"),  # one character
    st.text(alphabet="XYZ789@:/%?#!.-", min_size=2, max_size=14),
    st.sampled_from(["Sek@r3t", "Sek/r3t", "Sek%zzr3t", "S@e/k", "7/8", "X?Y", "X#Y", "P@Q"]),
)
"""Upper case letters and the digits 7 to 9: none of them stands alone in a text of lower case
hosts and databases, port 5432 and 127.0.0.1, so what is found of a password is the password."""


_NAMES = "abcdfghijlmnopqsuvwxy"
"""The user's, host's and database's letters: none of the lower case letters the sampled
passwords hold (``e``, ``k``, ``r``, ``t``, ``z``), so a user ``e`` shown in an error is not
taken for the password piece ``e`` of ``S@e/k``."""


@settings(max_examples=400, deadline=None)
@given(
    user=st.from_regex(f"[{_NAMES}]{{1,6}}", fullmatch=True),
    password=_PASSWORDS,
    host=st.from_regex(f"[{_NAMES}]{{2,6}}(\\.[{_NAMES}]{{2,6}})?", fullmatch=True),
    db=st.from_regex(f"[{_NAMES}]{{2,6}}", fullmatch=True),
    encoded=st.booleans(),
    query=st.sampled_from(["", "?schema=s", "?application_name=a@b"]),
)
def test_no_text_of_a_store_url_shows_its_password(
    user: str, password: str, host: str, db: str, encoded: bool, query: str
) -> None:
    typed = quote(password, safe="") if encoded else password
    url = f"postgresql://{user}:{typed}@{host}:5432/{db}{query}"
    conninfo, schema = split_schema_param(url)
    where = describe_target(conninfo, schema)
    texts = [where, describe_store(url), public_url(url), public_url(f"postgress{url[10:]}")]
    for exc in _driver_errors(conninfo):
        error = translate_error(exc, "open the store", where, conninfo=conninfo)
        texts += [str(error), error.public or ""]
    text = "\n".join(texts)
    pieces = {password, typed, *re.split(r"[@/?#:,&=]", password)}
    for piece in pieces:
        if any(c.isalnum() for c in piece):  # (a text's own punctuation is no password's)
            assert not _standalone(piece, text), (url, piece, text)
    if encoded or not set(password) & set("@/%?#"):  # the URL reads as it was meant
        assert f"PostgreSQL database {db} at {host}:5432" in where, (url, where)


def test_an_at_sign_in_a_query_value_masks_nothing_of_the_host_or_the_database() -> None:
    """``application_name=a@b`` made every piece between the password and that ``@`` (the
    host, the database) a piece of the password: the whole target was masked."""
    url = "postgresql://u:pw@db.internal:5432/app?application_name=ci@runner"
    said = translate_error(
        psycopg.OperationalError('failed to resolve host "db.internal": Name not known'),
        "open the store",
        describe_target(url),
        conninfo=url,
    )
    assert str(said).startswith(
        "cannot open the store: PostgreSQL database app at db.internal:5432 is unreachable"
    ), str(said)
    assert 'resolve host "db.internal"' in str(said)


@pytest.mark.parametrize(
    "url", ["postgresql://u:%87pw@127.0.0.1:5432/test", "postgresql://u@h/d%C3"]
)
def test_a_url_whose_escapes_are_not_utf8_is_a_usage_error_not_a_traceback(url: str) -> None:
    """libpq reads ``%87`` as a byte that psycopg cannot decode: its ``UnicodeDecodeError`` came
    out of ``connect`` as a traceback (the CLI's ``runs --db`` printed one). Refused before any
    connection is tried, naming the cause and no piece of the URL."""
    from thoughtgate.store.pg_pool import connect

    with pytest.raises(UsageError) as refused:
        asyncio.run(connect(url, application_name="thoughtgate:test"))
    assert "not UTF-8" in str(refused.value)
    assert "pw" not in str(refused.value)


_SPECIALS = "".join(chr(c) for c in range(0x20, 0x7F) if not chr(c).isalnum())
"""Every printable ASCII character that is not a letter or a digit, the space included."""

_ANY_PASSWORD = st.text(alphabet=_SPECIALS + "XYZ789", min_size=1, max_size=16)

_CUTS = re.compile(r"[@/?#:,&=%\s'\\]")
"""Where a URL's or a key/value string's parse may cut a password: the pieces between them are
what an error may quote of it."""


def _keyword_value(password: str, quoted: bool) -> str:
    """``password`` as a key/value string holds it: quoted with its ``'`` and ``\\`` escaped, as
    libpq's rules say, or typed bare (a space or a quote in it then breaks the string)."""
    if not quoted:
        return password
    escaped = password.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"


@settings(max_examples=500, deadline=None)
@example(password="X?Y", form="user info", escaped=False, schema=True)
@example(password="X#Y", form="user info", escaped=False, schema=True)
@example(password="S ek", form="key/value", escaped=False, schema=False)
@example(password="S ek=1", form="key/value", escaped=False, schema=False)
@example(password="S%zzek", form="query", escaped=False, schema=False)
@example(password="@ 7", form="user info", escaped=False, schema=False)
@given(
    password=_ANY_PASSWORD,
    form=st.sampled_from(["user info", "query", "key/value"]),
    escaped=st.booleans(),
    schema=st.booleans(),
)
def test_no_text_shows_a_password_of_any_special_characters_in_any_form(
    password: str, form: str, escaped: bool, schema: bool
) -> None:
    """A password of any printable characters, in a URL's user info or its ``?password=``, or in
    a key/value connection string, typed as its rules say or bare: no piece of it holding a
    letter or a digit stands alone in what the store says of the target or in its driver's
    errors -- libpq's parse error of a key/value string quoted one (``missing "=" after "ek"``),
    and one of a ``?password=`` its bad escape. A URL that reads as it was meant (its password
    escaped, or holding none of ``@ / %`` and no space) has its ``?schema=`` taken out: a bare ``?`` or
    ``#`` in the password hid it from ``urlsplit``, and libpq refused the URL."""
    query = "&schema=s" if schema else ""
    typed = quote(password, safe="") if escaped else password
    if form == "user info":
        url = f"postgresql://abc:{typed}@dbhost:5432/appdb{'?' + query[1:] if query else ''}"
    elif form == "query":
        url = f"postgresql://abc@dbhost:5432/appdb?password={typed}{query}"
    else:
        url = f"host=dbhost port=5432 dbname=appdb password={_keyword_value(password, escaped)}"
    conninfo, found = split_schema_param(url)
    where = describe_target(conninfo, found)
    texts = [where, describe_store(url) if "://" in url else ""]
    for exc in _driver_errors(conninfo):
        error = translate_error(exc, "open the store", where, conninfo=conninfo)
        texts += [str(error), error.public or ""]
    text = "\n".join(texts)
    for piece in {password, typed, *_CUTS.split(password)}:
        if any(c.isalnum() for c in piece):
            assert not _standalone(piece, text), (url, piece, text)
    if form == "user info" and (escaped or not set(password) & set("@/% ")):
        assert found == ("s" if schema else None), (url, conninfo)
        shown = f"PostgreSQL database appdb at dbhost:5432{', schema s' if schema else ''}"
        assert shown in where, (url, where)
