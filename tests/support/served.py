"""What a ``thoughtgate`` subprocess in the tests loads with ``--tools support.served:NAME``.

``--tools`` is the tests' only door into such a process, so this module makes the one explicit
call that registers the fake scripts there (the pytest process uses conftest's ``fake_scripts``
fixture instead; no other helper touches the registry).
"""

from __future__ import annotations

from support import fakes
from support.daemon import SERVER_TOOLS
from support.durable import NO_TOOLS
from support.durable import TOOLS as DURABLE_TOOLS

__all__ = ["DURABLE_TOOLS", "NO_TOOLS", "SERVER_TOOLS"]

fakes.register()
