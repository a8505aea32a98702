"""The visible-step policy: whether one candidate step may be stored and shown to any reader.

A step is dropped (only that step; the rest of the experience stays) when it contains:

``signed_link``       presigned S3/GCS URLs, Azure SAS, any URL with a signature, token or key
                      query parameter, webhook URLs whose path is the secret
``provider_payload``  raw provider wire data (``"type": "thinking"``, ``"signature"``,
                      ``reasoning_content``, ``choices``, ``data: {``, ``<think>``) or an opaque
                      marker the provider returned (signatures, encrypted items, response ids)
``credential``        API keys and tokens (``sk-``, ``sk-ant-``, ``sk-or-``, ``ghp_``,
                      ``github_pat_``, ``xox?-``, ``AKIA``, ``AIza``, ``glpat-``, ...), Bearer
                      tokens, JWTs, PEM private keys, ``password=`` / ``api_key:`` assignments,
                      credentials inside URLs, high-entropy values, and a bare password-shaped
                      word (10+ characters mixing upper and lower case, digits and a symbol)
                      even with no "password" next to it
``internal_path``     filesystem paths (``/home/...``, ``/etc/...``, ``C:\\Users``, ``~/.ssh``),
                      ``.env`` and other secret files, internal host names and private addresses
``hidden_prompt``     a fragment of the run's hidden prompts
``raw_reasoning``     a verbatim span of the run's raw reasoning
``tool_data``         tool arguments or results: a long shared span, one long argument or result
                      value, three or more short ones restated together, or any embedded JSON
                      object or dict

A provider summary the operator chose to show (``provider_summaries``) counts as raw reasoning and,
where its words are also continuity data, as a provider marker -- for every step but the one cut
from it: ``check(text, quoting=summary)`` lets an excerpt of that summary hold what the shown
summaries say, and nothing else (ADR 0083).

"Fragment" and "verbatim span" mean a shared run of at least 40 characters or 8 consecutive words
after normalization (NFKC, case-folded, punctuation and whitespace collapsed). Character spans are
indexed every 8 characters with 33-character windows, which finds every shared span of 40 or more
characters (and some of 33 to 39) while keeping the index an eighth of the reference text's size.

Text is checked both as given and URL-decoded, after NFKC normalization and removal of zero-width
characters, so full-width or percent-encoded variants are not a way around a rule. The texts spans
are looked for in, provider markers and shown summaries are also held without their markdown
emphasis marks (:func:`without_emphasis`), which a provider summary's step drops
(``summarizers.condense``): ``after**noon**`` shown as ``afternoon`` is the same words.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any, Final, Literal, TypeAlias, get_args
from urllib.parse import unquote

__all__ = [
    "OVERLAP_MIN_CHARS",
    "OVERLAP_MIN_WORDS",
    "POLICY_REASONS",
    "TOOL_SHORT_VALUES_MAX",
    "TOOL_VALUE_MIN_CHARS",
    "PolicyContext",
    "PolicyReason",
    "PolicyVerdict",
    "StepPolicy",
    "without_emphasis",
]

PolicyReason: TypeAlias = Literal[
    "credential",
    "signed_link",
    "internal_path",
    "provider_payload",
    "hidden_prompt",
    "raw_reasoning",
    "tool_data",
]
POLICY_REASONS: tuple[str, ...] = get_args(PolicyReason)

OVERLAP_MIN_CHARS: Final = 40
OVERLAP_MIN_WORDS: Final = 8
TOOL_VALUE_MIN_CHARS: Final = 20
"""A tool argument or result value at least this long (normalized) may not appear in a step."""
TOOL_SHORT_VALUES_MAX: Final = 2
"""At most this many distinct shorter values (4 to 19 characters) may appear together: "Looking
up the weather for Paris" names one argument; restating three of them reproduces the call."""
_TOOL_SHORT_MIN_CHARS: Final = 4

_CHAR_STRIDE: Final = 8
_CHAR_WINDOW: Final = OVERLAP_MIN_CHARS - _CHAR_STRIDE + 1
_MARKER_MIN_CHARS: Final = 8
_TOOL_VALUE_MAX_CHARS: Final = 2000


