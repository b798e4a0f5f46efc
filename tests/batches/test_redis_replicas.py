"""Several replicas sharing one Redis: each status change happens once, files are written
once, and what a dead replica left half done is finished by another."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest

from sluicegate.batches.objects import new_id
from sluicegate.batches.redis.lifecycle import CHECK_LEASE_S
from sluicegate.batches.redis.redis_batches import RedisBatches
from tests.batches.conftest import LEASE_S, NOW, answer, content, line, new_batch, read
from tests.store.redis_server import RedisServer


@pytest.fixture
async def replicas(redis_server: RedisServer) -> AsyncIterator[list[RedisBatches]]:
    """Three backends on the same keys, as three gateway replicas have them."""
    prefix = new_id("fleet")
    backends = [RedisBatches(redis_server.url, prefix=prefix) for _ in range(3)]
    for backend in backends:
        await backend.open()
    try:
        yield backends
    finally:
        for backend in backends:
            await backend.close()


async def _file_lists(backend: RedisBatches) -> int:
    """How many file line lists exist under the backend's keys."""
    client = backend._redis  # observed: lists a losing replica must delete
    return len([key async for key in client.scan_iter(match=f"{backend.base}fl:*")])


async def test_replicas_checking_at_once_start_a_batch_once(replicas: list[RedisBatches]) -> None:
    """Three replicas validating together: one moves the batch, its lines are claimed once."""
    batch_id = await new_batch(replicas[0], [line(f"c{i}") for i in range(50)])
    changed = await asyncio.gather(*(r.validate_pending(read, NOW) for r in replicas))
    assert sorted(change for found in changed for change in found) == [(batch_id, "in_progress")]
    claims = await asyncio.gather(
        *(r.claim("m1", f"owner{i}", 20, NOW, LEASE_S) for i, r in enumerate(replicas))
    )
    assert sorted(c.idx for found in claims for c in found) == list(range(50))


@pytest.mark.parametrize("ending", ["completed", "expired"])
async def test_replicas_ending_at_once_write_the_files_once(
    replicas: list[RedisBatches], ending: str
) -> None:
    """Three replicas ending a batch together: one ending is reported, one output and one error
    file exist (the others' lists deleted), each line in them once."""
    first = replicas[0]
    batch_id = await new_batch(first, [line(f"c{i}") for i in range(1200)], window_s=100)
    await first.validate_pending(read, NOW)
    claims = await first.claim("m1", "A", 1200, NOW, LEASE_S)
    finished = claims if ending == "completed" else claims[:700]
    await first.record([answer(c, ok=c.idx % 3 != 0) for c in finished], [], "A")
    ended = await asyncio.gather(*(r.finish_due(NOW + 100) for r in replicas))
    assert [change for found in ended for change in found] == [(batch_id, ending)]
    row = await first.get_batch("t1", batch_id)
    assert row is not None
    assert row["status"] == ending
    out = [orjson.loads(t)["custom_id"] for t in await content(first, row["output_file_id"])]
    err = [orjson.loads(t)["custom_id"] for t in await content(first, row["error_file_id"])]
    assert out == [f"c{i}" for i in range(len(finished)) if i % 3 != 0]
    assert err == [f"c{i}" for i in range(1200) if i % 3 == 0 or i >= len(finished)]
    files, _ = await first.list_files("t1", None, None, 100)
    assert len(files) == 3
    assert await _file_lists(first) == 3


async def test_a_check_left_by_a_dead_replica_is_taken_over_after_its_lease(
    replicas: list[RedisBatches],
) -> None:
    """A replica that took a batch to check and died holds it for ``CHECK_LEASE_S``, then any
    other checks it."""
    dead, alive = replicas[0], replicas[1]
    batch_id = await new_batch(alive, [line("a")])
    assert dead._lifecycle is not None  # the first step of a check, then the replica "dies"
    taken = await dead._lifecycle._run("begin_check", batch_id, "dead", NOW, NOW + CHECK_LEASE_S)
    assert taken is not None
    assert await alive.validate_pending(read, NOW + CHECK_LEASE_S) == []
    changed = await alive.validate_pending(read, NOW + CHECK_LEASE_S + 1)
    assert changed == [(batch_id, "in_progress")]


async def test_an_ending_left_by_a_dead_replica_is_finished_by_another(
    replicas: list[RedisBatches],
) -> None:
    """A replica that marked a batch ending and died before writing its files: the next
    ``finish_due`` anywhere writes them; results arriving meanwhile are ignored."""
    dead, alive = replicas[0], replicas[1]
    batch_id = await new_batch(alive, [line("a"), line("b")])
    await alive.validate_pending(read, NOW)
    claims = await alive.claim("m1", "A", 2, NOW, LEASE_S)
    await alive.cancel_batch("t1", batch_id, NOW)
    assert dead._lifecycle is not None
    assert await dead._lifecycle._run("begin_end", batch_id, "cancelled", NOW)
    await alive.record([answer(c) for c in claims], [], "A")
    assert await alive.finish_due(NOW + 1) == [(batch_id, "cancelled")]
    row = await alive.get_batch("t1", batch_id)
    assert row is not None
    assert row["output_file_id"] is None
    errors = [orjson.loads(t) for t in await content(alive, row["error_file_id"])]
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [
        ("a", "batch_cancelled"),
        ("b", "batch_cancelled"),
    ]
