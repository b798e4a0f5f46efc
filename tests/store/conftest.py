"""Fixtures of the store tests: a private redis-server per module, flushed per test, and a
private Redis Cluster per module for the cluster tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis

from tests.store.redis_cluster import REDIS_CLI, RedisCluster, running_cluster
from tests.store.redis_server import REDIS_SERVER, RedisServer, running_redis


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """A redis-server of the test module's own, on a free loopback port."""
    if not os.path.exists(REDIS_SERVER):
        pytest.skip(f"redis-server not installed ({REDIS_SERVER}); `make test` installs it")
    with running_redis() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The URL of the module's redis-server, emptied (FLUSHALL) for this test."""
    with redis.Redis.from_url(redis_server.url) as client:
        client.flushall()
    return redis_server.url


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[RedisCluster]:
    """A Redis Cluster of the test module's own: three masters, one replica each."""
    if not (os.path.exists(REDIS_SERVER) and os.path.exists(REDIS_CLI)):
        pytest.skip("redis-server or redis-cli not installed; `make test` installs them")
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture
def cluster_url(redis_cluster: RedisCluster) -> str:
    """A seed URL of the module's cluster, every master emptied for this test."""
    redis_cluster.wait_ready()
    redis_cluster.flush()
    return redis_cluster.url
