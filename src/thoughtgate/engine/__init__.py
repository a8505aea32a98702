"""Model turns and the agent tool loop."""

__all__: list[str] = []