@dataclass(frozen=True, slots=True)
class PolicyVerdict:
    """``allowed`` or not; ``reason`` (a :data:`PolicyReason`) and ``rule`` say why not."""

    allowed: bool
    reason: PolicyReason | None = None
    _: KW_ONLY
    rule: str | None = None


_ALLOWED: Final = PolicyVerdict(True)


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """What the run holds that no step may repeat; more can be added as the run goes on."""

    _: KW_ONLY
    hidden_texts: Sequence[str] = ()
    """System prompts, developer instructions, tool descriptions: anything the reader never saw."""
    raw_reasoning_texts: Sequence[str] = ()
    tool_texts: Sequence[str] = ()
    """Tool arguments (the JSON the model produced) and results."""
    provider_markers: Sequence[str] = ()
    """Opaque provider strings (signatures, encrypted content, response ids)."""


# --------------------------------------------------------------------------- text helpers

_EMPHASIS: Final = re.compile(r"\*\*|__|`")


def without_emphasis(text: str) -> str:
    """``text`` without markdown bold marks (``**``, ``__``) and backticks. A step never shows
    them, even inside a word (``foo**bar**baz`` is shown ``foobarbaz``), so the policy holds what
    a step may not repeat in this form too.

    Until none is left: one pass of ``_**_x`` takes out the ``**`` and leaves ``__x``, a mark
    made of what was around it -- a step showing it would show a mark, and raw reasoning written
    ``_**_x`` would not be known as the same words as a summary ``x`` (found by the summary
    leak property: that summary was shown to a viewer)."""
    while True:
        bare = _EMPHASIS.sub("", text)
        if bare == text:
            return bare
        text = bare


def _forms(text: str) -> tuple[str, ...]:
    """``text`` and, when it holds emphasis marks, ``text`` without them."""
    bare = without_emphasis(text)
    return (text,) if bare == text else (text, bare)


_ZERO_WIDTH = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad"))
_NON_WORD = re.compile(r"[\W_]+")


def _clean(text: str) -> str:
    return unicodedata.normalize("NFKC", text).translate(_ZERO_WIDTH)


def _normalize(text: str) -> str:
    """Case-folded words separated by single spaces (punctuation and underscores are spaces)."""
    return _NON_WORD.sub(" ", _clean(text).casefold()).strip()


def _entropy(value: str) -> float:
    counts = Counter(value)
    total = len(value)
    return -sum(n / total * math.log2(n / total) for n in counts.values())


def _transitions(value: str) -> int:
    """How often the text switches between letters and digits (high for random tokens)."""
    kinds = [c.isdigit() for c in value if c.isalnum()]
    return sum(1 for a, b in itertools.pairwise(kinds) if a != b)


_NON_SECRET_WORDS: Final = frozenset(
    {
        "required", "optional", "hidden", "redacted", "masked", "none", "null", "empty", "unset",
        "unknown", "missing", "invalid", "incorrect", "correct", "wrong", "changed", "reset",
        "set", "ok", "valid", "expired", "present", "absent", "true", "false", "omitted",
        "placeholder", "configured", "rotated", "revoked", "needed", "provided", "stored",
    }
)  # fmt: skip


def _plausible_password(value: str) -> bool:
    bare = value.strip(".:;!?)(").lower()
    return len(bare) >= 3 and bare not in _NON_SECRET_WORDS and set(bare) != {"*"}


def _secretish(value: str) -> bool:
    bare = value.strip(".:;!?)(")
    if bare.lower() in _NON_SECRET_WORDS or len(bare) < 8:
        return False
    mixed = any(c.isupper() for c in bare) and any(c.islower() for c in bare)
    return any(c.isdigit() for c in bare) or mixed or len(bare) >= 20


