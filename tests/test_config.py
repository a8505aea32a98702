"""Configuration: file discovery, environment overrides, one clear error per bad value."""

from __future__ import annotations

import itertools
import re
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from thoughtgate.config import PROVIDER_ENV, Config, load_config
from thoughtgate.errors import ConfigError
from thoughtgate.orchestration.runtime import provider_settings_from_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "thoughtgate.toml"
    path.write_text(text)
    return path


def test_defaults_without_a_file(tmp_path: Path) -> None:
    config = load_config(environ={}, cwd=tmp_path)
    assert config.orchestration.chain_of_thought is None
    assert config.orchestration.max_turns == 14
    assert config.access.local_role == "owner"
    assert config.visible_reasoning.summarizers == ("phases",)
    assert config.source == "defaults"


def test_file_in_current_directory_is_found(tmp_path: Path) -> None:
    write(tmp_path, '[orchestration]\nchain_of_thought = "surface"\nmax_turns = 3\n')
    config = load_config(environ={}, cwd=tmp_path)
    assert config.orchestration.chain_of_thought == "surface"
    assert config.orchestration.max_turns == 3


def test_explicit_path_and_env_path(tmp_path: Path) -> None:
    other = tmp_path / "other.toml"
    other.write_text('[access]\nlocal_role = "viewer"\n')
    assert load_config(other, environ={}).access.local_role == "viewer"
    env = {"THOUGHTGATE_CONFIG": str(other)}
    assert load_config(environ=env, cwd=tmp_path).access.local_role == "viewer"


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    write(tmp_path, '[orchestration]\nchain_of_thought = "surface"\n')
    env = {
        "THOUGHTGATE_ORCHESTRATION__CHAIN_OF_THOUGHT": "telemetry_only",
        "THOUGHTGATE_DB": "sqlite:///x.db",
        "THOUGHTGATE_VISIBLE_REASONING__SUMMARIZERS": "phases,model",
        "THOUGHTGATE_VISIBLE_REASONING__ENABLED": "false",
    }
    config = load_config(environ=env, cwd=tmp_path)
    assert config.orchestration.chain_of_thought == "telemetry_only"
    assert config.store.url == "sqlite:///x.db"
    assert config.visible_reasoning.summarizers == ("phases", "model")
    assert config.visible_reasoning.enabled is False
    assert "environment" in config.source


@pytest.mark.parametrize(
    ("text", "key", "bad", "allowed"),
    [
        (
            '[orchestration]\nchain_of_thought = "loud"\n',
            "orchestration.chain_of_thought",
            "loud",
            "'hidden', 'surface' or 'telemetry_only'",
        ),
        (
            '[orchestration]\nworker_backend = "gpu"\n',
            "orchestration.worker_backend",
            "gpu",
            "'inline' or 'provider'",
        ),
        (
            "[orchestration]\nmax_turns = 0\n",
            "orchestration.max_turns",
            "0",
            "expected a whole number from 1 to 1000",
        ),
        (
            '[access]\nlocal_role = "boss"\n',
            "access.local_role",
            "boss",
            "viewer, member, developer",
        ),
        ("[orchestration]\nmax_turn = 3\n", "orchestration.max_turn", "", "no such key"),
    ],
)
def test_bad_values_name_key_value_and_allowed(
    tmp_path: Path, text: str, key: str, bad: str, allowed: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(environ={}, cwd=tmp_path)
    message = str(info.value)
    assert key in message and bad in message and allowed in message
    assert str(path) in message
    assert info.value.key == key


def test_bad_environment_value_is_reported_too(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"orchestration\.max_turns"):
        load_config(environ={"THOUGHTGATE_ORCHESTRATION__MAX_TURNS": "many"}, cwd=tmp_path)


@pytest.mark.unit
def test_a_variable_naming_no_section_is_an_error_as_in_the_file(tmp_path: Path) -> None:
    """A typo in the section of ``THOUGHTGATE_<SECTION>__<KEY>`` was ignored without a word,
    where the same typo in the file, or in the key, stops the program. Its value may be a
    secret: it is not repeated."""
    environ = {
        "THOUGHTGATE_ORCHESTRATON__CHAIN_OF_THOUGHT": "surface",
        "THOUGHTGATE_PROVIDRES__ANTHROPIC__API_KEY": "sk-ant-secret",
        "THOUGHTGATE_DURABILITY__ENABLED": "false",  # a known one is fine
        "THOUGHTGATE_DB": "memory://",  # as are the variables without sections
    }
    with pytest.raises(ConfigError) as info:
        load_config(environ=environ, cwd=tmp_path)
    assert info.value.lines == (
        "THOUGHTGATE_ORCHESTRATON__CHAIN_OF_THOUGHT: orchestraton: no such section "
        "(check the spelling)",
        "THOUGHTGATE_PROVIDRES__ANTHROPIC__API_KEY: providres: no such section "
        "(check the spelling)",
    )
    assert "sk-ant-secret" not in str(info.value)
    known = {k: v for k, v in environ.items() if "ORCHESTRATON" not in k and "PROVIDRES" not in k}
    assert load_config(environ=known, cwd=tmp_path).durability.enabled is False


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    write(tmp_path, "[orchestration\n")
    with pytest.raises(ConfigError, match="valid TOML"):
        load_config(environ={}, cwd=tmp_path)
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "nope.toml", environ={})


