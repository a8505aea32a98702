"""Fakes and the wire-faithful emulator, shipped so users can test their agents offline too."""

from thoughtgate.testing.fake import FakeProvider, reasoning, text, tool_call

__all__ = ["FakeProvider", "reasoning", "text", "tool_call"]