def _high_entropy_value(value: str) -> bool:
    bare = value.rstrip("=")
    return (
        len(bare) >= 20
        and bare.count("/") <= 2
        and any(c.isdigit() for c in bare)
        and any(c.isalpha() for c in bare)
        and _transitions(bare) >= 4
        and _entropy(bare) >= 3.5
    )


def _random_token(value: str) -> bool:
    bare = value.rstrip("=")
    return (
        any(c.isupper() for c in bare)
        and any(c.islower() for c in bare)
        and any(c.isdigit() for c in bare)
        and _transitions(bare) >= 6
        and _entropy(bare) >= 4.0
    )


def _base64ish(value: str) -> bool:
    """Encoded bytes, not a word ("Basic infrastructure" is not an Authorization header)."""
    mixed = any(c.isupper() for c in value[1:]) and any(c.islower() for c in value)
    return any(c.isdigit() or c in "+/=" for c in value) or mixed


def _looks_typed(value: str) -> bool:
    """A password said in prose ("the password is X") must look like one, not like a word."""
    bare = value.strip(".:;!?)(")
    return _plausible_password(bare) and (
        any(not c.isalpha() for c in bare) or bare.lower() != bare
    )


_STRONG_SYMBOLS: Final = frozenset("!@#$%^&*+=?~|<>`")
"""Symbols that mark a typed secret; ``-``, ``_`` and ``.`` also join names and versions."""
_WEAK_SYMBOLS: Final = frozenset("-_.")
_TOKEN_LEAD: Final = "\"'([{<«“‘"
_TOKEN_TAIL: Final = ".,;:)]}>\"'»”’"
_EMAIL: Final = re.compile(r"[\w.+\-]+@[\w\-]+(?:\.[\w\-]+)+")
_HANDLE: Final = re.compile(r"[#@][A-Za-z][A-Za-z0-9_]*")


def _password_shaped(token: str) -> bool:
    """A bare word that looks typed as a password: 10+ characters with upper and lower case,
    a digit and a symbol. ``-``, ``_`` and ``.`` count as the symbol only in a word made of
    letters, digits and those alone that switches between letters and digits four times or more
    (``GPT-4o-mini`` or ``Python3.11`` are names, ``a1B2-c3D4`` is not). Links, e-mail addresses, hashtags and paths are left to
    their own rules."""
    bare = token.lstrip(_TOKEN_LEAD).rstrip(_TOKEN_TAIL)
    if len(bare) < 10 or "://" in bare or "/" in bare or "\\" in bare:
        return False
    if bare.lower().startswith("www.") or _EMAIL.fullmatch(bare) or _HANDLE.fullmatch(bare):
        return False
    if not (
        any(c.islower() for c in bare)
        and any(c.isupper() for c in bare)
        and any(c.isdigit() for c in bare)
    ):
        return False
    body = bare.rstrip("!?")
    if any(c in _STRONG_SYMBOLS for c in body):
        return True
    if body != bare and body.isalnum():
        return True  # Summer2024! -- but a sentence's "?" after Python3.11 is punctuation
    weak_only = all(c.isalnum() or c in _WEAK_SYMBOLS for c in body)
    return weak_only and any(c in _WEAK_SYMBOLS for c in body) and _transitions(body) >= 4


# --------------------------------------------------------------------------- pattern rules


@dataclass(frozen=True, slots=True)
class _Rule:
    reason: PolicyReason
    name: str
    pattern: re.Pattern[str]
    accept: Callable[[str], bool] | None = None
    """Optional test of the match's ``v`` group (or whole match) to cut false positives."""

    def fires(self, text: str) -> bool:
        for match in self.pattern.finditer(text):
            if self.accept is None:
                return True
            value = match.groupdict().get("v") or match.group(0)
            if self.accept(value):
                return True
        return False


def _rule(
    reason: PolicyReason, name: str, pattern: str, accept: Callable[[str], bool] | None = None
) -> _Rule:
    return _Rule(reason, name, re.compile(pattern), accept)


