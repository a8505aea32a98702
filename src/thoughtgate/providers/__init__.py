"""Provider adapters, one module per wire format, behind the small ``Provider`` protocol."""

from thoughtgate.providers.base import (
    Capabilities,
    Provider,
    ProviderSettings,
    ReasoningRequest,
    ToolSpec,
    TurnRequest,
    create_provider,
    split_model,
)

__all__ = [
    "Capabilities",
    "Provider",
    "ProviderSettings",
    "ReasoningRequest",
    "ToolSpec",
    "TurnRequest",
    "create_provider",
    "split_model",
]
