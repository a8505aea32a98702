"""Provider summaries that are also continuity data: what a reader below developer may read.

Claude's summarized thinking on Anthropic's API, OpenRouter's ``reasoning_details`` and OpenAI's
reasoning items carry a summary's words twice: as the summary, and inside the continuity data the
model needs back. With ``provider_summaries`` named, a step made by that summarizer from a part of
kind ``summary`` may quote *that* summary (ADR 0083); nothing else that sits in continuity data
may reach a viewer or a member, on any read path.

Each example runs a real runtime and agent loop over a scripted model that returns random raw,
summary, encrypted and redacted reasoning with the continuity data of one of the three shapes
(Anthropic thinking blocks, OpenRouter details, an OpenAI reasoning item) -- summaries sometimes
equal to raw text, holding raw text or an opaque string --, and narrates slices of all of it.
Summaries and raw reasoning carry markdown emphasis, inside words too (``after**noon**``), which
a summary's step drops: a step's words are compared with what it may not repeat both as written
and without those marks, and narrations copy them both ways.
Then every string a viewer and a member read (their filtered events, the SSE data, the rebuilt
thread, the run view and host metadata) is held against an oracle written from the rule, not
from the policy: no span of raw reasoning (40 characters or 8 words), no opaque string, no
continuity string other than an opted-in summary's own text inside that summary's own step, and
no summary at all without the opt-in or in a step of any other source.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from thoughtgate.access.filter import filter_events, filter_run
from thoughtgate.config import Config
from thoughtgate.engine.tools import ToolRegistry
from thoughtgate.events.narration import NARRATION_TOOL
from thoughtgate.events.pipeline import VisibleReasoningPipeline
from thoughtgate.events.policy import StepPolicy
from thoughtgate.events.summarizers import (
    Moment,
    NarrationSummarizer,
    ProviderSummariesSummarizer,
    StepDraft,
    TurnFinished,
    condense,
    shorten,
)
from thoughtgate.events.thread import rebuild
from thoughtgate.host_metadata import host_metadata
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.providers.base import TurnRequest
from thoughtgate.server.sse import encode_event
from thoughtgate.store.memory import MemoryStore
from thoughtgate.testing.fake import FakeProvider, text, tool_call
from thoughtgate.types import (
    Chunk,
    ContinuityBlock,
    ContinuityChunk,
    ReasoningDelta,
    ReasoningPart,
    Turn,
)

pytestmark = pytest.mark.unit

Shape = Literal["anthropic", "openrouter", "responses"]
Kind = Literal["raw", "summary", "redacted"]

SUMMARY_WORDS = ("comparing", "rail", "fares", "for", "the", "porto", "trip", "checking")
SUMMARY_WORDS += ("weather", "morning", "trains", "window", "seats", "route", "options", "prices")
RAW_WORDS = ("hmm", "maybe", "user", "probably", "wants", "consider", "actually", "wait")
RAW_WORDS += ("whether", "cheaper", "sneaky", "honestly", "guess", "suppose", "perhaps", "ok")
"""Two vocabularies with no word inside another, so a benign summary shares no span with raw
reasoning by chance."""


def _sentences(words: Sequence[str]) -> st.SearchStrategy[str]:
    sentence = st.lists(st.sampled_from(words), min_size=3, max_size=12).map(
        lambda ws: " ".join(ws).capitalize() + "."
    )
    return st.lists(sentence, min_size=1, max_size=3).map(" ".join)


MARKS = ("**", "__", "`")


@st.composite
def _emphasized(draw: st.DrawFn, words: Sequence[str]) -> str:
    """A text of ``words`` with emphasis marks put anywhere, inside words as well as around them."""
    body = draw(_sentences(words))
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(body)))
        body = body[:at] + draw(st.sampled_from(MARKS)) + body[at:]
    return body


def _bare(value: str) -> str:
    """``value`` as a step shows it: without its emphasis marks, none left (taking one out can
    make another of its neighbours: ``_**_``)."""
    while any(mark in value for mark in MARKS):
        for mark in MARKS:
            value = value.replace(mark, "")
    return value


OPAQUE = st.one_of(
    st.binary(min_size=24, max_size=48).map(lambda b: "Eq" + base64.b64encode(b).decode()),
    st.binary(min_size=4, max_size=8).map(lambda b: "Eq" + b.hex()),
)
"""Signatures and encrypted data: long ones a credential rule would catch anyway, and short ones
only the continuity data gives away."""


@dataclass(frozen=True)
class Part:
    kind: Kind
    text: str
    signature: str


@dataclass
class Story:
    """One model turn's reasoning, its continuity data and the narrations that follow it."""

    shape: Shape
    parts: list[Part]
    narrations: list[str] = field(default_factory=list)
    item_id: str = "rs_0123456789abcdef0123"

    def chunks(self) -> list[Chunk]:
        out: list[Chunk] = []
        for i, p in enumerate(self.parts):
            if p.kind == "redacted":
                out.append(ReasoningDelta("", reasoning_kind="encrypted", index=i, redacted=True))
            else:
                sig = p.signature if self.shape != "responses" else None
                out.append(ReasoningDelta(p.text, reasoning_kind=p.kind, index=i, signature=sig))
        out += [ContinuityChunk(b) for b in self.blocks()]
        return out

    def blocks(self) -> list[ContinuityBlock]:
        """The continuity data, shaped as each API sends it back."""
        if self.shape == "anthropic":
            return [
                ContinuityBlock("anthropic.redacted_thinking", {"type": "redacted_thinking",
                                                                "data": p.signature})
                if p.kind == "redacted"
                else ContinuityBlock("anthropic.thinking", {"type": "thinking", "thinking": p.text,
                                                            "signature": p.signature})
                for p in self.parts
            ]  # fmt: skip
        if self.shape == "openrouter":
            details = [_detail(i, p) for i, p in enumerate(self.parts)]
            return [ContinuityBlock("openrouter.reasoning_details", {"reasoning_details": details})]
        item = {
            "type": "reasoning",
            "id": self.item_id,
            "summary": [{"type": "summary_text", "text": p.text} for p in self.parts
                        if p.kind == "summary"],
            "encrypted_content": "".join(p.signature for p in self.parts),
        }  # fmt: skip
        return [ContinuityBlock("openai.reasoning_item", item)]

    def opaque(self) -> list[str]:
        """Strings nobody below developer may read whole: signatures, encrypted data, ids, and
        every continuity string (a summary's own text is the one exception, decided below)."""
        leaves = [leaf for b in self.blocks() for leaf in _leaves(b.data, skip=_WIRE_NAMES)]
        signed = [p.signature for p in self.parts] if self.shape != "responses" else []
        return [*leaves, *signed]


