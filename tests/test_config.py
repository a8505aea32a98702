"""Configuration: file discovery, environment overrides, one clear error per bad value."""

from __future__ import annotations

from pathlib import Path

import pytest

from thoughtgate.config import Config, load_config
from thoughtgate.errors import ConfigError


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
            "greater than or equal to 1",
        ),
        (
            '[access]\nlocal_role = "boss"\n',
            "access.local_role",
            "boss",
            "viewer, member, developer",
        ),
        ("[orchestration]\nmax_turn = 3\n", "orchestration.max_turn", "3", "no such key"),
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


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    write(tmp_path, "[orchestration\n")
    with pytest.raises(ConfigError, match="valid TOML"):
        load_config(environ={}, cwd=tmp_path)
    with pytest.raises(ConfigError, match="an existing TOML file"):
        load_config(tmp_path / "nope.toml", environ={})


def test_config_is_immutable() -> None:
    config = Config()
    with pytest.raises(Exception):  # noqa: B017 - pydantic frozen instance
        config.orchestration.max_turns = 2  # type: ignore[misc]
