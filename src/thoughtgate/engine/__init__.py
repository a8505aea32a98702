"""Model turns and the agent tool loop."""
