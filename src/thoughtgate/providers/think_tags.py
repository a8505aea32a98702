"""Split inline ``<think>…</think>`` reasoning out of answer text, streamed or whole.

Some OpenAI-compatible servers (Groq ``reasoning_format: raw``, Fireworks, MiniMax, NIM, llama.cpp
without a reasoning parser, vLLM without ``--reasoning-parser``) put the model's chain of thought
inline in ``content``. Deltas are cut wherever the server likes, so a tag can straddle chunks at
any character: ``'e.'``, ``'\\n</think'``, ``'>{'`` was seen on the wire
(tenstorrent/tt-inference-server#4386).

:class:`ThinkTagSplitter` is the streaming state machine (``docs/providers/openai-compatible.md``, the Vercel AI
SDK ``getPotentialStartIndex`` idea): it searches only for the *next expected* tag, emits the text
before it to the current channel, and holds back a buffer suffix that could still become that tag.
At the end of the stream whatever is held goes to the current channel, so an unclosed ``<think>``
counts as reasoning (never as answer text). :func:`split_think_tags` is an independent whole-text
implementation; a property test checks that every chunking of a text agrees with it.

Rules shared by both:

* tags may appear anywhere and may repeat; each ``<think>`` opens reasoning, each ``</think>``
  closes it; a ``</think>`` outside reasoning (or ``<think>`` inside) is ordinary text;
* ``starts_in_think`` starts in reasoning, for chat templates that inject ``<think>`` into the
  prompt so the model's output begins mid-thought (Qwen3, DeepSeek-R1 templates; vLLM handles the
  same case in ``BaseThinkingReasoningParser``);
* with ``strip`` (default) the newlines templates put around reasoning are dropped: whitespace
  right after a tag and whitespace right before ``</think>``; ``"<think>\\nhm\\n</think>\\n\\nOK"``
  gives reasoning ``"hm"`` and answer ``"OK"``. Text before a ``<think>`` keeps its whitespace,
  and so does reasoning left unclosed at the end of the stream;
* with ``leading_only`` only blocks that open before any answer text count (whitespace may come
  first, and blocks may follow one another): once the answer has begun, the rest of the content
  is answer, tags included. This is the default of the adapters whose servers split reasoning out
  themselves (OpenRouter; the Responses and Messages adapters on any server but the vendor's own):
  a model that still writes ``<think>`` starts its content with it, while an answer may well quote
  the tag (ADR 0071, ADR 0077).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, TypeAlias, get_args

from thoughtgate.errors import ConfigError

__all__ = [
    "CLOSE_TAG",
    "OPEN_TAG",
    "Channel",
    "Piece",
    "ThinkTagSplitter",
    "ThinkTags",
    "check_think_tags",
    "split_think_tags",
    "splitter_for",
    "think_tags_for",
    "vendor_think_tags",
]

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"

Channel: TypeAlias = Literal["reasoning", "text"]


@dataclass(frozen=True, slots=True)
class Piece:
    """A run of characters for one channel."""

    channel: Channel
    text: str


def _held_suffix(buf: str, tag: str) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of ``tag``.

    Such a suffix starts with the tag's first character, so only the places of that character
    in the last ``len(tag) - 1`` characters are tried, earliest (longest) first: a content delta
    without ``<`` near its end costs one ``find``."""
    first = tag[0]
    end = len(buf)
    at = buf.find(first, max(0, end - len(tag) + 1))
    while at >= 0:
        if tag.startswith(buf[at:]):
            return end - at
        at = buf.find(first, at + 1)
    return 0


class ThinkTagSplitter:
    """Feed content deltas, get :class:`Piece` runs; call :meth:`flush` once at end of stream."""

    def __init__(
        self,
        *,
        starts_in_think: bool = False,
        strip: bool = True,
        open_tag: str = OPEN_TAG,
        close_tag: str = CLOSE_TAG,
        leading_only: bool = False,
    ) -> None:
        self.in_think = starts_in_think
        self.leading_only = leading_only
        self._answered = False
        """``leading_only``: answer text has been emitted, so no tag opens reasoning any more."""
        self.strip = strip
        self.open_tag = open_tag
        self.close_tag = close_tag
        self._pending = ""
        self._skip_ws = strip and starts_in_think
        self._block_empty = starts_in_think
        """Inside a reasoning block that has produced no text yet."""

    @property
    def channel(self) -> Channel:
        return "reasoning" if self.in_think else "text"

    @property
    def settled(self) -> bool:
        """``leading_only``, past the leading blocks, nothing held: every later delta is answer
        as it came, so a caller may stop feeding this splitter and pass the text on itself
        (the Messages and Responses adapters do, keeping their answer path as it was)."""
        return self._answered and not self.in_think and not self._pending

    def _emit(self, out: list[Piece], text: str) -> None:
        if self._skip_ws:
            text = text.lstrip()
            if not text:
                return
            self._skip_ws = False
        if not text:
            return
        if self.in_think:
            self._block_empty = False
        elif self.leading_only and not self._answered:
            self._answered = not text.isspace()
        if out and out[-1].channel == self.channel:
            out[-1] = Piece(self.channel, out[-1].text + text)
        else:
            out.append(Piece(self.channel, text))

    def feed(self, delta: str) -> list[Piece]:
        out: list[Piece] = []
        buf = self._pending + delta
        while True:
            if self._answered and not self.in_think:
                self._emit(out, buf)  # leading_only, past the leading blocks: all answer
                self._pending = ""
                return out
            tag = self.close_tag if self.in_think else self.open_tag
            at = buf.find(tag)
            if self.leading_only and not self.in_think and at > 0 and not buf[:at].isspace():
                at = -1  # answer text comes before this tag: it opens nothing
            if at == -1:
                keep = len(buf) - _held_suffix(buf, tag)
                if self.strip and self.in_think:
                    # trailing whitespace may turn out to precede </think>: hold it until we know
                    keep = len(buf[:keep].rstrip())
                self._emit(out, buf[:keep])
                self._pending = buf[keep:]
                return out
            segment = buf[:at]
            if self.strip and self.in_think:
                segment = segment.rstrip()
            self._emit(out, segment)
            buf = buf[at + len(tag) :]
            self.in_think = not self.in_think
            self._block_empty = self.in_think
            self._skip_ws = self.strip

    def leave_empty_block(self) -> bool:
        """Leave a reasoning block that has produced no text yet (at most whitespace is held).

        For a server whose reasoning arrives in a field of its own but that also put a bare
        ``<think>`` into ``content`` first (Together's DeepSeek-V3.1): the tag opened nothing, and
        without this the answer that follows would be read as unclosed reasoning. Text after it
        is answer text, whitespace included. Returns whether the block was left.
        """
        if not (self.in_think and self._block_empty) or self._pending.strip():
            return False
        self.in_think = False
        self._pending = ""
        self._skip_ws = False
        return True

    def flush(self) -> list[Piece]:
        """End of stream: held characters belong to the current channel (unclosed think too)."""
        out: list[Piece] = []
        self._emit(out, self._pending)
        self._pending = ""
        return out