def _detail(index: int, part: Part) -> dict[str, Any]:
    if part.kind == "redacted":
        return {"type": "reasoning.encrypted", "data": part.signature, "index": index,
                "format": "anthropic-claude-v1"}  # fmt: skip
    if part.kind == "summary":
        return {"type": "reasoning.summary", "summary": part.text, "index": index,
                "format": "openai-responses-v1"}  # fmt: skip
    return {"type": "reasoning.text", "text": part.text, "signature": part.signature,
            "index": index, "format": "anthropic-claude-v1"}  # fmt: skip


_WIRE_NAMES = frozenset({"type", "format"})
"""Keys whose values name a wire shape ("thinking", "reasoning.summary"), the same in every
response: public vocabulary, not data."""


def _leaves(value: Any, *, skip: frozenset[str] = frozenset()) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            if key not in skip:
                yield from _leaves(item, skip=skip)
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item, skip=skip)


# --------------------------------------------------------------------------- the oracle

_NON_WORD = re.compile(r"[\W_]+")
SPAN_CHARS, SPAN_WORDS, WHOLE_CHARS = 40, 8, 8


def _norm(value: str) -> str:
    return _NON_WORD.sub(" ", unicodedata.normalize("NFKC", value).casefold()).strip()


def _shares_span(shown: str, reference: str) -> bool:
    """A run of 40 characters or 8 words, after normalization, that both texts hold."""
    a, b = _norm(shown), _norm(reference)
    if any(a[i : i + SPAN_CHARS] in b for i in range(len(a) - SPAN_CHARS + 1)):
        return True
    aw, bw = a.split(), f" {' '.join(b.split())} "
    return any(
        f" {' '.join(aw[i : i + SPAN_WORDS])} " in bw for i in range(len(aw) - SPAN_WORDS + 1)
    )


