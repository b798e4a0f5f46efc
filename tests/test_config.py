"""The YAML config: validated at start-up, errors name the field and its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluicegate.config import ConfigError, load_config, parse_config, redacted_store

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


@pytest.mark.parametrize("store", ["sqlite", "http://:hunter2@cache:6379/0", "rediz://cache"])
def test_unknown_store_is_refused(store: str) -> None:
    """A store that is neither ``memory`` nor a Redis URL is an error naming the field and its
    line, saying what is accepted, and never echoing the value (it may hold a password)."""
    text = f'models: [{{name: m}}]\nstore: "{store}"\n'
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    message = str(info.value)
    assert "store (line 2)" in message
    assert "'redis://', 'rediss://', 'unix://'" in message
    assert store not in message


@pytest.mark.parametrize(
    "store", ["redis://:hunter2@cache:6379/0", "rediss://cache/0", "unix:///run/redis.sock"]
)
def test_redis_store_urls_are_accepted(store: str) -> None:
    """Redis (and Valkey) URLs select distributed mode, with the ``distributed:`` defaults."""
    config = parse_config(f'models: [{{name: m}}]\nstore: "{store}"\n')
    assert config.shared_store
    assert config.distributed.on_store_failure == "fail_open"
    assert config.distributed.lease_ttl_s == 5.0


@pytest.mark.parametrize(
    ("store", "says"),
    [
        ("redis://:hunter2@cache:6379/0?ssl_ca_path=/x", "unsupported Redis URL option"),
        ("redis://:hunter2@cache:6379/zero", "database must be a number"),
    ],
)
def test_redis_store_url_the_client_cannot_use_is_refused(store: str, says: str) -> None:
    """A Redis URL with an option the store's client lacks, or a db that is not a number,
    is refused at load time naming the field, its line and the part (not a traceback at
    start-up), and the password is never echoed."""
    with pytest.raises(ConfigError) as info:
        parse_config(f'models: [{{name: m}}]\nstore: "{store}"\n')
    message = str(info.value)
    assert "store (line 2)" in message
    assert says in message
    assert "hunter2" not in message


def test_memory_store_is_accepted() -> None:
    """``store: memory``, written or left out, keeps state in the one gateway process."""
    assert parse_config("models: [{name: m}]\nstore: memory\n").store == "memory"
    config = parse_config("models: [{name: m}]\n")
    assert config.store == "memory"
    assert not config.shared_store


def test_distributed_settings_need_a_shared_store() -> None:
    """A ``distributed:`` block with the memory store would do nothing: it is refused."""
    with pytest.raises(ConfigError, match="distributed: is set but store is 'memory'"):
        parse_config("models: [{name: m}]\ndistributed: {on_store_failure: fail_closed}\n")


@pytest.mark.parametrize(
    ("store", "batches", "says"),
    [
        ("unix:///run/redis.sock", "", "reached over TCP"),
        ("redis://:hunter2@cache:6379/2", "", "only database 0"),
        ("redis://:hunter2@cache:6379/0", "batches: {}\n", "batches.store"),
    ],
)
def test_a_cluster_store_that_cannot_work_is_refused(store: str, batches: str, says: str) -> None:
    """``distributed.cluster`` needs a TCP node of database 0, and batch data elsewhere (the
    batch backend is not cluster-aware): each is refused at load, without the password;
    with ``batches.store`` set, the cluster is accepted."""
    text = f'models: [{{name: m}}]\nstore: "{store}"\ndistributed: {{cluster: true}}\n{batches}'
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert says in str(info.value)
    assert "hunter2" not in str(info.value)
    fine = "models: [{name: m}]\nstore: redis://cache:6379/0\ndistributed: {cluster: true}\n"
    config = parse_config(fine + "batches: {store: 'redis://batch:6379/0'}\n")
    assert config.distributed.cluster
    assert not parse_config("models: [{name: m}]\nstore: redis://r/0\n").distributed.cluster


@pytest.mark.parametrize(
    ("field", "value", "complaint"),
    [
        ("on_store_failure", "fail_maybe", "fail_open"),
        ("lease_ttl_s", "0.1", "greater than or equal to 0.5"),
        ("timeout_ms", "0", "greater than 0"),
        ("replica_id", "'gw|1'", "pattern"),
        ("key_prefix", "'a b'", "pattern"),
        ("expected_replicas", "0", "greater than or equal to 1"),
        ("lease_s", "5", "Extra inputs are not permitted"),
    ],
)
def test_bad_distributed_settings_name_field_and_line(
    field: str, value: str, complaint: str
) -> None:
    """Each ``distributed:`` setting is checked; the error names it and its line."""
    text = f"models: [{{name: m}}]\nstore: redis://r:6379/0\ndistributed:\n  {field}: {value}\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    message = str(info.value)
    assert f"distributed.{field} (line 4)" in message
    assert complaint in message


def test_redacted_store_drops_the_credentials() -> None:
    """What ``check-config`` prints of a store URL has no user name or password."""
    assert redacted_store("redis://admin:hunter2@cache:6380/2") == "redis://cache:6380/2"
    assert redacted_store("rediss://:pw@cache/0") == "rediss://cache/0"
    assert redacted_store("memory") == "memory"


ORACLE_LANE = "models:\n  - name: m\n    lanes:\n      - {name: a}\n      - {name: b, policy: %s}\n"


@pytest.mark.parametrize("policy", ["oracle", "slack-oracle"])
def test_simulation_only_policy_is_refused_for_the_gateway(policy: str) -> None:
    """``oracle`` and ``slack-oracle`` need true output lengths: a gateway config naming one
    is an error that names the lane, the field and its line."""
    with pytest.raises(ConfigError) as info:
        parse_config(ORACLE_LANE % policy)
    message = str(info.value)
    assert "models[0].lanes[1].policy (line 5)" in message
    assert "lane 'b'" in message
    assert f"policy {policy!r} is simulation-only" in message


@pytest.mark.parametrize("policy", ["oracle", "slack-oracle"])
def test_simulation_only_policy_is_accepted_for_simulation(policy: str) -> None:
    """The simulator knows true output lengths, so its configs may name the oracles."""
    config = parse_config(ORACLE_LANE % policy, simulation=True)
    assert config.models[0].lanes[1].policy == policy


def test_gateway_problems_follow_the_policy_registry() -> None:
    """Exactly the oracles are simulation-only; every other policy runs in the gateway."""
    from sluicegate.core.policies import policy_names, simulation_only_policies

    assert simulation_only_policies() == {"oracle", "slack-oracle"}
    for policy in sorted(policy_names() - simulation_only_policies()):
        assert parse_config(ORACLE_LANE % policy).models[0].lanes[1].policy == policy
