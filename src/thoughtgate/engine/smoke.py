"""A live capability check: prove with the user's own key what an adapter really does.

``smoke("PROVIDER:MODEL", settings)`` runs two short conversations through the normal runtime path
(``stream_llm_turn``) and reports, per capability, whether it was *proven* and why or why not:

1. a one-sentence question in ``surface`` mode: ``streaming``, ``reasoning_text``,
   ``reasoning_summary``;
2. a two-turn tool call in ``surface`` mode: ``tools`` (the model called the offered tool) and
   ``continuity`` (the provider's continuity blocks went back with the tool result and the provider
   accepted them).

3. the endpoint rule the adapter applies to this model (:mod:`thoughtgate.providers.rules`), rule
   by rule: ``rule.reasoning_params`` (the reasoning parameters the row sends were accepted),
   ``rule.hidden_switch`` (one more short request in ``hidden`` mode: accepted, and no reasoning
   billed or returned), ``rule.send_back`` (what the row sends back in a tool loop, under its
   name, was accepted), ``rule.reasoning_kind`` (the reasoning came back as the kind the row
   says).

It only uses the :class:`~thoughtgate.providers.base.Provider` protocol (and the adapter's
``rule`` attribute where it has one), so it works for every adapter and against the emulator. A
failing call does not raise: it becomes the reason the affected capabilities are not proven, and
those results are ``unreached`` -- the check could not be made, as against one the provider's
answer did not bear out (:func:`verdict`, ADR 0131). A bad ``PROVIDER:MODEL`` or a missing key
still raises the ``UsageError`` that names what to fix.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass

from thoughtgate.engine.turn import stream_llm_turn
from thoughtgate.errors import ProviderError
from thoughtgate.providers.base import (
    Provider,
    ProviderSettings,
    ReasoningRequest,
    ToolSpec,
    TurnRequest,
    create_provider,
)
from thoughtgate.providers.rules import EndpointRule
from thoughtgate.types import Message, ToolResultPart, Turn

__all__ = [
    "CAPABILITIES",
    "RULES",
    "SECRET_NUMBER",
    "SMOKE_TOOL",
    "CapabilityResult",
    "Verdict",
    "smoke",
    "verdict",
]

CAPABILITIES = ("streaming", "reasoning_text", "reasoning_summary", "tools", "continuity")
RULES = ("rule.reasoning_params", "rule.hidden_switch", "rule.send_back", "rule.reasoning_kind")
QUESTION = "In one short sentence: why is the sky blue?"
TOOL_PROMPT = "Call the get_secret_number tool, then tell me the number it returns."
SECRET_NUMBER = "4817"
SMOKE_TOOL = ToolSpec(
    "get_secret_number",
    "Returns the user's secret number. Takes no arguments.",
    {"type": "object", "properties": {}},
)


@dataclass(frozen=True, slots=True)
class CapabilityResult:
    """One capability: proven or not, why, and what the adapter claims (``Capabilities``).
    ``unreached``: not proven because a request it needed failed (the provider unreachable,
    refusing, erring): the check could not be made."""

    name: str
    proven: bool
    detail: str
    _: KW_ONLY
    claimed: bool | None = None
    unreached: bool = False

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "proven": self.proven,
            "detail": self.detail,
            "claimed": self.claimed,
            "unreached": self.unreached,
        }


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a smoke run proved, in one line (``summary``): ``ok`` only when every check it ran
    was proven; ``unreached`` when any could not be made (a request failed)."""

    ok: bool
    unreached: bool
    summary: str


def verdict(results: Sequence[CapabilityResult]) -> Verdict:
    """The one line and outcome of ``results``: every check proven, some checks not borne out by
    the provider's answers (named), or some not made at all because a request failed.

    A check that was not proven where the adapter or the endpoint row does not claim it either
    (``claimed`` is ``False``: a Claude model's reasoning is raw, so no summary; a row that says
    its model thinks unasked, so no hidden switch) agrees with what thoughtgate says of the
    model: it is named, not failed. Only a claim the provider's answers did not bear out is."""
    proven = sum(r.proven for r in results)
    head = f"smoke: {proven} of {len(results)} checks proven"
    unreached = [r.name for r in results if r.unreached]
    if unreached:
        why = "a request to the provider failed"
        return Verdict(False, True, f"{head}; {len(unreached)} could not be made ({why})")
    missing = [r.name for r in results if not r.proven and r.claimed is not False]
    unclaimed = [r.name for r in results if not r.proven and r.claimed is False]
    line = head
    if missing:
        line += f"; not proven: {', '.join(missing)}"
    if unclaimed:
        line += f"; not claimed for this model: {', '.join(unclaimed)}"
    return Verdict(not missing, False, line)


@dataclass(slots=True)
class _Seen:
    """What the checks saw, for the rule checks that follow them."""

    answer: Turn | None = None
    answer_error: str | None = None
    tool_error: str | None = None
    first: Turn | None = None
    second_error: str | None = None
    looped: bool = False


