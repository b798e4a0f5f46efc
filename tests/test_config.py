"""The YAML config: validated at start-up, errors name the field and its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluicegate.config import ConfigError, load_config, parse_config

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sluicegate.yaml"


def test_reference_example_is_valid() -> None:
    """The commented reference config in examples/ validates."""
    config = load_config(EXAMPLE)
    assert config.models[0].name == "llama-3.1-8b"
    assert [lane.name for lane in config.models[0].lanes] == ["interactive", "batch", "best_effort"]


def test_error_names_field_and_line() -> None:
    """A bad value is reported with its dotted path and the line it is on."""
    text = "models:\n  - name: m\n    lanes:\n      - name: a\n        max_queue: -1\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert "models[0].lanes[0].max_queue (line 5)" in str(info.value)


def test_unknown_policy_lists_choices() -> None:
    """An unknown policy names the allowed ones."""
    text = "models:\n  - name: m\n    lanes:\n      - {name: a, policy: lottery}\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert "lottery" in str(info.value)
    assert "slack" in str(info.value)


def test_unknown_key_is_rejected() -> None:
    """A misspelt key is an error, not silently ignored."""
    with pytest.raises(ConfigError, match="max_concurency"):
        parse_config("models:\n  - name: m\n    max_concurency: 4\n")


def test_tenant_lane_must_exist() -> None:
    """A tenant allowing a lane no model has is an error."""
    text = "models:\n  - name: m\ntenants:\n  - {name: t, allowed_lanes: [vip]}\n"
    with pytest.raises(ConfigError, match="vip"):
        parse_config(text)


def test_api_keys_come_from_environment() -> None:
    """Keys are read from the named variables; a missing one names the variable, not a key."""
    config = parse_config("models: [{name: m}]\ntenants: [{name: t, api_key_env: T_KEY}]\n")
    assert config.api_keys({"T_KEY": "sk-canary-123"}) == {"sk-canary-123": "t"}
    with pytest.raises(ConfigError, match="T_KEY") as info:
        config.api_keys({})
    assert "sk-canary" not in str(info.value)


def test_not_yaml() -> None:
    """Unparseable YAML is a ConfigError, not a crash."""
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse_config("models: [unclosed\n")


def test_missing_file(tmp_path: Path) -> None:
    """A missing file is reported as such."""
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.yaml")
