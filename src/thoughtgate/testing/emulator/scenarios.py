"""Built-in scenarios, used by ``thoughtgate demo``, ``thoughtgate emulate`` and the tests.

Select one with the ``x-emulator-scenario`` header or by naming it as the model.
``narrated-tool-loop`` is ``tool-loop`` with the model writing steps for the reader through the
``visible_step`` tool (offered when ``visible_reasoning.summarizers`` includes ``narration``),
beside its real tool calls in the same turn.
"""

from __future__ import annotations

from thoughtgate.testing.emulator.scenario import (
    Call,
    Cut,
    Fail,
    Redacted,
    Say,
    Scenario,
    ScriptedTurn,
    Sleep,
    StreamError,
    Summary,
    Think,
)

__all__ = ["ALWAYS", "builtin_scenarios"]

ALWAYS = 2**62
"""``Fail(times=ALWAYS)``: every attempt fails, however many a client makes."""

_COUNTRY_THOUGHT = Think(
    "I need the user's country before I can name its largest city. I will call get_country."
)
_CITY_THOUGHT = Think(
    "The tool said the country. Now I need the largest city there; I will call largest_city."
)
_GET_COUNTRY = Call("get_country", {})
_LARGEST_CITY = Call("largest_city", {"country": "Mexico"})
_COUNTRY_ANSWER = ScriptedTurn(
    (
        Think("I have both facts. Answer briefly."),
        Say("The largest city in your country is Mexico City."),
    )
)


def _narrate(summary: str) -> Call:
    """A call of the built-in narration tool (``visible_step``)."""
    return Call("visible_step", {"summary": summary})


def builtin_scenarios() -> dict[str, Scenario]:
    scenarios = [
        Scenario(
            "think-and-answer",
            (
                ScriptedTurn(
                    (
                        Think(
                            "The user asks why the sky is blue. Rayleigh scattering: shorter "
                            "wavelengths scatter more strongly off air molecules."
                        ),
                        Say(
                            "The sky looks blue because air scatters short (blue) wavelengths "
                            "of sunlight much more than long (red) ones."
                        ),
                    )
                ),
            ),
        ),
        Scenario(
            "tool-loop",
            (
                ScriptedTurn((_COUNTRY_THOUGHT, Say("Let me look up your country."), _GET_COUNTRY)),
                ScriptedTurn((_CITY_THOUGHT, _LARGEST_CITY)),
                _COUNTRY_ANSWER,
            ),
        ),
        Scenario(
            "narrated-tool-loop",
            (
                ScriptedTurn(
                    (
                        _COUNTRY_THOUGHT,
                        _narrate("Checking your profile for your country"),
                        _GET_COUNTRY,
                    )
                ),
                ScriptedTurn(
                    (
                        _CITY_THOUGHT,
                        _narrate("Found your country in your profile."),
                        _narrate("Looking up its largest city"),
                        _LARGEST_CITY,
                    )
                ),
                _COUNTRY_ANSWER,
            ),
        ),
        Scenario(
            "smoke",
            (
                ScriptedTurn(
                    (
                        Think("A short answer, and I was offered a tool: call it."),
                        Say("Rayleigh scattering."),
                        Call("get_secret_number", {}),
                    )
                ),
                ScriptedTurn((Think("The tool said 4817."), Say("Your secret number is 4817."))),
            ),
        ),
        Scenario(
            "summary-and-answer",
            (
                ScriptedTurn(
                    (
                        Summary("**Considering scattering**\n\nComparing wavelengths."),
                        Say("Blue light scatters most."),
                    )
                ),
            ),
        ),
        Scenario(
            "redacted",
            (ScriptedTurn((Redacted("safety"), Think("Visible part."), Say("Done."))),),
        ),
        Scenario(
            "overloaded",
            (ScriptedTurn((Fail(529, "overloaded_error", "Overloaded", times=ALWAYS),)),),
        ),
        Scenario(
            "flaky",
            (
                ScriptedTurn(
                    (
                        Fail(529, "overloaded_error", "Overloaded", retry_after=0.01, times=1),
                        Think("Retried fine."),
                        Say("Recovered after one retry."),
                    )
                ),
            ),
        ),
        Scenario(
            "stream-error",
            (ScriptedTurn((Think("Halfway"), StreamError("overloaded_error", "Overloaded"))),),
        ),
        Scenario("cut", (ScriptedTurn((Think("Partial reasoning"), Say("Partial ans"), Cut())),)),
        Scenario(
            "slow",
            (ScriptedTurn((Think("Slow thought."), Sleep(0.5), Say("Slow answer."))),),
        ),
    ]
    return {s.name: s for s in scenarios}
