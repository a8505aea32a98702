"""Runs, tasks, worker backends and the recorder that writes their events."""

__all__: list[str] = []
