"""thoughtgate: run LLM agent work and govern who may see what the model thought."""

__version__ = "0.1.0"

__all__ = ["__version__"]
