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
  the tag (ADR 0071, ADR 0077);
* the pair is ``<think>`` / ``</think>`` unless the operator names another per model
  (``think_delimiters``: a preset of :data:`DELIMITER_PRESETS` or an ``[open, close]`` pair). With
  none named, a block that opens before any answer text in one of the other presets' spellings
  (``<thinking>``, Magistral's ``[THINK]``, Seed-OSS's ``<seed:think>``, Kimi's ``◁think▷``) is
  reasoning too, closed only by its own closer (``leading_pairs``); later in the answer only
  ``<think>`` opens a block (ADR 0157). A split held back is never longer than the longest
  opener less one character.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias, TypeVar, get_args

from thoughtgate.errors import ConfigError

__all__ = [
    "CLOSE_TAG",
    "DELIMITER_PRESETS",
    "LEADING_PAIRS",
    "MAX_DELIMITER_CHARS",
    "OPEN_TAG",
    "Channel",
    "Delimiters",
    "Piece",
    "ThinkTagSplitter",
    "ThinkTags",
    "check_think_delimiters",
    "check_think_tags",
    "make_splitter",
    "split_think_tags",
    "splitter_for",
    "think_delimiters_for",
    "think_tags_for",
    "vendor_think_tags",
]

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"

Channel: TypeAlias = Literal["reasoning", "text"]
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Delimiters:
    """The opening and closing spelling of one model's reasoning block."""

    open: str
    close: str


THINK = Delimiters(OPEN_TAG, CLOSE_TAG)

DELIMITER_PRESETS: Mapping[str, Delimiters] = {
    "think": THINK,
    "thinking": Delimiters("<thinking>", "</thinking>"),
    "mistral": Delimiters("[THINK]", "[/THINK]"),
    "seed": Delimiters("<seed:think>", "</seed:think>"),
    "kimi": Delimiters("\u25c1think\u25b7", "\u25c1/think\u25b7"),
}
"""The spellings a ``think_delimiters`` preset names, each from its model family's own parser or
template (ADR 0157): ``mistral`` is Magistral's ``[THINK]`` control token (vLLM's and
mistral-common's), ``seed`` ByteDance Seed-OSS, ``kimi`` Kimi-VL-Thinking's ``◁think▷``;
``thinking`` is what prompts ask Claude-style models to write (Anthropic's chain-of-thought
guide)."""

LEADING_PAIRS: tuple[Delimiters, ...] = tuple(d for d in DELIMITER_PRESETS.values() if d != THINK)
"""Recognised before any answer text when the operator named no pair for the model: a turn that
opens with one of these spellings is reasoning by every reading, and withholding it is the
house's default (ADR 0157). No opener is a prefix of another, so the earliest match is the one."""

MAX_DELIMITER_CHARS = 32
"""The longest delimiter an operator may name: the splitter holds back up to this many characters
less one of answer text while a split delimiter may still complete."""


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
        leading_pairs: tuple[Delimiters, ...] = (),
    ) -> None:
        self.in_think = starts_in_think
        self.leading_only = leading_only
        self._answered = False
        """Answer text has been emitted, so no leading-only opener opens reasoning any more."""
        self.strip = strip
        self.open_tag = open_tag
        self.close_tag = close_tag
        self._close = close_tag
        """The closer of the block open now: the one of the opener that opened it."""
        own = Delimiters(open_tag, close_tag)
        others = tuple((pair, True) for pair in leading_pairs if pair != own)
        self._openers_before: tuple[tuple[Delimiters, bool], ...] = ((own, leading_only), *others)
        """Before any answer text: each opener, and whether answer text before it disarms it."""
        self._openers_after: tuple[tuple[Delimiters, bool], ...] = (
            () if leading_only else ((own, False),)
        )
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
        return self.leading_only and self._answered and not self.in_think and not self._pending

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
        elif not self._answered:
            self._answered = not text.isspace()
        if out and out[-1].channel == self.channel:
            out[-1] = Piece(self.channel, out[-1].text + text)
        else:
            out.append(Piece(self.channel, text))

    def _next_open(self, buf: str) -> tuple[int, Delimiters] | None:
        """The earliest opener in ``buf`` that may open before any answer text (none disarmed
        by answer text ahead of it)."""
        found: tuple[int, Delimiters] | None = None
        for pair, leading in self._openers_before:
            at = buf.find(pair.open)
            if at == -1 or (leading and at > 0 and not buf[:at].isspace()):
                continue  # absent, or answer text comes before this leading-only opener
            if found is None or at < found[0]:
                found = (at, pair)
        return found

    def feed(self, delta: str) -> list[Piece]:
        out: list[Piece] = []
        buf = self._pending + delta
        while True:
            if self.in_think:
                at = buf.find(self._close)
                if at == -1:
                    keep = len(buf) - _held_suffix(buf, self._close)
                    if self.strip:
                        # trailing whitespace may turn out to precede the closer: hold it
                        keep = len(buf[:keep].rstrip())
                    self._emit(out, buf[:keep])
                    self._pending = buf[keep:]
                    return out
                segment = buf[:at].rstrip() if self.strip else buf[:at]
                self._emit(out, segment)
                buf = buf[at + len(self._close) :]
                self.in_think = False
                self._skip_ws = self.strip
                continue
            if self._answered:  # past the answer's start: one opener at most, as it was
                if self.leading_only:  # past the leading blocks: all answer
                    self._emit(out, buf)
                    self._pending = ""
                    return out
                at = buf.find(self.open_tag)
                if at == -1:
                    keep = len(buf) - _held_suffix(buf, self.open_tag)
                    self._emit(out, buf[:keep])
                    self._pending = buf[keep:]
                    return out
                found: tuple[int, Delimiters] | None = (at, self._openers_after[0][0])
            else:
                found = self._next_open(buf)
            if found is None:
                held = max(_held_suffix(buf, pair.open) for pair, _ in self._openers_before)
                keep = len(buf) - held
                self._emit(out, buf[:keep])
                self._pending = buf[keep:]
                return out
            at, pair = found
            self._emit(out, buf[:at])
            buf = buf[at + len(pair.open) :]
            self.in_think = True
            self._close = pair.close
            self._block_empty = True
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
    leading_pairs: tuple[Delimiters, ...] = (),
) -> tuple[str, str]:
    """``(reasoning, answer)`` of a whole content string, by the same rules as the splitter."""
    reasoning: list[str] = []
    answer: list[str] = []
    in_think = starts_in_think
    after_tag = starts_in_think
    tag = open_tag
    close = close_tag
    answered = False
    pos = 0
    while True:
        if in_think:
            at = text.find(close, pos)
        else:
            at = -1
            candidates = [] if leading_only and answered else [(open_tag, close_tag, leading_only)]
            if not answered:
                candidates += [(d.open, d.close, True) for d in leading_pairs]
            for opener, closer, leading in candidates:
                found = text.find(opener, pos)
                if found == -1 or (leading and text[pos:found].strip()):
                    continue
                if at == -1 or found < at:
                    at, tag, close = found, opener, closer
        segment = text[pos:] if at == -1 else text[pos:at]
        if strip and after_tag:
            segment = segment.lstrip()
        if strip and in_think and at != -1:
            segment = segment.rstrip()
        (reasoning if in_think else answer).append(segment)
        answered = answered or (not in_think and bool(segment.strip()))
        if at == -1:
            return "".join(reasoning), "".join(answer)
        pos = at + len(close if in_think else tag)
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


