"""What a worker of ``serve --workers N`` makes of the config it reloads (``worker_config``)."""

from __future__ import annotations

from sluicegate.config import parse_config
from sluicegate.gateway.workers.worker_process import WorkerSpec, worker_config


def spec(count: int, *, private: bool) -> WorkerSpec:
    """Worker 1 of ``count``, on the private Redis or on the config's store."""
    return WorkerSpec(
        index=1,
        count=count,
        run_dir="/nonexistent",
        config_path="/nonexistent/sluicegate.yaml",
        host="127.0.0.1",
        port=8080,
        store="unix:///nonexistent/redis.sock" if private else "redis://r:6379/0",
        replica="gw-w1",
        on_store_failure="fail_open" if private else None,
        timeout_ms=250.0 if private else None,
        supervisor=1,
        grace_s=30.0,
    )


def test_with_the_private_redis_every_worker_expects_the_others() -> None:
    """The workers are the whole fleet of a private Redis: a worker that started before it
    answered keeps 1/N of every limit, not the whole limits."""
    config = worker_config(parse_config("models: [{name: m}]\n"), spec(4, private=True))
    settings = config.distributed
    assert (settings.expected_replicas, settings.replica_id) == (4, "gw-w1")
    assert (settings.on_store_failure, settings.timeout_ms) == ("fail_open", 250.0)


def test_with_a_configured_store_the_config_says_how_many() -> None:
    """Other hosts may share a configured store: N workers are not the fleet, so the
    config's ``expected_replicas`` stands (unset: refuse until the store answers)."""
    text = "models: [{name: m}]\nstore: redis://r:6379/0\n"
    unset = worker_config(parse_config(text), spec(4, private=False)).distributed
    assert unset.expected_replicas is None
    text += "distributed: {expected_replicas: 12}\n"
    given = worker_config(parse_config(text), spec(4, private=False)).distributed
    assert given.expected_replicas == 12
