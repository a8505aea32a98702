"""Event envelope, vocabulary, and the views rebuilt from events."""

from thoughtgate.events.schema import Event, EventType, NewEvent, is_run_terminal

__all__ = ["Event", "EventType", "NewEvent", "is_run_terminal"]