def _excerpt_of(shown: str, source: str) -> bool:
    return any(f" {_norm(shown)} " in f" {_norm(form)} " for form in (source, _bare(source)))


def leaks(story: Story, opted_in: bool, reads: Iterable[str], own_steps: set[str]) -> list[str]:
    """Every string read that breaks the rule. ``own_steps`` are the step texts a reader got from
    the ``provider_summaries`` summarizer; only those may quote a summary, and only their own."""
    raw = [p.text for p in story.parts if p.kind == "raw" and p.text]
    summaries = [p.text for p in story.parts if p.kind == "summary" and p.text]
    raw_bare = {_bare(r.strip()) for r in raw}
    shown_summaries = {s.strip() for s in summaries if opted_in if _bare(s.strip()) not in raw_bare}
    shown_summaries |= {_bare(s) for s in shown_summaries}
    found = []
    for read in reads:
        quotes = read in own_steps and any(_excerpt_of(read, s) for s in shown_summaries)
        may_quote = shown_summaries if quotes else set()
        for ref in [*raw, *([] if quotes else summaries)]:
            if _shares_span(read, ref) or _shares_span(read, _bare(ref)):
                found.append(f"span of {ref!r} in {read!r}")
        for whole in (w.strip() for w in story.opaque()):
            for form in {whole, _bare(whole)} - may_quote:
                if len(form) >= WHOLE_CHARS and form in read:
                    found.append(f"{form!r} in {read!r}")
    return found


# --------------------------------------------------------------------------- one run


def _config(opted_in: bool) -> Config:
    names = ["provider_summaries", "narration", "phases"] if opted_in else ["narration", "phases"]
    return Config.from_mapping({"visible_reasoning": {"summarizers": names}})


async def _run(story: Story, opted_in: bool) -> tuple[list[Any], Any]:
    def script(request: TurnRequest, turn: int) -> Iterator[Any]:
        if turn == 0:
            yield from story.chunks()
            for n, line in enumerate(story.narrations):
                yield tool_call(NARRATION_TOOL, {"summary": line}, call_id=f"n{n}")
        yield text("Here is the plan.")

    store = MemoryStore()
    runtime = Runtime(
        store,
        _config(opted_in),
        provider_factory=lambda model: FakeProvider(script),
        tools=ToolRegistry([]),
    )
    record = await runtime.run(RunRequest("Plan the trip", model="fake:x"),
                               chain_of_thought="surface")  # fmt: skip
    assert record.status == "completed", record.error
    return await store.read(record.run_id), await store.get_run(record.run_id)


def reader_strings(events: list[Any], record: Any, role: str) -> tuple[list[str], Any]:
    """Every string this role reads on every read path, and the thread it rebuilds."""
    seen = filter_events(events, role, mode="surface")
    thread = rebuild(seen)
    bodies: list[Any] = [
        [e.to_dict() for e in seen],
        [json.loads(encode_event(e)["data"]) for e in seen],
        thread.to_dict(),
        filter_run(record, role).to_json(),
        host_metadata(record, role).to_json(),
    ]
    return list(_leaves(json.loads(json.dumps(bodies, default=str)))), thread


# --------------------------------------------------------------------------- strategies

SHAPES: tuple[Shape, ...] = ("anthropic", "openrouter", "responses")


