"""What a ``thoughtgate run`` subprocess loads with ``--tools support.startup_hold:TOOLS`` to
hold still at a chosen point of its start, before its run begins, so that a test can send it a
signal there without a clock (ADR 0170).

``THOUGHTGATE_TEST_HOLD``: a file; while it exists the process waits at the point that
``THOUGHTGATE_TEST_HOLD_AT`` names, after printing ``holding at POINT`` on its standard output:

- ``tools``: while its ``--tools`` are loaded (the store is open; no runtime, no run yet);
- ``provider``: while the run's provider is built, inside the run's admission (its signal
  handlers are installed; the run is not stored yet).

Each waits in the event loop's thread, as a slow import or a provider's constructor would: a
signal's handler runs once the wait is over.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from support.served import NO_TOOLS
from thoughtgate.providers import base

__all__ = ["TOOLS"]

TOOLS = NO_TOOLS
_FAKE = base.PROVIDER_MODULES["fake"]


def _hold(point: str) -> None:
    if os.environ.get("THOUGHTGATE_TEST_HOLD_AT") != point:
        return
    hold = Path(os.environ["THOUGHTGATE_TEST_HOLD"])
    sys.stdout.write(f"holding at {point}\n")
    sys.stdout.flush()
    while hold.exists():
        time.sleep(0.01)


def holding_fake(name: str, settings: Any) -> Any:
    """The fake provider, built after the hold."""
    _hold("provider")
    module_name, _, attr = _FAKE.partition(":")
    target: Any = __import__(module_name, fromlist=["_"])
    for part in attr.split("."):
        target = getattr(target, part)
    return target(name, settings)


base.PROVIDER_MODULES["fake"] = f"{__name__}:holding_fake"
_hold("tools")
