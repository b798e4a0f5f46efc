"""Three gateway replicas on one real ``redis-server`` and one emulated engine, in process on
loopback, with tenants running on different replicas (``test_tenant_running.py`` and
``test_dashboard_replicas.py``).

Replicas ``gw0`` and ``gw1`` configure tenants ``a``, ``b`` and ``c``; ``gw2`` also
configures ``d``, so the others count ``d``'s requests as ``other``. ``holding`` opens
long streams (``HOLDS``: which replica, which tenant) and keeps them running.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp

from tests.gateway.gateway_harness import Stack, engine_server, gateway_at, open_stream
from tests.store.redis_server import RedisServer, running_redis

KEYS = {tenant: f"sk-trio-{tenant}" for tenant in "abcd"}
ENV = {f"KEY_{tenant.upper()}": key for tenant, key in KEYS.items()}
LANES = {"a": "interactive", "b": "batch", "c": "interactive", "d": "batch"}
REPLICA_TENANTS = ("abc", "abc", "abcd")
"""The tenants each replica configures."""
HOLDS = ((0, "a"), (0, "a"), (1, "a"), (1, "b"), (2, "c"), (2, "d"))
"""The long requests ``holding`` runs: (replica, tenant)."""


@dataclass(frozen=True)
class Trio:
    """The store and the three replicas."""

    redis: RedisServer
    gateways: tuple[Stack, ...]

    def url(self, replica: int) -> str:
        """Replica ``replica``'s base URL."""
        return self.gateways[replica].base_url


def body(redis: RedisServer, replica: int) -> str:
    """Replica ``replica``'s config below the model's backends (cap 16, two lanes of 8)."""
    tenants = "".join(
        f"  - {{name: {t}, api_key_env: KEY_{t.upper()}, default_lane: {LANES[t]}}}\n"
        for t in REPLICA_TENANTS[replica]
    )
    return (
        "    max_concurrency: 16\n"
        "    lanes:\n"
        "      - {name: interactive, max_concurrency: 8, max_queue: 64}\n"
        "      - {name: batch, max_concurrency: 8, max_queue: 64}\n"
        f"tenants:\n{tenants}"
        f"store: redis://127.0.0.1:{redis.port}/0\n"
        f"distributed: {{replica_id: gw{replica}, on_store_failure: fail_open,"
        " lease_ttl_s: 1.0, timeout_ms: 250}\n"
    )


@contextlib.contextmanager
def running_trio() -> Iterator[Trio]:
    """Redis, one emulated engine and the three replicas; all stopped on exit."""
    with contextlib.ExitStack() as stack:
        redis = stack.enter_context(running_redis())
        engine = stack.enter_context(engine_server())
        gateways = tuple(
            stack.enter_context(gateway_at([engine.port], body(redis, i), environ=ENV))
            for i in range(3)
        )
        yield Trio(redis, gateways)


@contextlib.asynccontextmanager
async def holding(trio: Trio) -> AsyncIterator[None]:
    """Every request of ``HOLDS`` admitted and streaming until the block ends (closed then)."""
    async with aiohttp.ClientSession() as session:
        streams: list[aiohttp.ClientResponse] = []
        try:
            for replica, tenant in HOLDS:
                streams.append(await open_stream(session, trio.url(replica), key=KEYS[tenant]))
            yield
        finally:
            for stream in streams:
                stream.close()


def expected_rows(replica: int, holds: Any = HOLDS) -> list[dict[str, Any]]:
    """``/admin/state``'s rows of running requests per tenant for ``holds`` as ``replica``
    names tenants (its configured ones; the rest summed as ``other``)."""
    rows: dict[str, dict[str, Any]] = {}
    for _, tenant in holds:
        name = tenant if tenant in REPLICA_TENANTS[replica] else "other"
        row = rows.setdefault(name, {"tenant": name, "running": 0, "lanes": {}})
        row["running"] += 1
        row["lanes"][LANES[tenant]] = row["lanes"].get(LANES[tenant], 0) + 1
    return [rows[name] for name in sorted(rows)]