_PASSWORD_KEYS = r"(?:password|passwd|passphrase|pwd|db_pass(?:word)?|user_pass)"
_SECRET_KEYS = (
    r"(?:api[_\- ]?key|apikey|secret(?:[_\-]?key)?|client[_\-]?secret|access[_\-]?token|"
    r"auth[_\-]?token|refresh[_\-]?token|id[_\-]?token|session[_\-]?(?:id|token|key|secret)|"
    r"private[_\-]?key|token|x-api-key|aws_secret_access_key|authorization|credentials?|"
    r"signing[_\-]?key|webhook[_\-]?secret|account[_\-]?key|sas[_\-]?token)"
)
_ASSIGN = r"[\"']?\s*(?:[:=]|=>)\s*[\"']?"
_SIGNED_PARAMS = (
    r"(?:x-amz-signature|x-amz-credential|x-amz-security-token|x-goog-signature|"
    r"x-goog-credential|googleaccessid|signature|sig|token|access_token|id_token|refresh_token|"
    r"auth|auth_token|api_key|apikey|key|client_secret|password|secret|key-pair-id|jwt|"
    r"session_token|sv|sas|code_verifier)"
)
_PRIVATE_IPV4 = (
    r"(?:10\.\d{1,3}\.\d{1,3}\.\d{1,3}|192\.168\.\d{1,3}\.\d{1,3}|"
    r"172\.(?:1[6-9]|2\d|3[01])\.\d{1,3}\.\d{1,3}|169\.254\.\d{1,3}\.\d{1,3}|"
    r"127\.\d{1,3}\.\d{1,3}\.\d{1,3})"
)
_UNIX_ROOTS = r"(?:home|etc|var|root|usr|opt|srv|tmp|proc|sys|mnt|boot|Users|Volumes|private)"
_PROVIDER_TYPES = (
    r"(?:thinking|redacted_thinking|thinking_delta|signature_delta|text_delta|input_json_delta|"
    r"reasoning(?:\.[\w.]+)?|reasoning_text|summary_text|content_block_(?:start|delta|stop)|"
    r"message_(?:start|delta|stop)|response\.[\w.]+|tool_use|tool_result|"
    r"function_call(?:_output)?)"
)
_PROVIDER_KEYS = (
    r"(?:signature|reasoning_content|reasoning_details|reasoning|encrypted_content|"
    r"redacted_thinking|thinking|choices|delta|logprobs|finish_reason|stop_reason|usage|"
    r"content_block|tool_calls|system_fingerprint|object)"
)