@pytest.mark.unit
@pytest.mark.parametrize("port", [0, 1, 8765, 65535])
def test_a_port_the_port_flag_takes_is_taken_from_the_file_too(tmp_path: Path, port: int) -> None:
    """0 asks for a free port, as ``--port 0`` does."""
    write(tmp_path, f"[server]\nport = {port}\n")
    assert load_config(environ={}, cwd=tmp_path).server.port == port


@pytest.mark.unit
@pytest.mark.parametrize("port", [-1, 65536, 70000])
def test_a_port_out_of_range_in_the_file_is_refused_at_start(tmp_path: Path, port: int) -> None:
    """As ``--port`` refuses it: a socket would take it modulo 65536, listening elsewhere."""
    path = write(tmp_path, f"[server]\nport = {port}\n")
    with pytest.raises(ConfigError) as info:
        load_config(environ={}, cwd=tmp_path)
    assert str(info.value) == (
        f"{path}: server.port = {port}: expected a whole number from 0 to 65535"
    )


def test_config_is_immutable() -> None:
    config = Config()
    with pytest.raises(Exception):  # noqa: B017 - pydantic frozen instance
        config.orchestration.max_turns = 2  # type: ignore[misc]


# --------------------------------------------------------------------------- provider endpoints

LAYERS = ("flag", "env", "file")


@pytest.mark.parametrize("key", ["base_url", "api_key"])
@pytest.mark.parametrize(
    "present",
    [frozenset(c) for n in range(len(LAYERS) + 1) for c in itertools.combinations(LAYERS, n)],
    ids=lambda p: "+".join(sorted(p)) or "none",
)
@pytest.mark.parametrize(
    ("prefix", "section"),
    [
        ("anthropic", "anthropic"),
        ("openai", "openai"),
        ("openrouter", "openrouter"),
        ("openai-compatible", "openai_compatible"),
    ],
)
def test_flag_beats_environment_beats_file_beats_default(
    tmp_path: Path, prefix: str, section: str, key: str, present: frozenset[str]
) -> None:
    """For every provider's base URL and key: --flag > ANTHROPIC_BASE_URL etc. > the file."""
    if "file" in present:
        write(tmp_path, f'[providers.{section}]\n{key} = "from-file"\n')
    env = {PROVIDER_ENV[(section, key)]: "from-env"} if "env" in present else {}
    config = load_config(environ=env, cwd=tmp_path)
    flag = {key: "from-flag"} if "flag" in present else {}
    settings = provider_settings_from_config(config, f"{prefix}:m", **flag)
    winner = next((f"from-{layer}" for layer in LAYERS if layer in present), None)
    assert getattr(settings, key) == winner


