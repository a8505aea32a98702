"""The fake scripts the tests run as ``--model fake:NAME``, put into the registry by explicit calls.

``thoughtgate.testing.fake.FAKE_SCRIPTS`` is a production registry: importing a helper never
changes it. In the pytest process conftest's ``fake_scripts`` session fixture registers these
(and takes them out again); a ``thoughtgate`` subprocess gets them through ``--tools
support.served:...`` (see :mod:`support.served`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from support import daemon, durable, scripts, ticker, web
from thoughtgate.testing.fake import FAKE_SCRIPTS, ScriptFn

SCRIPTS: dict[str, ScriptFn] = {
    **daemon.SCRIPTS,
    **durable.SCRIPTS,
    **scripts.SCRIPTS,
    **ticker.SCRIPTS,
    **web.SCRIPTS,
}


def register() -> None:
    """Add the scripts to this process's registry for as long as it lives (a subprocess)."""
    FAKE_SCRIPTS.update(SCRIPTS)


@contextlib.contextmanager
def registered() -> Iterator[None]:
    """The scripts are in the registry inside the block, and the registry is as before after it."""
    before = dict(FAKE_SCRIPTS)
    register()
    try:
        yield
    finally:
        FAKE_SCRIPTS.clear()
        FAKE_SCRIPTS.update(before)
