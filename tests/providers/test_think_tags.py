"""Inline <think> splitting: any chunking of a stream gives the same reasoning and answer."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thoughtgate.providers.openai_compatible import CompatParser
from thoughtgate.providers.sse import SSEDecoder, SSEMessage
from thoughtgate.providers.think_tags import (
    CLOSE_TAG,
    DELIMITER_PRESETS,
    LEADING_PAIRS,
    OPEN_TAG,
    Delimiters,
    ThinkTagSplitter,
    _held_suffix,
    make_splitter,
    split_think_tags,
)
from thoughtgate.types import TurnAccumulator

# texts built from tag fragments, whitespace and words, so tags, half tags and near-tags are common
FRAGMENTS = [
    "<think>",
    "</think>",
    "<",
    "</",
    "<th",
    "think>",
    "</thi",
    "nk>",
    "\n",
    " ",
    "a",
    "b c",
]
texts = st.lists(
    st.sampled_from(FRAGMENTS) | st.text("ab<>/\n tkhin", max_size=4), max_size=24
).map("".join)


def stream_split(text: str, cuts: list[int], **kw: Any) -> tuple[str, str]:
    splitter = ThinkTagSplitter(**kw)
    reasoning: list[str] = []
    answer: list[str] = []
    bounds = [*sorted({c for c in cuts if 0 < c < len(text)}), len(text)]
    start = 0
    for end in bounds:
        for piece in splitter.feed(text[start:end]):
            (reasoning if piece.channel == "reasoning" else answer).append(piece.text)
        start = end
    for piece in splitter.flush():
        (reasoning if piece.channel == "reasoning" else answer).append(piece.text)
    return "".join(reasoning), "".join(answer)


@settings(max_examples=400, deadline=None)
@given(text=texts, cuts=st.lists(st.integers(0, 200), max_size=30), starts=st.booleans())
def test_any_chunking_matches_the_whole_text_split(
    text: str, cuts: list[int], starts: bool
) -> None:
    expected = split_think_tags(text, starts_in_think=starts)
    assert stream_split(text, cuts, starts_in_think=starts) == expected
    assert stream_split(text, list(range(len(text) + 1)), starts_in_think=starts) == expected


@settings(max_examples=400, deadline=None)
@given(text=texts, cuts=st.lists(st.integers(0, 200), max_size=30), strip=st.booleans())
def test_leading_only_any_chunking_matches_the_whole_text_split(
    text: str, cuts: list[int], strip: bool
) -> None:
    expected = split_think_tags(text, leading_only=True, strip=strip)
    assert stream_split(text, cuts, leading_only=True, strip=strip) == expected
    one_by_one = list(range(len(text) + 1))
    assert stream_split(text, one_by_one, leading_only=True, strip=strip) == expected


@settings(max_examples=200, deadline=None)
@given(
    before=st.text(" \n", max_size=3),
    thought=texts,
    answer=texts,
    cuts=st.lists(st.integers(0, 200), max_size=20),
)
def test_leading_only_a_leading_block_never_reaches_the_answer(
    before: str, thought: str, answer: str, cuts: list[int]
) -> None:
    """A secret in a leading block stays reasoning, whatever follows and however it is cut."""
    thought = f"SECRET{thought}".replace(CLOSE_TAG, "")
    text = f"{before}{OPEN_TAG}{thought}{CLOSE_TAG}{answer}"
    reasoning, said = stream_split(text, cuts, leading_only=True)
    assert "SECRET" in reasoning and "SECRET" not in said


def test_leading_only_examples() -> None:
    split = {"leading_only": True}
    assert split_think_tags("<think>hm</think>\n\nOK", **split) == ("hm", "OK")
    assert split_think_tags("\n<think>a</think>\n<think>b</think>OK", **split) == ("ab", "\nOK")
    assert split_think_tags("Use <think>x</think> tags", **split) == (
        "",
        "Use <think>x</think> tags",
    )
    assert split_think_tags("<think>never closed", **split) == ("never closed", "")
    assert split_think_tags("OK</think>", **split) == ("", "OK</think>")


@settings(max_examples=150, deadline=None)
@given(text=texts, cuts=st.lists(st.integers(0, 200), max_size=20))
def test_unstripped_mode_loses_no_character(text: str, cuts: list[int]) -> None:
    reasoning, answer = stream_split(text, cuts, strip=False)
    assert (reasoning, answer) == split_think_tags(text, strip=False)
    # without stripping, only the tags themselves are removed
    assert len(reasoning) + len(answer) <= len(text)


def _parse(
    content_chunks: list[str], *, capture: bool = True, think_tags: Any = True
) -> tuple[str, str]:
    parser = CompatParser(
        provider="openai-compatible", model="m", capture=capture, think_tags=think_tags
    )
    acc = TurnAccumulator()
    for piece in content_chunks:
        acc.feed_all(parser.feed_event({"choices": [{"index": 0, "delta": {"content": piece}}]}))
    acc.feed_all(parser.feed([SSEMessage("message", "[DONE]")]))
    turn = acc.finish()
    return turn.reasoning_text, turn.text


@settings(max_examples=150, deadline=None)
@given(text=texts, cuts=st.lists(st.integers(0, 200), max_size=20))
def test_adapter_streaming_and_non_streaming_agree(text: str, cuts: list[int]) -> None:
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(text)}), len(text)]
    streamed = _parse([text[a:b] for a, b in itertools.pairwise(bounds)])
    parser = CompatParser(provider="openai-compatible", model="m", capture=True)
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}
    whole = TurnAccumulator().feed_all(parser.whole(body)).feed_all(parser.end()).finish()
    assert streamed == (whole.reasoning_text, whole.text)
    # hidden mode drops the reasoning but never lets it into the answer
    assert _parse([text], capture=False) == ("", whole.text)


def test_the_compatible_adapter_takes_every_mode_of_the_option() -> None:
    """ADR 0077: one ``think_tags`` option on every adapter; here ``anywhere`` stays the default
    and ``true`` / ``false`` keep their meaning."""
    inline = ["A <think>", "r</think> B"]
    assert _parse(inline) == _parse(inline, think_tags="anywhere") == ("r", "A B")
    assert _parse(inline, think_tags="leading") == ("", "A <think>r</think> B")
    assert _parse(["<thi", "nk>r</think>B"], think_tags="leading") == ("r", "B")
    assert _parse(inline, think_tags="off") == _parse(inline, think_tags=False)
    assert _parse(inline, think_tags={"m": "off", "*": "anywhere"}) == ("", "A <think>r</think> B")


def test_examples() -> None:
    assert split_think_tags("<think>\nhm\n</think>\n\nOK") == ("hm", "OK")
    assert split_think_tags("A <think>r</think> B") == ("r", "A B")
    assert split_think_tags("<think>unclosed <") == ("unclosed <", "")
    assert split_think_tags("plain </think> text") == ("", "plain </think> text")
    assert split_think_tags("mid</think>answer", starts_in_think=True) == ("mid", "answer")
    assert stream_split("<think>\nhm\n</think>\n\nOK", [3, 9, 15, 16]) == ("hm", "OK")


def test_partial_tag_is_held_back_until_decided() -> None:
    splitter = ThinkTagSplitter()
    out = splitter.feed("Hello <thi")
    assert [(p.channel, p.text) for p in out] == [("text", "Hello ")]
    out = splitter.feed("nk>deep")
    assert [(p.channel, p.text) for p in out] == [("reasoning", "deep")]
    out = splitter.feed("</thin")
    assert out == []
    out = splitter.feed("king")  # not a tag after all: the held text was reasoning
    assert [(p.channel, p.text) for p in out] == [("reasoning", "</thinking")]
    assert [(p.channel, p.text) for p in splitter.flush()] == []


@given(st.text(alphabet="<>/thinkx ", max_size=20), st.sampled_from([OPEN_TAG, CLOSE_TAG]))
def test_the_held_suffix_is_the_longest_that_can_still_become_the_tag(buf: str, tag: str) -> None:
    """The splitter holds back exactly the longest end of the text that is a proper start of
    the tag (tried here size by size, the definition); no more, or answer text waits, and no
    less, or a tag cut between two deltas is missed."""
    sizes = [n for n in range(1, min(len(buf), len(tag) - 1) + 1) if tag.startswith(buf[-n:])]
    assert _held_suffix(buf, tag) == max(sizes, default=0)


# --------------------------------------------------------------------------- other spellings (ADR 0157)

PRESETS = list(DELIMITER_PRESETS.items())


def _fragments(pair: Delimiters) -> list[str]:
    """Words, whitespace and every cut of the pair's delimiters, so half delimiters are common."""
    cuts = {tag[:n] for tag in (pair.open, pair.close) for n in range(1, len(tag))}
    cuts |= {tag[n:] for tag in (pair.open, pair.close) for n in range(1, len(tag))}
    return [*sorted(cuts), "\n", " ", "a", "b c"]