def test_thoughtgate_variables_beat_the_providers_own(tmp_path: Path) -> None:
    env = {
        "ANTHROPIC_BASE_URL": "http://vendor-variable",
        "THOUGHTGATE_PROVIDERS__ANTHROPIC__BASE_URL": "http://thoughtgate-variable",
    }
    config = load_config(environ=env, cwd=tmp_path)
    assert config.providers.anthropic.base_url == "http://thoughtgate-variable"


def test_a_missing_value_names_what_to_set_not_none() -> None:
    message = str(ConfigError("providers.anthropic.api_key", None, "an Anthropic API key"))
    assert "= None" not in message and "None" not in message
    assert message == "providers.anthropic.api_key is not set; it needs an Anthropic API key"


@pytest.mark.unit
def test_an_idle_daemon_polls_every_two_seconds_never_faster_than_a_busy_one(
    tmp_path: Path,
) -> None:
    """ADR 0057: ``durability.idle_poll_interval_s`` defaults to 2 s, follows a slower
    ``poll_interval_s`` when left unset, and set below it is refused naming both keys."""
    assert load_config(environ={}, cwd=tmp_path).durability.idle_poll_interval_s == 2.0
    slow = {"THOUGHTGATE_DURABILITY__POLL_INTERVAL_S": "10"}
    assert load_config(environ=slow, cwd=tmp_path).durability.idle_poll_interval_s == 10.0
    write(tmp_path, "[durability]\npoll_interval_s = 5\nidle_poll_interval_s = 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(environ={}, cwd=tmp_path)
    assert "idle_poll_interval_s" in str(info.value) and "poll_interval_s (5.0)" in str(info.value)


@pytest.mark.parametrize("section", ["anthropic", "openai", "openrouter", "openai_compatible"])
def test_think_tags_reach_every_adapter_and_an_unreadable_mode_stops_the_start(
    tmp_path: Path, section: str
) -> None:
    """ADR 0077: ``[providers.NAME] think_tags`` -- one mode, or a table by model id -- is the
    adapters' ``think_tags`` option; a mode no adapter can read is refused at start, whichever
    model it is for, never taken as ``off``."""
    prefix = section.replace("_", "-")
    write(tmp_path, f'[providers.{section}]\nthink_tags = {{ "*" = "leading", "m2" = "off" }}\n')
    settings = provider_settings_from_config(load_config(environ={}, cwd=tmp_path), f"{prefix}:m")
    assert settings.extra["thoughtgate"]["think_tags"] == {"*": "leading", "m2": "off"}
    variable = {f"THOUGHTGATE_PROVIDERS__{section.upper()}__THINK_TAGS": "false"}
    assert (
        getattr(load_config(environ=variable, cwd=tmp_path).providers, section).think_tags is False
    )
    write(tmp_path, f'[providers.{section}]\nthink_tags = {{ "*" = "leading", "m2" = "never" }}\n')
    with pytest.raises(ConfigError) as info:
        load_config(environ={}, cwd=tmp_path)
    assert f"providers.{section}.think_tags" in str(info.value)


def test_a_think_tags_table_is_model_mode_pairs_in_one_variable(tmp_path: Path) -> None:
    """A table by model id in the environment: ``MODEL=MODE`` pairs, comma-separated (a
    variable's name cannot hold ``*``, ``/`` or ``-``); it beats the file's table and reaches the
    adapter as the file's would."""
    write(tmp_path, '[providers.openai]\nthink_tags = { "*" = "off" }\n')
    variable = {
        "THOUGHTGATE_PROVIDERS__OPENAI__THINK_TAGS": "*=leading, deepseek/deepseek-r1=anywhere,"
        " qwen3:32b = FALSE"
    }
    settings = provider_settings_from_config(
        load_config(environ=variable, cwd=tmp_path), "openai:deepseek/deepseek-r1"
    )
    assert settings.extra["thoughtgate"]["think_tags"] == {
        "*": "leading",
        "deepseek/deepseek-r1": "anywhere",
        "qwen3:32b": False,
    }


_MODEL_IDS = st.text(
    st.characters(codec="ascii", categories=["L", "N", "P", "S"], exclude_characters=",="),
    min_size=1,
    max_size=30,
)


@given(st.dictionaries(_MODEL_IDS, st.sampled_from(["leading", "anywhere", "off", True, False])))
def test_any_think_tags_table_written_as_pairs_reads_back_as_itself(
    table: dict[str, str | bool],
) -> None:
    written = ",".join(f"{model}={str(mode).lower()}" for model, mode in table.items())
    variable = {"THOUGHTGATE_PROVIDERS__OPENROUTER__THINK_TAGS": written} if table else {}
    assert load_config(environ=variable).providers.openrouter.think_tags == (table or None)


@pytest.mark.parametrize("section", ["anthropic", "openai", "openrouter", "openai_compatible"])
def test_think_delimiters_reach_every_adapter_from_the_file_and_the_environment(
    tmp_path: Path, section: str
) -> None:
    """ADR 0157: ``[providers.NAME] think_delimiters`` -- a preset, an ``[open, close]`` pair, or
    a table of them by model id -- is the adapters' option; in the environment one preset,
    ``MODEL=PRESET`` pairs, or JSON for a pair."""
    prefix = section.replace("_", "-")
    write(
        tmp_path,
        f'[providers.{section}]\nthink_delimiters = {{ "*" = "mistral", "m2" = ["<r>", "</r>"] }}\n',
    )
    settings = provider_settings_from_config(load_config(environ={}, cwd=tmp_path), f"{prefix}:m")
    assert settings.extra["thoughtgate"]["think_delimiters"] == {
        "*": "mistral",
        "m2": ["<r>", "</r>"],
    }
    variable = f"THOUGHTGATE_PROVIDERS__{section.upper()}__THINK_DELIMITERS"
    for written, read in [
        ("kimi", "kimi"),
        (
            "*=think, ByteDance-Seed/Seed-OSS-36B-Instruct=seed",
            {"*": "think", "ByteDance-Seed/Seed-OSS-36B-Instruct": "seed"},
        ),
        ('["<THINK>", "</THINK>"]', ["<THINK>", "</THINK>"]),
        ('{"m": ["<r>", "</r>"]}', {"m": ["<r>", "</r>"]}),
    ]:
        config = load_config(environ={variable: written}, cwd=tmp_path)
        assert getattr(config.providers, section).think_delimiters == read


@pytest.mark.parametrize(
    ("written", "said"),
    [
        ("magistral", "'magistral': expected a preset (think, thinking, mistral, seed, kimi)"),
        ("m=nope", "'m' = 'nope': expected a preset"),
        ('["<r>", "<r>"]', "expected different open and close delimiters"),
        ('["", "</r>"]', "expected a non-blank open delimiter"),
        ('["<r>", "  "]', "expected a non-blank close delimiter"),
        (f'["<r>", "{"x" * 33}"]', "expected close delimiters of at most 32 characters"),
        ('["<r>"]', "or an [open, close] pair"),
        ("[not json", "not JSON"),
    ],
)
def test_an_unusable_delimiter_pair_stops_the_start_saying_why(written: str, said: str) -> None:
    """An empty or blank delimiter would match everywhere, equal ones cannot tell where a block
    ends, a long one would hold back that much answer: each is refused at start, by name."""
    variable = "THOUGHTGATE_PROVIDERS__OPENAI_COMPATIBLE__THINK_DELIMITERS"
    with pytest.raises(ConfigError) as info:
        load_config(environ={variable: written})
    assert variable in str(info.value) and said in str(info.value)


def test_a_bad_think_tags_variable_is_a_line_per_variable_naming_what_is_wrong() -> None:
    """ADR 0076: one line per problem, naming the variable, the key and the entry at fault; a
    credential set beside it is never repeated."""
    environ = {
        "THOUGHTGATE_PROVIDERS__OPENAI__THINK_TAGS": "*=leading,my-r1=sometimes",
        "THOUGHTGATE_PROVIDERS__ANTHROPIC__THINK_TAGS": "leading,my-r1=anywhere",
        "THOUGHTGATE_PROVIDERS__OPENROUTER__THINK_TAGS": "*=off,*=leading",
        "THOUGHTGATE_PROVIDERS__OPENAI__API_KEY": "sk-SECRET-never-shown",
    }
    with pytest.raises(ConfigError) as info:
        load_config(environ=environ)
    lines = str(info.value).splitlines()
    assert sorted(lines) == [
        "THOUGHTGATE_PROVIDERS__ANTHROPIC__THINK_TAGS: providers.anthropic.think_tags = "
        "'leading,my-r1=anywhere': expected MODEL=MODE pairs, comma-separated "
        "('*=leading,my-r1=anywhere'); 'leading' names no model",
        "THOUGHTGATE_PROVIDERS__OPENAI__THINK_TAGS: providers.openai.think_tags = "
        "'*=leading,my-r1=sometimes': 'my-r1' = 'sometimes': expected leading, anywhere, opened, off "
        "(or true / false)",
        "THOUGHTGATE_PROVIDERS__OPENROUTER__THINK_TAGS: providers.openrouter.think_tags = "
        "'*=off,*=leading': model '*' is named twice",
    ]
    assert "SECRET" not in str(info.value)


REPO = Path(__file__).resolve().parents[1]


def _documented_defaults() -> dict[str, object]:
    """``section.key`` -> the default docs/configuration.md gives (``None`` for "unset"), from
    each ``## `[section]` `` table; ``[providers.NAME]`` stands for every provider's section."""
    documented: dict[str, object] = {}
    section = ""
    for line in (REPO / "docs" / "configuration.md").read_text(encoding="utf-8").splitlines():
        if heading := re.fullmatch(r"## `\[([a-z_.A-Z]+)\]`", line):
            section = heading.group(1)
        elif section and (row := re.match(r"\| `([a-z_]+)` \| ([^|]+) \|", line)):
            cell = row.group(2).strip()
            literal = re.fullmatch(r"`([^`]+)`", cell)
            assert literal or cell == "unset", f"{section}.{row.group(1)}: default {cell!r}"
            value = tomllib.loads(f"v = {literal.group(1)}")["v"] if literal else None
            documented[f"{section}.{row.group(1)}"] = value
    return documented


def _model_defaults() -> dict[str, object]:
    defaults: dict[str, object] = {}
    for name, field in Config.model_fields.items():
        if name == "source":  # where the values came from, not a key
            continue
        sections = {name: field.default}
        if name == "providers":  # one table for them all: same keys, same defaults
            sections = {"providers.NAME": field.default.anthropic}
            assert len({repr(v) for v in field.default.__dict__.values()}) == 1
            page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
            for provider in type(field.default).model_fields:
                assert f"`[providers.{provider}]`" in page, provider
        for section, model in sections.items():
            for key, sub in type(model).model_fields.items():
                value = sub.default
                defaults[f"{section}.{key}"] = list(value) if isinstance(value, tuple) else value
    return defaults


def test_the_configuration_reference_names_every_key_with_its_default() -> None:
    """A user looks a key up in docs/configuration.md: every key the config accepts is there, no
    key it refuses is, and each default is the one a run gets."""
    assert _documented_defaults() == _model_defaults()


def test_every_config_example_in_the_docs_is_accepted() -> None:
    """A reader pastes a documented thoughtgate.toml: it loads, no key refused."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    examples = [
        (page.name, block)
        for page in pages
        if "adr" not in page.parts
        for block in re.findall(r"```toml\n(.*?)```", page.read_text(encoding="utf-8"), re.S)
    ]
    assert len(examples) >= 5
    for name, block in examples:
        Config.from_mapping(tomllib.loads(block), source=name)