@st.composite
def stories(draw: st.DrawFn) -> Story:
    """Random reasoning, with the adversarial cases on purpose: a summary equal to raw text,
    holding raw text or an opaque string; narrations that copy slices of any of it."""
    shape = draw(st.sampled_from(SHAPES))
    mixed = _emphasized(SUMMARY_WORDS + RAW_WORDS)
    parts: list[Part] = []
    for _ in range(draw(st.integers(1, 4))):
        kind: Kind = draw(st.sampled_from(("raw", "summary", "summary", "redacted")))
        body = "" if kind == "redacted" else draw(mixed)
        parts.append(Part(kind, body, draw(OPAQUE)))
    raws = [p.text for p in parts if p.kind == "raw"]
    for i, p in enumerate(parts):
        if p.kind != "summary":
            continue
        trick = draw(st.sampled_from(("none", "equal", "bare", "holds_raw", "holds_opaque")))
        if trick == "equal" and raws:
            parts[i] = Part("summary", draw(st.sampled_from(raws)), p.signature)
        elif trick == "bare" and raws:  # raw reasoning with its emphasis marks left out
            parts[i] = Part("summary", _bare(draw(st.sampled_from(raws))), p.signature)
        elif trick == "holds_raw" and raws:  # first, so the step (a first sentence) holds it
            parts[i] = Part("summary", f"{draw(st.sampled_from(raws))} {p.text}", p.signature)
        elif trick == "holds_opaque":  # a signature or encrypted string of this very turn
            opaque = draw(st.sampled_from([q.signature for q in parts]))
            parts[i] = Part("summary", f"{opaque} {p.text}", p.signature)
    story = Story(shape, parts)
    sources = [*story.opaque(), *(p.text for p in parts if p.text)]
    for _ in range(draw(st.integers(0, 3))):
        source = draw(st.sampled_from(sources))
        start = draw(st.integers(0, max(0, len(source) - 1)))
        end = draw(st.integers(start, len(source)))
        words = draw(st.lists(st.sampled_from(SUMMARY_WORDS), max_size=3))
        copied = draw(st.sampled_from((source, source[1:-1], source[start:end])))
        copied = draw(st.sampled_from((copied, _bare(copied))))
        # whole, all but its ends (no whole marker), a slice; with or without emphasis marks
        line = " ".join([*words, copied])
        if line.strip():
            story.narrations.append(line)
    return story


@st.composite
def benign_stories(draw: st.DrawFn) -> Story:
    """Summaries that break no rule (their own words, nothing raw or opaque in them) beside raw
    reasoning and redacted blocks; one sentence is enough, as it is for a short summary."""
    shape = draw(st.sampled_from(SHAPES))
    kinds = draw(st.lists(st.sampled_from(("raw", "summary", "redacted")), min_size=1,
                          max_size=4).filter(lambda ks: "summary" in ks))  # fmt: skip
    parts = []
    for kind in kinds:
        words = SUMMARY_WORDS if kind == "summary" else RAW_WORDS
        body = "" if kind == "redacted" else draw(_emphasized(words))
        parts.append(Part(kind, body, draw(OPAQUE)))
    return Story(shape, parts)


# --------------------------------------------------------------------------- properties

EXAMPLES = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@EXAMPLES
@given(story=stories(), opted_in=st.booleans())
@example(  # raw reasoning whose marks make another once one is out: the summary is the raw text
    story=Story("anthropic", [Part("summary", "Comparing comparing comparing.", "Eq" + "A" * 32),
                              Part("raw", "_**_Comparing comparing comparing.", "Eq" + "A" * 32)]),
    opted_in=True,
)  # fmt: skip
def test_no_raw_or_continuity_text_reaches_a_reader_below_developer(
    story: Story, opted_in: bool
) -> None:
    events, record = asyncio.run(_run(story, opted_in))
    for role in ("viewer", "member"):
        reads, thread = reader_strings(events, record, role)
        own = {s.summary for s in thread.steps if s.source == "provider_summary"}
        assert leaks(story, opted_in, reads, own) == [], (role, story)
        if not opted_in:
            assert not own
        assert thread.raw_reasoning is None and thread.reasoning_turns == ()


