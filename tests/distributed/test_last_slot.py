"""64 requests racing, over three gateway replicas, for capacity that fits one: the
last slot of a model with cap 1, and an in-flight token budget that fits one request.

Both models share one cluster (one engine each): the tests only read their own model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from tests.distributed.cluster import Cluster, ClusterSpec, ModelSetup, lane, running_cluster
from tests.distributed.load import client

pytestmark = pytest.mark.distributed

# About 1,000 prompt tokens at the gateway's 4 characters per token: one request
# costs ~1,000 tokens of the budget, two do not fit in 1,500; on the engine the
# prompt adds only ~10 ms.
LONG_PROMPT = "word " * 800
TOKEN_BUDGET = 1500


@pytest.fixture(scope="module")
def racing_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Model ``one`` (cap 1) and model ``budget`` (cap 64, budget of 1,500 tokens)."""
    models = (
        ModelSetup("one", {"max_concurrency": 1, "lanes": [lane("shared", 64)]}),
        ModelSetup(
            "budget",
            {
                "max_concurrency": 64,
                "max_inflight_tokens": TOKEN_BUDGET,
                "lanes": [lane("shared", 64)],
            },
        ),
    )
    with running_cluster(ClusterSpec(models=models), tmp_path_factory.mktemp("racing")) as c:
        yield c


async def test_sixty_four_racing_for_the_last_slot_run_one_at_a_time(
    racing_cluster: Cluster,
) -> None:
    """Cap 1, a 1.5 s request running: 64 requests sent at once over 3 gateways all
    wait (the gateways together run 1 while it runs), then run strictly one at a time:
    the engine never runs two (max_running_seen == 1) and all 65 are answered 200."""
    cluster = racing_cluster
    async with client(cluster, "one") as c:
        long_request = asyncio.create_task(c.send(0, max_tokens=150))
        while cluster.engine_stats("one")["running"] < 1:
            await asyncio.sleep(0.01)
        racing = asyncio.create_task(c.burst(64, max_tokens=(1,)))
        await asyncio.sleep(0.5)
        states = [await c.admin_state(i) for i in range(3)]
        running_while_held = sum(
            m["running"] for s in states for m in s["models"] if m["name"] == "one"
        )
        replies = [await long_request, *await racing]
    stats = cluster.engine_stats("one")
    fallbacks = cluster.store_fallbacks()
    assert not any(fallbacks), f"left global mode: {fallbacks}\n{cluster.logs()}"
    print(
        f"last slot: {running_while_held} running while held, max seen {stats['max_running_seen']}"
    )
    assert running_while_held == 1, states
    assert [r.status for r in replies] == [200] * 65, [r.error_code for r in replies]
    assert stats["max_running_seen"] == 1, stats
    assert stats["finished_total"] == 65, stats


async def test_sixty_four_racing_for_a_token_budget_of_one_run_one_at_a_time(
    racing_cluster: Cluster,
) -> None:
    """Cap 64 but a 1,500-token budget, 64 requests of ~1,000 tokens sent at once over
    3 gateways: the engine never runs two (max_running_seen == 1), all are answered 200."""
    cluster = racing_cluster
    async with client(cluster, "budget") as c:
        replies = await c.burst(64, max_tokens=(2,), prompt=LONG_PROMPT)
    stats = cluster.engine_stats("budget")
    fallbacks = cluster.store_fallbacks()
    assert not any(fallbacks), f"left global mode: {fallbacks}\n{cluster.logs()}"
    print(f"token budget: max seen {stats['max_running_seen']}")
    assert [r.status for r in replies] == [200] * 64, [r.error_code for r in replies]
    assert stats["max_running_seen"] == 1, stats
    assert stats["finished_total"] == 64, stats
