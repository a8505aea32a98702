"""``stream_llm_turn``: run one model turn through an adapter and the shared accumulator.

Whatever happens mid-stream, the caller gets either the finished turn or a ``ProviderError`` whose
``partial`` holds everything that arrived: nothing the provider already sent is lost.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from thoughtgate.errors import ProviderError, ProviderStreamError, failure_detail, failure_text
from thoughtgate.providers.base import Provider, TurnRequest
from thoughtgate.types import Chunk, Turn, TurnAccumulator

__all__ = ["ChunkCallback", "stream_llm_turn"]

ChunkCallback = Callable[[Chunk], Awaitable[None] | None]
"""Called with each chunk; it returns what to await, or ``None`` when it had nothing to wait for
(most chunks of a long stream: no coroutine is built and awaited for them)."""


async def stream_llm_turn(
    provider: Provider, request: TurnRequest, on_chunk: ChunkCallback | None = None
) -> Turn:
    """Stream one turn, calling ``on_chunk`` for each normalized chunk as it arrives."""
    acc = TurnAccumulator(provider=provider.name, model=provider.model)
    try:
        async for chunk in provider.stream(request):
            acc.feed(chunk)
            if on_chunk is not None:
                pending = on_chunk(chunk)
                if pending is not None:
                    await pending
    except ProviderError as exc:
        if exc.partial is None:
            exc.partial = acc.partial()
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        # An adapter bug or an unmapped transport error must still not lose the partial turn.
        raise ProviderStreamError(
            f"stream failed: {failure_text(exc)}",  # public: its class only
            provider=provider.name,
            partial=acc.partial(),
            detail=failure_detail(exc),
        ) from exc
    return acc.finish()