@EXAMPLES
@given(story=benign_stories(), opted_in=st.booleans())
@example(  # bold marks that close inside a word: no title, the summary's first sentence
    story=Story("anthropic", [Part("raw", "Hmm hmm hmm.", "Eq" + "A" * 32),
                              Part("summary", "**C__omparing comparing comparing com**paring.",
                                   "Eq" + "A" * 32)]),
    opted_in=True,
)  # fmt: skip
def test_with_the_opt_in_every_summary_gives_its_step_and_the_receipt_says_so(
    story: Story, opted_in: bool
) -> None:
    """Short or long, whatever continuity data carries it, a clean summary is shown when the
    operator named ``provider_summaries``, and only then; the receipt counts what was shown."""
    events, record = asyncio.run(_run(story, opted_in))
    reads, thread = reader_strings(events, record, "viewer")
    shown = [s.summary for s in thread.steps if s.source == "provider_summary"]
    summaries = [p.text for p in story.parts if p.kind == "summary"]
    expected = [shorten(condense(s)) for s in summaries] if opted_in else []
    assert shown == expected
    receipt = thread.receipt
    assert receipt is not None
    assert receipt.step_sources.get("provider_summary", 0) == len(expected)
    assert dict(receipt.dropped_by_reason) == {}
    opaque = story.shape == "responses" or any(p.kind == "redacted" for p in story.parts)
    assert receipt.opaque_reasoning_exists == opaque
    assert ("provider_summaries" in receipt.summarizers) == opted_in
    assert leaks(story, opted_in, reads, set(shown)) == []


# --------------------------------------------------------------------------- the rule, by example

SIG = "Eq" + "Zm9vYmFyYmF6cXV4" * 3
SUMMARY = "Weighing the morning trains against the afternoon ones for the day trip."
THINKING = ContinuityBlock("anthropic.thinking",
                           {"type": "thinking", "thinking": SUMMARY, "signature": SIG})  # fmt: skip


def test_only_the_step_cut_from_a_shown_summary_may_quote_it() -> None:
    policy = StepPolicy()
    policy.add_shown_summary(SUMMARY)
    policy.add_provider_marker(SUMMARY)  # the same words, in the thinking block sent back
    policy.add_provider_marker(SIG)
    assert policy.check(SUMMARY, quoting=SUMMARY).allowed
    assert policy.check("Weighing the morning trains", quoting=SUMMARY).allowed
    for step, quoting in (
        (SUMMARY, None),  # narration, the model summarizer, anyone else
        (SUMMARY, "Weighing the morning trains."),  # a summary nobody chose to show
        (f"{SUMMARY} Now booking.", SUMMARY),  # more than the summary says
    ):
        assert policy.check(step, quoting=quoting).reason == "provider_payload", (step, quoting)
    long_span = "So: the morning trains against the afternoon ones for the day"
    assert policy.check(long_span).reason == "raw_reasoning"  # still reasoning to the others


def test_a_summary_that_is_raw_text_or_holds_provider_data_is_refused() -> None:
    raw = "Hmm the user wants cheap"
    holds_raw = f"{raw} seats."
    holds_sig = f"Checking {SIG}"
    policy = StepPolicy()
    for summary in (SUMMARY, holds_raw, holds_sig):
        policy.add_shown_summary(summary)
        policy.add_provider_marker(summary)
    policy.add_raw_reasoning(SUMMARY)  # the same words also came back as raw reasoning
    policy.add_raw_reasoning(raw)
    policy.add_provider_marker(raw)  # ... and as a raw detail in the same continuity data
    policy.add_provider_marker(SIG)
    assert policy.check(SUMMARY, quoting=SUMMARY).reason == "provider_payload"
    assert policy.check(holds_raw, quoting=holds_raw).reason == "provider_payload"
    assert policy.check(holds_sig, quoting=holds_sig).reason == "provider_payload"