_RULES: Final[tuple[_Rule, ...]] = (
    # signed links
    _rule("signed_link", "signed_query_parameter", rf"(?i)[?&;]{_SIGNED_PARAMS}="),
    _rule("signed_link", "webhook_url",
          r"(?i)(?:hooks\.slack\.com/(?:services|workflows|triggers)/|"
          r"discord(?:app)?\.com/api/webhooks/|\.webhook\.office\.com/|"
          r"outlook\.office(?:365)?\.com/webhook/)"),
    # raw provider payload
    _rule("provider_payload", "provider_block_type", rf'"type"\s*:\s*"{_PROVIDER_TYPES}"'),
    _rule("provider_payload", "provider_key", rf'"{_PROVIDER_KEYS}"\s*:'),
    _rule("provider_payload", "sse_frame",
          r"(?im)(?:^|[\s>])(?:data|event)\s*:\s*(?:[\[{]|content_block|message_|response\.)"),
    _rule("provider_payload", "reasoning_tag", r"(?i)</?(?:think|thinking|reasoning|scratchpad)>"),
    _rule("provider_payload", "provider_id",
          r"\b(?:chatcmpl-[A-Za-z0-9]{8,}|msg_[A-Za-z0-9]{16,}|resp_[0-9a-f]{16,}|"
          r"rs_[0-9a-f]{16,}|gen-\d{6,}-[A-Za-z0-9]{8,}|toolu_[A-Za-z0-9]{12,}|"
          r"call_[A-Za-z0-9]{16,})"),
    _rule("provider_payload", "tool_markup",
          r"<(?:function_calls|invoke|tool_use|tool_call|function_results|parameter)\b"),
    _rule("provider_payload", "sdk_repr",
          r"\b(?:ThinkingBlock|RedactedThinkingBlock|ChatCompletionChunk|ResponseReasoningItem)\("),
    # credentials
    _rule("credential", "openai_anthropic_openrouter_key",
          r"\bsk-(?:ant-|or-|proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{16,}"),
    _rule("credential", "stripe_key", r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}"),
    _rule("credential", "github_token", r"\bgh[pousr]_[A-Za-z0-9]{30,}"),
    _rule("credential", "github_pat", r"\bgithub_pat_[A-Za-z0-9_]{30,}"),
    _rule("credential", "slack_token", r"\bxox[abposr]-[A-Za-z0-9\-]{10,}"),
    _rule("credential", "aws_key_id",
          r"\b(?:AKIA|ASIA|AIDA|AROA|AGPA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b"),
    _rule("credential", "google_api_key", r"\bAIza[0-9A-Za-z_\-]{35}"),
    _rule("credential", "google_oauth_token", r"\bya29\.[0-9A-Za-z_\-]{20,}"),
    _rule("credential", "gitlab_token", r"\bglpat-[0-9A-Za-z_\-]{20,}"),
    _rule("credential", "huggingface_token", r"\bhf_[A-Za-z0-9]{30,}"),
    _rule("credential", "npm_token", r"\bnpm_[A-Za-z0-9]{36}\b"),
    _rule("credential", "bearer_token", r"(?i)\bbearer\s+[A-Za-z0-9._~+/\-]{16,}=*"),
    _rule("credential", "basic_auth",
          r"(?i)\bbasic\s+(?P<v>[A-Za-z0-9+/]{12,}={0,2})(?![\w+/])", _base64ish),
    _rule("credential", "jwt", r"\beyJ[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]*"),
    _rule("credential", "private_key_pem", r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"),
    _rule("credential", "private_key_der", r"\bMII[A-Za-z0-9+/]{20,}"),
    _rule("credential", "url_userinfo",
          r"(?i)\b[a-z][a-z0-9+.\-]{1,15}://[^\s/:@?#]*:[^\s/@?#]+@"),
    _rule("credential", "password_assignment",
          rf"(?i)\b{_PASSWORD_KEYS}\b{_ASSIGN}(?P<v>[^\s\"',;]{{3,}})", _plausible_password),
    _rule("credential", "password_in_prose",
          rf"(?i)\b{_PASSWORD_KEYS}\s+(?:is|was)\s+[\"']?(?P<v>[^\s\"',;]{{3,}})",
          _looks_typed),
    _rule("credential", "secret_assignment",
          rf"(?i)\b{_SECRET_KEYS}\b{_ASSIGN}(?P<v>[^\s\"',;]{{8,}})", _secretish),
    _rule("credential", "high_entropy_assignment",
          r"\b[A-Za-z_][\w.\-]{0,40}\s*[:=]\s*[\"']?(?P<v>[A-Za-z0-9+/_\-]{20,}={0,2})",
          _high_entropy_value),
    _rule("credential", "random_token",
          r"(?<![A-Za-z0-9+/_\-])[A-Za-z0-9+/_\-]{32,}={0,2}", _random_token),
    # internal paths and hosts
    _rule("internal_path", "unix_path", rf"(?<![\w.~/\-:])/{_UNIX_ROOTS}(?:/|\b)"),
    _rule("internal_path", "file_url", r"(?i)\bfile:/{2,3}\S"),
    _rule("internal_path", "windows_path",
          r"(?<![\w])[A-Za-z]:(?:\\|/(?:Users|Windows|Program|ProgramData)\b)"),
    _rule("internal_path", "windows_env",
          r"(?i)%(?:USERPROFILE|APPDATA|LOCALAPPDATA|HOMEPATH|PROGRAMDATA|TEMP)%"),
    _rule("internal_path", "unc_path", r"\\\\[\w.\-]+\\[\w$.\-]+"),
    _rule("internal_path", "home_path", r"(?<![\w])~[\w.\-]*/"),
    _rule("internal_path", "secret_file",
          r"(?<![\w./\-])\.(?:env|envrc|netrc|npmrc|pypirc|pgpass|git-credentials|dockercfg|"
          r"bash_history|zsh_history|ssh|aws|kube|gnupg|docker)(?![\w\-])"),
    _rule("internal_path", "key_file",
          r"\b(?:id_(?:rsa|dsa|ecdsa|ed25519)(?:\.pub)?|authorized_keys|known_hosts)\b"),
    # a host label, then an internal suffix that ends the name (no nested quantifiers: linear)
    _rule("internal_path", "internal_host",
          r"(?i)(?<=[a-z0-9])\.(?:internal|corp|local|lan|intranet|intra|localdomain|home\.arpa)"
          r"(?![\w\-]|\.[\w\-])"),
    _rule("internal_path", "localhost_port", r"(?i)\blocalhost:\d{2,5}\b"),
    _rule("internal_path", "private_ip", rf"(?<![\d.]){_PRIVATE_IPV4}(?!\.?\d)"),
    _rule("internal_path", "private_ipv6", r"(?i)(?<![\w:])(?:fe80|fd[0-9a-f]{2}):[0-9a-f]{0,4}:"),
    # after the paths, so a path is reported as one; one bounded scan per whitespace-free word
    _rule("credential", "password_shaped_word", r"(?<!\S)\S{10,200}", _password_shaped),
    # structured data belongs on a tool card, never in a one-sentence step
    _rule("tool_data", "embedded_json", r"[\{\[]\s*\"[^\"\n]{1,80}\"\s*:"),
    _rule("tool_data", "embedded_dict", r"\{\s*'[^'\n]{1,80}'\s*:"),
)  # fmt: skip

_WIRE_RULES: Final = tuple(r for r in _RULES if r.reason in ("signed_link", "provider_payload"))
"""Checked first so a signed URL or a provider blob is reported as such, not as the token in it."""
_CONTENT_RULES: Final = tuple(r for r in _RULES if r not in _WIRE_RULES)


# --------------------------------------------------------------------------- overlap index


class _OverlapIndex:
    """Shingles of reference texts, to find a long span a step shares with any of them.

    Texts are indexed when a step long enough to share a span is first checked, not when they
    are added: a turn's reasoning is added whole (tens of thousands of words on a long stream,
    about 2 µs of CPU per streamed delta to index), while most steps are short phase labels
    ("Writing the answer") that cannot hold a span of ``OVERLAP_MIN_CHARS`` characters or
    ``OVERLAP_MIN_WORDS`` words, so a run that shows only those never pays for the index.
    """

    __slots__ = ("_chars", "_pending", "_words")

    def __init__(self) -> None:
        self._chars: set[int] = set()
        self._words: set[int] = set()
        self._pending: list[str] = []

    def add(self, text: str) -> None:
        self._pending.append(text)

    def _index_pending(self) -> None:
        for text in itertools.chain.from_iterable(map(_forms, self._pending)):
            norm = _normalize(text)
            self._chars.update(
                hash(norm[i : i + _CHAR_WINDOW])
                for i in range(0, len(norm) - _CHAR_WINDOW + 1, _CHAR_STRIDE)
            )
            words = norm.split()
            self._words.update(
                hash(tuple(words[i : i + OVERLAP_MIN_WORDS]))
                for i in range(len(words) - OVERLAP_MIN_WORDS + 1)
            )
        self._pending.clear()

    def shares_span(self, norm: str, words: Sequence[str]) -> bool:
        if len(norm) < _CHAR_WINDOW and len(words) < OVERLAP_MIN_WORDS:
            return False  # too short to hold any shingle of either kind
        if self._pending:
            self._index_pending()
        if self._chars:
            for i in range(len(norm) - _CHAR_WINDOW + 1):
                if hash(norm[i : i + _CHAR_WINDOW]) in self._chars:
                    return True
        if self._words:
            for i in range(len(words) - OVERLAP_MIN_WORDS + 1):
                if hash(tuple(words[i : i + OVERLAP_MIN_WORDS])) in self._words:
                    return True
        return False


def _leaf_strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():  # keys are the tool's schema, not data
            yield from _leaf_strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _leaf_strings(item)


def _tool_values(text: str) -> Iterable[str]:
    """The text itself and, when it is JSON, every string inside it."""
    yield text
    stripped = text.strip()
    if stripped[:1] not in ("{", "[", '"'):
        return
    try:
        parsed = json.loads(stripped)
    except (json.JSONDecodeError, RecursionError):
        return
    yield from _leaf_strings(parsed)


# --------------------------------------------------------------------------- the policy

_ALLOWED_TEXTS: dict[str, None] = {}
"""Cleaned texts that a policy allowed, at most ``_ALLOWED_TEXTS_MAX`` of them, oldest first.

The pattern rules (``_RULES``) are pure functions of the text, so a text that passed them once
passes them again: checking it again only asks what depends on the run (its markers and
overlaps). Every run's phase steps are the same few sentences, and the rules are nearly all of a
check's cost (~0.1 ms each). Only texts a policy allowed (stored as steps, so shown to readers
anyway) are kept: never one that held a credential, a link or raw reasoning."""
_ALLOWED_TEXTS_MAX: Final = 1024


def _remember_allowed(cleaned: str) -> None:
    if len(_ALLOWED_TEXTS) >= _ALLOWED_TEXTS_MAX:
        _ALLOWED_TEXTS.pop(next(iter(_ALLOWED_TEXTS)), None)
    _ALLOWED_TEXTS[cleaned] = None


class StepPolicy:
    """Checks candidate steps against fixed detectors and against what this run holds.

    One policy per run: the runtime adds hidden prompts at the start, each turn's raw reasoning
    and opaque markers when the turn finishes, and tool arguments and results as tools run.
    """

    def __init__(self, context: PolicyContext | None = None) -> None:
        self._hidden = _OverlapIndex()
        self._raw = _OverlapIndex()
        self._tool = _OverlapIndex()
        self._tool_values: set[str] = set()
        self._tool_short_values: set[str] = set()
        self._markers: set[str] = set()
        self._summaries = _OverlapIndex()
        self._summary_texts: set[str] = set()
        self._raw_whole: set[int] = set()
        """Hashes of whole raw reasoning texts, cleaned: a marker that is one is never exempt."""
        self._raw_pending: list[str] = []
        ctx = context or PolicyContext()
        for text in ctx.hidden_texts:
            self.add_hidden_text(text)
        for text in ctx.raw_reasoning_texts:
            self.add_raw_reasoning(text)
        for text in ctx.tool_texts:
            self.add_tool_text(text)
        for marker in ctx.provider_markers:
            self.add_provider_marker(marker)

    def add_hidden_text(self, text: str) -> None:
        self._hidden.add(text)

    def add_raw_reasoning(self, text: str) -> None:
        self._raw.add(text)
        self._raw_pending.append(text)  # hashed only if a step ever quotes a summary

    def add_shown_summary(self, text: str) -> None:
        """A provider's summary that the operator chose to show (``provider_summaries``).

        It is reasoning all the same: no step may repeat it (``raw_reasoning``) and, where the
        same words are also continuity data, no step may quote that (``provider_payload``) --
        except a step checked with ``quoting=`` this very text (see :meth:`check`).
        """
        self._summaries.add(text)
        self._summary_texts.add(_clean(text).strip())

    def add_tool_text(self, text: str) -> None:
        self._tool.add(text)
        for value in _tool_values(text):
            norm = _normalize(value)
            if TOOL_VALUE_MIN_CHARS <= len(norm) <= _TOOL_VALUE_MAX_CHARS:
                self._tool_values.add(norm)
            elif _TOOL_SHORT_MIN_CHARS <= len(norm) < TOOL_VALUE_MIN_CHARS:
                self._tool_short_values.add(norm)

    def add_provider_marker(self, marker: str) -> None:
        for cleaned in _forms(_clean(marker).strip()):
            if len(cleaned) >= _MARKER_MIN_CHARS:
                self._markers.add(cleaned)

    def check(self, text: str, *, quoting: str | None = None) -> PolicyVerdict:
        """Allowed, or the first reason (in the order of the module docstring) to drop it.

        ``quoting`` names the provider summary a step was cut from (only the ``provider_summaries``
        summarizer's steps pass it, ADR 0083). When it is a summary the operator chose to show
        (:meth:`add_shown_summary`) and the step is an excerpt of it, the step may hold what the
        shown summaries say, even where their words are also continuity data -- unless the same
        words are also the text of raw reasoning. Nothing else is exempt: every other rule, every
        other opaque string (signatures, encrypted data, raw text in the same payload) and raw
        reasoning still apply.
        """
        cleaned = _clean(text)
        quotes = self._quotes_shown_summary(cleaned, quoting)
        variants = [cleaned]
        decoded = unquote(cleaned)
        if decoded != cleaned:
            variants.append(decoded)
        known = cleaned in _ALLOWED_TEXTS  # the pattern rules are known to pass it
        if not known:
            for rule in _WIRE_RULES:
                if any(rule.fires(v) for v in variants):
                    return PolicyVerdict(False, rule.reason, rule=rule.name)
        exempt = self._shown_not_raw() if quotes else frozenset[str]()
        if any(m in v for m in self._markers if m not in exempt for v in variants):
            return PolicyVerdict(False, "provider_payload", rule="provider_marker")
        if not known:
            for rule in _CONTENT_RULES:
                if any(rule.fires(v) for v in variants):
                    return PolicyVerdict(False, rule.reason, rule=rule.name)
        verdict = self._check_overlap(cleaned, quotes_summary=quotes)
        if not known and verdict.allowed:
            _remember_allowed(cleaned)
        return verdict

    def _quotes_shown_summary(self, cleaned: str, quoting: str | None) -> bool:
        """Whether the step is an excerpt of ``quoting``, a shown summary; anything undecided is
        no."""
        if quoting is None:
            return False
        source = _clean(quoting).strip()
        if source not in self._summary_texts:
            return False
        excerpt = _normalize(cleaned)
        return bool(excerpt) and any(
            f" {excerpt} " in f" {_normalize(form)} " for form in _forms(source)
        )

    def _raw_hashes(self) -> set[int]:
        for text in self._raw_pending:
            self._raw_whole.update(hash(form) for form in _forms(_clean(text).strip()))
        self._raw_pending.clear()
        return self._raw_whole

    def _shown_not_raw(self) -> frozenset[str]:
        """Shown summaries' texts, with and without emphasis marks, that are no raw reasoning's
        text too in either form (a hash that matches by chance only takes a text out: it fails
        closed)."""
        raw = self._raw_hashes()
        return frozenset(
            form
            for t in self._summary_texts
            if not any(hash(f) in raw for f in _forms(t))
            for form in _forms(t)
        )

    def _check_overlap(self, cleaned: str, *, quotes_summary: bool = False) -> PolicyVerdict:
        norm = _normalize(cleaned)
        words = norm.split()
        if self._hidden.shares_span(norm, words):
            return PolicyVerdict(False, "hidden_prompt", rule="shared_span")
        if self._raw.shares_span(norm, words):
            return PolicyVerdict(False, "raw_reasoning", rule="shared_span")
        if not quotes_summary and self._summaries.shares_span(norm, words):
            return PolicyVerdict(False, "raw_reasoning", rule="shared_span")
        if self._tool.shares_span(norm, words):
            return PolicyVerdict(False, "tool_data", rule="shared_span")
        padded = f" {norm} "
        if any(f" {value} " in padded for value in self._tool_values):
            return PolicyVerdict(False, "tool_data", rule="tool_value")
        short = sum(1 for value in self._tool_short_values if f" {value} " in padded)
        if short > TOOL_SHORT_VALUES_MAX:
            return PolicyVerdict(False, "tool_data", rule="tool_values_restated")
        return _ALLOWED