@st.composite
def spelled(draw: st.DrawFn) -> tuple[Delimiters, str, list[int], str]:
    """A preset, a text of its fragments and whole delimiters, cut points and a mode."""
    _name, pair = draw(st.sampled_from(PRESETS))
    parts = st.sampled_from([*_fragments(pair), pair.open, pair.close])
    text = "".join(draw(st.lists(parts, max_size=20)))
    cuts = draw(st.lists(st.integers(0, 200), max_size=30))
    return pair, text, cuts, draw(st.sampled_from(["leading", "anywhere", "opened"]))


def _kw(pair: Delimiters | None, mode: str) -> dict[str, Any]:
    named = pair or Delimiters(OPEN_TAG, CLOSE_TAG)
    return {
        "open_tag": named.open,
        "close_tag": named.close,
        "leading_only": mode == "leading",
        "starts_in_think": mode == "opened",
        "leading_pairs": () if pair else LEADING_PAIRS,
    }


@settings(max_examples=400, deadline=None)
@given(spelled())
def test_a_named_pair_splits_alike_however_the_text_is_cut(
    case: tuple[Delimiters, str, list[int], str],
) -> None:
    """Every preset, every mode: any chunking -- one character at a time too, ``◁`` included --
    gives what the whole text gives."""
    pair, text, cuts, mode = case
    expected = split_think_tags(text, **_kw(pair, mode))
    assert stream_split(text, cuts, **_kw(pair, mode)) == expected
    assert stream_split(text, list(range(len(text) + 1)), **_kw(pair, mode)) == expected