async def test_a_summary_with_emphasis_inside_a_word_gives_its_step() -> None:
    """The step drops the marks (``foo**bar**baz`` reads ``foobarbaz``): it is still the
    summary's own words, and quotes it where they are continuity data too."""
    for summary in (
        "Weighing the mor**n**ing trains against the afternoon ones for the day trip.",
        "Weighing the morning trains against the after**noon ones for the day trip.",
    ):
        pipeline = VisibleReasoningPipeline("surface", [ProviderSummariesSummarizer()])
        part = ReasoningPart(summary, reasoning_kind="summary", signature=SIG)
        thinking = ContinuityBlock(
            "anthropic.thinking", {"type": "thinking", "thinking": summary, "signature": SIG}
        )
        turn = Turn((part, thinking), provider="anthropic", model="claude-sonnet-4-5")
        events = await pipeline.turn_finished(turn)
        assert [e.payload["summary"] for e in events] == [SUMMARY], summary
        assert dict(pipeline.receipt.dropped_by_reason) == {}


RAW_EMPHASIZED = "Hmm the user proba**bly wan**ts the chea**per one bu**t hone**stly I sup**pose"


async def test_leaving_emphasis_marks_out_gets_no_raw_reasoning_past_the_policy() -> None:
    """Marks inside words break every span of the text as written; without them (as a summary's
    step shows it, or as a narration may copy it) it is still the raw reasoning."""
    policy = StepPolicy()
    policy.add_raw_reasoning(RAW_EMPHASIZED)
    policy.add_provider_marker("ok **fine** then")  # raw text sent back in continuity data
    assert policy.check(_bare(RAW_EMPHASIZED)).reason == "raw_reasoning"
    assert policy.check("So: ok fine then.").reason == "provider_payload"
    summary = f"{RAW_EMPHASIZED} and checking fares."  # a shown summary that holds it
    pipeline = VisibleReasoningPipeline("surface", [ProviderSummariesSummarizer()])
    parts = (
        ReasoningPart(RAW_EMPHASIZED, reasoning_kind="raw", signature=SIG),
        ReasoningPart(summary, reasoning_kind="summary"),
    )
    events = await pipeline.turn_finished(Turn(parts, provider="openai", model="gpt-5"))
    assert events == []
    assert dict(pipeline.receipt.dropped_by_reason) == {"raw_reasoning": 1}


class _Claims:
    """A custom summarizer that claims to quote a summary: its claim is not believed."""

    name = "claims"

    async def summarize(self, moment: Moment) -> list[StepDraft]:
        if not isinstance(moment, TurnFinished):
            return []
        return [StepDraft("step", SUMMARY, "thinking", "provider_summary", quotes=SUMMARY)]


async def test_only_the_built_in_summarizer_and_narration_never_quote_a_summary() -> None:
    pipeline = VisibleReasoningPipeline(
        "surface", [ProviderSummariesSummarizer(), _Claims(), NarrationSummarizer()]
    )
    part = ReasoningPart(SUMMARY, reasoning_kind="summary", signature=SIG)
    turn = Turn((part, THINKING), provider="anthropic", model="claude-sonnet-4-5")
    events = await pipeline.turn_finished(turn)
    events += await pipeline.narrated(SUMMARY)
    events += await pipeline.narrated("Comparing " + SUMMARY[:60])
    assert [e.payload["summary"] for e in events] == [SUMMARY]
    receipt = pipeline.receipt
    assert dict(receipt.step_sources) == {"provider_summary": 1}
    assert dict(receipt.dropped_by_reason) == {"provider_payload": 2, "raw_reasoning": 1}


async def test_without_the_opt_in_the_summary_is_reasoning_like_any_other() -> None:
    pipeline = VisibleReasoningPipeline("surface", [NarrationSummarizer()])
    part = ReasoningPart(SUMMARY, reasoning_kind="summary", signature=SIG)
    turn = Turn((part, THINKING), provider="anthropic", model="claude-sonnet-4-5")
    events = await pipeline.turn_finished(turn)
    events += await pipeline.narrated(SUMMARY)
    events += await pipeline.narrated("Comparing " + SUMMARY[:60])
    assert events == []
    assert dict(pipeline.receipt.dropped_by_reason) == {"provider_payload": 1, "raw_reasoning": 1}