async def smoke(
    model: str, settings: ProviderSettings | None = None, *, max_tokens: int = 1024
) -> list[CapabilityResult]:
    """Run the live check against ``model`` (``"PROVIDER:MODEL"``); one result per capability,
    then one per rule of the model's endpoint row (:data:`RULES`)."""
    provider = create_provider(model, settings)
    seen = _Seen()
    try:
        results = await _answer_checks(provider, max_tokens, seen)
        results += await _tool_checks(provider, max_tokens, seen)
        rules = await _rule_checks(provider, max_tokens, seen)
    finally:
        await provider.aclose()
    claims = {
        "streaming": provider.capabilities.streaming,
        "reasoning_text": provider.capabilities.reasoning_text,
        "reasoning_summary": provider.capabilities.reasoning_summary,
        "tools": provider.capabilities.tools,
        "continuity": provider.capabilities.continuity,
    }
    return [
        CapabilityResult(
            r.name, r.proven, r.detail, claimed=claims.get(r.name), unreached=r.unreached
        )
        for r in results
    ] + rules


def _request(messages: Sequence[Message], max_tokens: int, *, tools: bool) -> TurnRequest:
    return TurnRequest(
        list(messages),
        tools=[SMOKE_TOOL] if tools else [],
        reasoning=ReasoningRequest.for_mode("surface"),
        max_tokens=max_tokens,
    )


def _failed(names: Sequence[str], why: str) -> list[CapabilityResult]:
    """Checks that could not be made: a request they needed failed (``why``)."""
    return [CapabilityResult(name, False, why, unreached=True) for name in names]


async def _answer_checks(
    provider: Provider, max_tokens: int, seen: _Seen
) -> list[CapabilityResult]:
    names = ("streaming", "reasoning_text", "reasoning_summary")
    try:
        turn = await stream_llm_turn(
            provider, _request([Message.user(QUESTION)], max_tokens, tools=False)
        )
    except ProviderError as exc:
        seen.answer_error = str(exc)
        return _failed(names, f"the request failed: {exc}")
    seen.answer = turn
    return [_streaming(turn), _reasoning(turn, summary=False), _reasoning(turn, summary=True)]


def _streaming(turn: Turn) -> CapabilityResult:
    if turn.text.strip():
        return CapabilityResult(
            "streaming", True, f"{len(turn.text)} characters of answer text streamed"
        )
    reason = turn.raw_finish_reason or turn.finish_reason
    return CapabilityResult(
        "streaming", False, f"the stream finished without answer text (finish reason {reason})"
    )


def _reasoning(turn: Turn, *, summary: bool) -> CapabilityResult:
    name = "reasoning_summary" if summary else "reasoning_text"
    readable = [p for p in turn.reasoning_parts if p.text]
    if summary:
        readable = [p for p in readable if p.reasoning_kind == "summary"]
    if readable:
        size = sum(len(p.text) for p in readable)
        kinds = ", ".join(sorted({p.reasoning_kind for p in readable}))
        return CapabilityResult(name, True, f"{size} characters of {kinds} reasoning returned")
    if summary and any(p.text for p in turn.reasoning_parts):
        return CapabilityResult(name, False, "reasoning came back as raw text, not as a summary")
    if turn.reasoning_parts or turn.continuity:
        why = "reasoning came back without readable text (redacted, encrypted or display omitted)"
    else:
        why = "no reasoning came back (the model may not reason, or skipped it for this prompt)"
    return CapabilityResult(name, False, why)


async def _tool_checks(provider: Provider, max_tokens: int, seen: _Seen) -> list[CapabilityResult]:
    history = [Message.user(TOOL_PROMPT)]
    try:
        first = await stream_llm_turn(provider, _request(history, max_tokens, tools=True))
    except ProviderError as exc:
        seen.tool_error = str(exc)
        return _failed(("tools", "continuity"), f"the tool request failed: {exc}")
    calls = [c for c in first.tool_calls if c.name == SMOKE_TOOL.name]
    if not calls:
        why = f"the model answered without calling {SMOKE_TOOL.name}"
        return [
            CapabilityResult("tools", False, why),
            CapabilityResult("continuity", False, "not tried: it needs a tool call first"),
        ]
    tools = CapabilityResult("tools", True, f"the model called {SMOKE_TOOL.name}")
    seen.first = first
    history.append(first.as_message())
    results = tuple(ToolResultPart(c.call_id, SECRET_NUMBER, name=c.name) for c in calls)
    history.append(Message("tool", results))
    try:
        second = await stream_llm_turn(provider, _request(history, max_tokens, tools=True))
    except ProviderError as exc:
        seen.second_error = str(exc)
        return [tools, *_failed(("continuity",), f"the second turn failed: {exc}")]
    seen.looped = True
    blocks = len(first.continuity)
    if not blocks:
        why = "the tool loop worked, but the provider returned no continuity blocks to carry"
        return [tools, CapabilityResult("continuity", False, why)]
    answered = (
        "and the answer used the tool result"
        if SECRET_NUMBER in second.text
        else ("(the answer did not quote the tool result)")
    )
    detail = f"{blocks} continuity block(s) sent back with the tool result and accepted, {answered}"
    return [tools, CapabilityResult("continuity", True, detail)]