@settings(max_examples=400, deadline=None)
@given(spelled())
def test_unnamed_spellings_split_alike_however_the_text_is_cut(
    case: tuple[Delimiters, str, list[int], str],
) -> None:
    """No pair named: ``<think>`` as the mode says and the known spellings at the start."""
    _pair, text, cuts, mode = case
    assert stream_split(text, cuts, **_kw(None, mode)) == split_think_tags(text, **_kw(None, mode))


@settings(max_examples=300, deadline=None)
@given(
    preset=st.sampled_from(PRESETS),
    named=st.booleans(),
    mode=st.sampled_from(["leading", "anywhere"]),
    before=st.text(" \n", max_size=3),
    thought=st.lists(st.sampled_from(["a", " ", "\n", "<", "[", "/", "think", "\u25c1"])),
    answer=st.lists(st.sampled_from(["a", " ", "\n", "<", "[", "/", "think", "\u25c1", ">"])),
    cuts=st.lists(st.integers(0, 200), max_size=30),
)
def test_a_leading_block_never_reaches_the_answer_and_the_answer_comes_out_whole(
    preset: tuple[str, Delimiters],
    named: bool,
    mode: str,
    before: str,
    thought: list[str],
    answer: list[str],
    cuts: list[int],
) -> None:
    """A secret in a leading block of any known spelling stays reasoning -- the pair named, or
    none named -- and the answer after it is reproduced exactly, however it is cut."""
    _name, pair = preset
    reply = "x" + "".join(answer)  # an answer that starts with text, as the strip rule keeps it
    secret = "SECRET" + "".join(thought).replace(pair.close, "")
    text = f"{before}{pair.open}{secret}{pair.close}{reply}"
    kw = _kw(pair if named else None, mode)
    reasoning, said = stream_split(text, cuts, **kw)
    assert "SECRET" in reasoning and "SECRET" not in said
    opens_later = (pair.open if named else OPEN_TAG) in reply and mode == "anywhere"
    if not opens_later:
        assert said == before + reply


@pytest.mark.parametrize(("name", "pair"), PRESETS)
def test_an_unclosed_block_of_any_spelling_is_reasoning_to_the_end(
    name: str, pair: Delimiters
) -> None:
    for splitter in (
        make_splitter(leading_only=True, starts_in_think=False, delimiters=None),
        make_splitter(leading_only=False, starts_in_think=False, delimiters=pair),
    ):
        pieces = splitter.feed(f"{pair.open}SECRET plan") + splitter.flush()
        assert [(p.channel, p.text) for p in pieces] == [("reasoning", "SECRET plan")], name


