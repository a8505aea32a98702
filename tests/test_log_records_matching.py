"""Which parts of a log line are an exception's words (ADRs 0104, 0111).

A record made while an exception is handled has that exception's words replaced by its summary
wherever the message quotes them. The match is by text, so it must take no more than the words
(a run id or a count that happens to hold a short exception's text is left whole), and never
less (a quote of them, however it is framed, is gone).
"""

from __future__ import annotations

import io
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from thoughtgate import log_records
from thoughtgate.errors import StoreError, failure_text

pytestmark = pytest.mark.unit

LEAK = "LOGLEAK"


def _logged_while_handling(exc: Exception, message: str, *args: object) -> str:
    """``message % args`` as logged in the ``except`` block of ``exc``."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger("thoughtgate.test.matching.inner")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    before = logging.getLogRecordFactory()
    log_records.install()
    try:
        try:
            raise exc
        except Exception:
            log.info(message, *args)
    finally:
        logging.setLogRecordFactory(before)
        log.removeHandler(handler)
    return out.getvalue().rstrip("\n")


def test_a_run_id_and_a_count_holding_the_handled_exceptions_text_are_left_whole() -> None:
    """A handled ``ValueError('123456')`` (a parse of some number) does not turn the digits of
    a run id or of a count logged in the same block into its class."""
    line = _logged_while_handling(
        ValueError("123456"), "run %s resumed after %d events", "run_0123456789", 11234567
    )
    assert line == "run run_0123456789 resumed after 11234567 events"


def test_a_quote_of_the_handled_exceptions_short_text_is_replaced() -> None:
    """Standing as its own word (``: {e}``, ``({e})``, ``'{e}'``), it is the exception's."""
    for framed in ("failed: {}", "failed ({})", "failed '{}'", "{} failed", "failed:{}."):
        said = f"{LEAK}42"
        line = _logged_while_handling(ValueError(said), framed.format(said))
        assert said not in line, line
        assert "ValueError" in line


@given(
    said=st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=6, max_size=15),
    before=st.text(alphabet="abcxyz019_", min_size=1, max_size=8),
    after=st.text(alphabet="abcxyz019_", min_size=1, max_size=8),
)
def test_a_short_text_inside_a_longer_word_is_not_the_exceptions(
    said: str, before: str, after: str
) -> None:
    """Glued to letters or digits on a side where it begins or ends with one, a text of fewer
    than 16 characters is part of another word (an id, a number, a name), not a quote."""
    token = f"{before}{said}{after}"
    line = _logged_while_handling(ValueError(said), "run %s ended", token)
    assert line == f"run {token} ended"


@given(
    said=st.text(min_size=10, max_size=60).map(lambda s: f"REASONING {s} {LEAK}"),
    before=st.text(max_size=8),
    after=st.text(max_size=8),
)
def test_a_long_text_is_replaced_wherever_it_is_quoted(said: str, before: str, after: str) -> None:
    """Fail closed: a text of 16 characters or more is no coincidence, whatever is glued to
    it."""
    line = _logged_while_handling(ValueError(said), "failed %s", f"{before}{said}{after}")
    assert said.strip() not in line


def test_a_stores_public_error_keeps_a_run_id_holding_its_drivers_short_text() -> None:
    """A run's public ``error`` (a thoughtgate error quoting the exception it was raised from,
    fail closed) is matched by the same rule: the run id stays readable."""
    try:
        try:
            raise OSError("disk42")
        except OSError as exc:
            raise StoreError("run run_disk42x could not be written: disk42") from exc
    except StoreError as error:
        text = failure_text(error)
    assert text == "run run_disk42x could not be written: OSError"