def _per_model(
    option: object, model: str, name: str, read: Callable[[object, str], _T], default: _T
) -> _T:
    """``model``'s entry of a per-model option: the whole option, or its entry in a table by
    model id, else the table's ``"*"``, else ``default``; read (or refused) by ``read``."""
    if isinstance(option, Mapping):
        if model in option:
            return read(option[model], f"{name}.{model}")
        return read(option["*"], f"{name}.*") if "*" in option else default
    return read(option, name)


def _check_per_model(option: object, name: str, read: Callable[[object, str], object]) -> None:
    if isinstance(option, Mapping):
        for model, value in option.items():
            read(value, f"{name}.{model}")
    elif option is not None:
        read(option, name)


def check_think_tags(option: object) -> None:
    """Refuse (:class:`ConfigError`) a ``think_tags`` option any entry of which cannot be read,
    whichever model it is for: an adapter checks it when it is built, the configuration at
    start, so a typo for one model does not wait for that model's first run."""
    _check_per_model(option, "think_tags", _mode)


def think_tags_for(option: object, model: str, default: ThinkTags) -> ThinkTags:
    """The ``think_tags`` adapter option for ``model``: one mode, or a table of modes by model
    id with ``"*"`` for the others (``{"*": "leading", "deepseek/deepseek-r1": "anywhere"}``);
    absent: ``default``. A value it cannot read is refused, never taken as ``off``."""
    return default if option is None else _per_model(option, model, "think_tags", _mode, default)


