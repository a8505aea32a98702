"""Roles, the one output filter, live-channel tickets and API keys."""

__all__: list[str] = []