# --------------------------------------------------------------------------- the endpoint rule


async def _rule_checks(provider: Provider, max_tokens: int, seen: _Seen) -> list[CapabilityResult]:
    rule: EndpointRule | None = getattr(provider, "rule", None)
    if rule is None:
        # nothing was tried, so nothing failed: an adapter without endpoint rows (the fake
        # provider) claims none of them, and the verdict names them as not claimed
        why = "this adapter has no endpoint rule"
        return [CapabilityResult(name, False, why, claimed=False) for name in RULES]
    where = f"row {rule.family!r} on server {rule.server!r}"
    return [
        _params_rule(rule, seen, where),
        await _hidden_rule(provider, rule, max_tokens, where),
        _send_back_rule(rule, seen, where),
        _kind_rule(rule, seen, where),
    ]


def _sent_params(rule: EndpointRule) -> str:
    names = list((rule.surface or {}).keys())
    if rule.format == "anthropic" and rule.thinking != "none":
        names.append(f"thinking ({rule.thinking})")
    return ", ".join(names) or "no reasoning parameter"


def _params_rule(rule: EndpointRule, seen: _Seen, where: str) -> CapabilityResult:
    name = RULES[0]
    sent = _sent_params(rule)
    if seen.answer is None:
        return _failed((name,), f"{sent} ({where}): the request failed")[0]
    return CapabilityResult(name, True, f"{sent} ({where}) accepted")


async def _hidden_rule(
    provider: Provider, rule: EndpointRule, max_tokens: int, where: str
) -> CapabilityResult:
    name = RULES[1]
    request = TurnRequest(
        [Message.user(QUESTION)],
        reasoning=ReasoningRequest.for_mode("hidden"),
        max_tokens=max_tokens,
    )
    switch = json.dumps(rule.hidden) if rule.hidden is not None else None
    try:
        turn = await stream_llm_turn(provider, request)
    except ProviderError as exc:
        sent = f"with {switch}" if switch is not None else f"(no switch in the {where})"
        return _failed((name,), f"the hidden request {sent} failed: {exc}")[0]
    tokens = turn.usage.reasoning_tokens
    if switch is None:
        why = "the model thinks unasked" if rule.thinks_unasked else "none is needed"
        detail = f"no switch in the {where} ({why}); {tokens} reasoning tokens billed"
        # a row that says its model thinks unasked claims no way to keep it from reasoning
        claimed = False if rule.thinks_unasked else None
        return CapabilityResult(
            name, not rule.thinks_unasked and not tokens, detail, claimed=claimed
        )
    if tokens:
        return CapabilityResult(
            name, False, f"{switch} accepted, but {tokens} reasoning tokens were billed"
        )
    return CapabilityResult(name, True, f"{switch} accepted; no reasoning tokens billed")


def _send_back_rule(rule: EndpointRule, seen: _Seen, where: str) -> CapabilityResult:
    name = RULES[2]
    if seen.first is None:
        if seen.tool_error is not None:
            return _failed((name,), f"not tried: the tool request failed: {seen.tool_error}")[0]
        return CapabilityResult(name, False, "not tried: it needs a tool call first")
    if not seen.looped:
        return _failed((name,), f"the second turn failed: {seen.second_error}")[0]
    if rule.send_back is None:
        return CapabilityResult(
            name, True, f"nothing sent back ({where}), and the tool loop went on"
        )
    if not seen.first.continuity:
        return CapabilityResult(
            name, False, f"{rule.send_back} would go back, but the model returned none"
        )
    return CapabilityResult(name, True, f"{rule.send_back} sent back in the tool loop and accepted")


def _kind_rule(rule: EndpointRule, seen: _Seen, where: str) -> CapabilityResult:
    name = RULES[3]
    if seen.answer is None:
        return _failed((name,), f"not tried: the request failed: {seen.answer_error}")[0]
    readable = [p for p in seen.answer.reasoning_parts if p.text]
    if not readable:
        return CapabilityResult(name, False, "no readable reasoning came back to label")
    kinds = sorted({p.reasoning_kind for p in readable})
    if kinds == [rule.reasoning_kind]:
        return CapabilityResult(name, True, f"{kinds[0]}, as the {where} says")
    return CapabilityResult(
        name, False, f"came back as {', '.join(kinds)}; the {where} says {rule.reasoning_kind}"
    )