def splitter_for(
    mode: ThinkTags, *, first: bool = True, delimiters: Delimiters | None = None
) -> ThinkTagSplitter | None:
    """A fresh splitter for one answer part (``None`` for ``off``). ``opened`` starts inside a
    block only in the ``first`` part of a turn, before anything else the server sent in it: a
    template opens one block per generation, and a part after a thinking block or a tool call
    starts as answer. ``delimiters``: the pair the operator named for the model; ``None``:
    ``<think>``, and the other known spellings before any answer text (ADR 0157)."""
    if mode == "off":
        return None
    return make_splitter(
        leading_only=mode == "leading",
        starts_in_think=mode == "opened" and first,
        delimiters=delimiters,
    )


def make_splitter(
    *, leading_only: bool, starts_in_think: bool, delimiters: Delimiters | None
) -> ThinkTagSplitter:
    """A splitter for the named pair, or for ``<think>`` and :data:`LEADING_PAIRS` if none."""
    pair = delimiters or THINK
    return ThinkTagSplitter(
        leading_only=leading_only,
        starts_in_think=starts_in_think,
        open_tag=pair.open,
        close_tag=pair.close,
        leading_pairs=() if delimiters else LEADING_PAIRS,
    )


def vendor_think_tags(option: object, model: str, *, server: str, vendor: str) -> ThinkTags:
    """The ``think_tags`` mode of an adapter whose wire format other servers speak too (OpenAI
    Responses, Anthropic Messages): ``off`` by default on the vendor's own API, which separates
    reasoning by construction, ``leading`` on any other server (vLLM, llama.cpp, a gateway, an
    unknown host), where a model without a reasoning parser writes ``<think>`` into the answer
    (ADR 0077)."""
    return think_tags_for(option, model, "off" if server == vendor else "leading")


def _delimiters(value: object, key: str) -> Delimiters:
    """One ``think_delimiters`` entry: a preset's name or an ``[open, close]`` pair."""
    if isinstance(value, str):
        if value in DELIMITER_PRESETS:
            return DELIMITER_PRESETS[value]
        raise ConfigError(key, value, "a preset (" + ", ".join(DELIMITER_PRESETS) + ")")
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and len(value) == 2:
        opener, closer = value
        problem = _pair_problem(opener, closer)
        if problem is None:
            return Delimiters(opener, closer)
        raise ConfigError(key, value, problem)
    raise ConfigError(
        key, value, "a preset (" + ", ".join(DELIMITER_PRESETS) + ") or an [open, close] pair"
    )


def _pair_problem(opener: object, closer: object) -> str | None:
    """Why ``[opener, closer]`` cannot delimit reasoning, or ``None``: an empty or blank
    delimiter would match everywhere, equal ones cannot tell a block's end from the next one's
    start, and a long one would have the splitter hold back that much answer text."""
    for name, tag in (("open", opener), ("close", closer)):
        if not isinstance(tag, str) or not tag.strip():
            return f"a non-blank {name} delimiter"
        if len(tag) > MAX_DELIMITER_CHARS:
            return f"{name} delimiters of at most {MAX_DELIMITER_CHARS} characters"
    if opener == closer:
        return "different open and close delimiters"
    return None


def check_think_delimiters(option: object) -> None:
    """Refuse (:class:`ConfigError`) a ``think_delimiters`` option any entry of which cannot be
    read, whichever model it is for (as :func:`check_think_tags`)."""
    _check_per_model(option, "think_delimiters", _delimiters)


def think_delimiters_for(option: object, model: str) -> Delimiters | None:
    """The pair the operator named for ``model`` (``think_delimiters``: one entry, or a table by
    model id with ``"*"`` for the others), or ``None``: ``<think>`` anywhere the mode allows, and
    the other presets' spellings before any answer text (:data:`LEADING_PAIRS`, ADR 0157)."""
    if option is None:
        return None
    return _per_model(option, model, "think_delimiters", _delimiters, None)
