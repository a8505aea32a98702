"""The HTTP daemon: the API, the live SSE channel, and ``thoughtgate serve``."""

from thoughtgate.server.app import create_app
from thoughtgate.server.sse import encode_event

__all__ = ["create_app", "encode_event"]