def test_other_spellings_open_only_before_the_answer_and_naming_a_pair_narrows_to_it() -> None:
    """Mid-answer only the pair the mode reads opens a block: an answer may quote ``[THINK]``.
    Naming ``think`` restores ``<think>`` alone, for a model whose answers start with one of the
    other spellings."""
    default = _kw(None, "anywhere")
    assert split_think_tags("[THINK]plan[/THINK]OK", **default) == ("plan", "OK")
    assert split_think_tags("Use [THINK]x[/THINK] here", **default) == (
        "",
        "Use [THINK]x[/THINK] here",
    )
    assert split_think_tags("Use <think>x</think> here", **default) == ("x", "Use here")
    assert split_think_tags("<think>a</think>\n<seed:think>b</seed:think>OK", **default) == (
        "ab",
        "OK",
    )
    assert split_think_tags("<thinking>a</think>b</thinking>OK", **default) == ("a</think>b", "OK")
    only_think = _kw(DELIMITER_PRESETS["think"], "leading")
    assert split_think_tags("[THINK]x[/THINK]", **only_think) == ("", "[THINK]x[/THINK]")
    kimi = _kw(DELIMITER_PRESETS["kimi"], "anywhere")
    assert split_think_tags("<think>x</think>\u25c1think\u25b7y\u25c1/think\u25b7z", **kimi) == (
        "y",
        "<think>x</think>z",
    )


@settings(max_examples=300, deadline=None)
@given(
    named=st.sampled_from([None, *DELIMITER_PRESETS.values()]),
    pieces=st.lists(
        st.sampled_from(["a", " ", "<", "[", "\u25c1", "<seed:thin", "[THI", "<thinkin", "x>"]),
        max_size=30,
    ),
)
def test_never_more_answer_is_held_back_than_a_delimiter_less_one_character(
    named: Delimiters | None, pieces: list[str]
) -> None:
    """While nothing opens, what has come out trails what went in by at most the longest
    opener less one character: a viewer's stream is never held for a tag that may follow."""
    splitter = make_splitter(leading_only=False, starts_in_think=False, delimiters=named)
    longest = max(len(d.open) for d in ([named] if named else DELIMITER_PRESETS.values()))
    fed = said = ""
    for piece in pieces:
        fed += piece
        said += "".join(p.text for p in splitter.feed(piece))
        assert len(fed) - len(said) <= longest - 1
    said += "".join(p.text for p in splitter.flush())
    assert said == fed


def test_no_known_opener_is_the_start_of_another() -> None:
    """The splitter takes the earliest opener it finds; were one the start of another, a cut
    between them would decide for the shorter."""
    openers = [pair.open for pair in DELIMITER_PRESETS.values()]
    assert not [(a, b) for a in openers for b in openers if a != b and b.startswith(a)]


@settings(max_examples=60, deadline=None)
@given(
    preset=st.sampled_from(sorted(DELIMITER_PRESETS)),
    cuts=st.lists(st.integers(0, 400), max_size=40),
)
def test_a_delimiter_cut_inside_a_character_on_the_wire_is_still_read(
    preset: str, cuts: list[int]
) -> None:
    """The server's bytes cut anywhere -- inside ``◁`` (three UTF-8 bytes) too, and inside the
    JSON of a delta -- give the same reasoning and answer as the deltas read whole."""
    pair = DELIMITER_PRESETS[preset]
    deltas = [
        pair.open[:2],
        pair.open[2:] + "SECRET ",
        "plan" + pair.close[:3],
        pair.close[3:],
        "OK",
    ]
    events = [{"choices": [{"index": 0, "delta": {"content": d}}]} for d in deltas]
    wire = "".join(f"data: {json.dumps(e, ensure_ascii=False)}\n\n" for e in events)
    raw = (wire + "data: [DONE]\n\n").encode()
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(raw)}), len(raw)]
    parser = CompatParser(provider="openai-compatible", model="m", capture=True)
    decoder = SSEDecoder()
    acc = TurnAccumulator()
    for a, b in itertools.pairwise(bounds):
        acc.feed_all(parser.feed(decoder.feed(raw[a:b])))
    acc.feed_all(parser.feed(decoder.flush()))
    turn = acc.finish()
    assert (turn.reasoning_text, turn.text) == ("SECRET plan", "OK")