def split_think_tags(
    text: str,
    *,
    starts_in_think: bool = False,
    strip: bool = True,
    open_tag: str = OPEN_TAG,
    close_tag: str = CLOSE_TAG,
    leading_only: bool = False,
) -> tuple[str, str]:
    """``(reasoning, answer)`` of a whole content string, by the same rules as the splitter."""
    reasoning: list[str] = []
    answer: list[str] = []
    in_think = starts_in_think
    after_tag = starts_in_think
    pos = 0
    while True:
        tag = close_tag if in_think else open_tag
        at = text.find(tag, pos)
        segment = text[pos:] if at == -1 else text[pos:at]
        if leading_only and not in_think and segment.strip():
            at, segment = -1, text[pos:]  # the answer has begun: the rest is answer
        if strip and after_tag:
            segment = segment.lstrip()
        if strip and in_think and at != -1:
            segment = segment.rstrip()
        (reasoning if in_think else answer).append(segment)
        if at == -1:
            return "".join(reasoning), "".join(answer)
        pos = at + len(tag)
        in_think = not in_think
        after_tag = True


ThinkTags: TypeAlias = Literal["leading", "anywhere", "opened", "off"]
"""How an adapter reads ``<think>`` in ``content``: ``leading`` blocks before any answer text are
reasoning (``leading_only``); ``anywhere``: every block is; ``opened``: as ``anywhere``, and the
content starts inside a block (``starts_in_think``), for a model whose chat template puts the
``<think>`` into the prompt, so that its output opens with its reasoning and only a ``</think>``
marks where the answer begins (ADR 0156); ``off``: content is all answer."""

_THINK_TAGS: tuple[str, ...] = get_args(ThinkTags)


def _mode(value: object, key: str) -> ThinkTags:
    if value is True:
        return "anywhere"
    if value is False:
        return "off"
    if isinstance(value, str) and value in _THINK_TAGS:
        return value  # type: ignore[return-value]
    raise ConfigError(key, value, "leading, anywhere, opened, off (or true / false)")


def check_think_tags(option: object) -> None:
    """Refuse (:class:`ConfigError`) a ``think_tags`` option any entry of which cannot be read,
    whichever model it is for: an adapter checks it when it is built, the configuration at
    start, so a typo for one model does not wait for that model's first run."""
    if isinstance(option, Mapping):
        for model, value in option.items():
            _mode(value, f"think_tags.{model}")
    elif option is not None:
        _mode(option, "think_tags")


def think_tags_for(option: object, model: str, default: ThinkTags) -> ThinkTags:
    """The ``think_tags`` adapter option for ``model``: one mode, or a table of modes by model
    id with ``"*"`` for the others (``{"*": "leading", "deepseek/deepseek-r1": "anywhere"}``);
    absent: ``default``. A value it cannot read is refused, never taken as ``off``."""
    if option is None:
        return default
    if isinstance(option, Mapping):
        if model in option:
            return _mode(option[model], f"think_tags.{model}")
        return _mode(option["*"], "think_tags.*") if "*" in option else default
    return _mode(option, "think_tags")


def splitter_for(mode: ThinkTags, *, first: bool = True) -> ThinkTagSplitter | None:
    """A fresh splitter for one answer part (``None`` for ``off``). ``opened`` starts inside a
    block only in the ``first`` part of a turn, before anything else the server sent in it: a
    template opens one block per generation, and a part after a thinking block or a tool call
    starts as answer."""
    if mode == "off":
        return None
    opened = mode == "opened" and first
    return ThinkTagSplitter(leading_only=mode == "leading", starts_in_think=opened)


def vendor_think_tags(option: object, model: str, *, server: str, vendor: str) -> ThinkTags:
    """The ``think_tags`` mode of an adapter whose wire format other servers speak too (OpenAI
    Responses, Anthropic Messages): ``off`` by default on the vendor's own API, which separates
    reasoning by construction, ``leading`` on any other server (vLLM, llama.cpp, a gateway, an
    unknown host), where a model without a reasoning parser writes ``<think>`` into the answer
    (ADR 0077)."""
    return think_tags_for(option, model, "off" if server == vendor else "leading")
