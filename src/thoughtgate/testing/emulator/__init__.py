"""A local HTTP server that speaks the four provider wire formats from scripted scenarios.

Users point an adapter (or the official SDKs) at it to test agents offline. It validates requests
as the real APIs do and answers with their real error bodies. See ``docs/emulator.md``.
"""

from thoughtgate.testing.emulator.scenario import (
    Call,
    Cut,
    Fail,
    Pause,
    Redacted,
    Say,
    Scenario,
    ScriptedTurn,
    Sleep,
    StreamError,
    Summary,
    Think,
)
from thoughtgate.testing.emulator.server import Emulator, EmulatorServer, serve_emulator

__all__ = [
    "Call",
    "Cut",
    "Emulator",
    "EmulatorServer",
    "Fail",
    "Pause",
    "Redacted",
    "Say",
    "Scenario",
    "ScriptedTurn",
    "Sleep",
    "StreamError",
    "Summary",
    "Think",
    "serve_emulator",
]
