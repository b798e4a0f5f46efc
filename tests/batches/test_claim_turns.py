"""Claims take turns: round-robin across tenants, then across each tenant's batches, over
every backend (SQLite and Redis), and from databases written before the turns existed."""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluicegate.batches.batch_backend import BatchBackend, Claim, Retry
from sluicegate.batches.objects import new_id
from sluicegate.batches.redis.redis_batches import RedisBatches
from sluicegate.batches.sqlite.sqlite_batches import SqliteBatches
from tests.batches.conftest import LEASE_S, NOW, answer, line, new_batch, read
from tests.store.redis_server import RedisServer


async def batch_of(backend: BatchBackend, tenant: str, name: str, size: int) -> str:
    """A batch of ``tenant``'s with lines ``<name>0`` … checked (``in_progress``); its id."""
    batch_id = await new_batch(backend, [line(f"{name}{i}") for i in range(size)], tenant)
    assert await backend.validate_pending(read, NOW) == [(batch_id, "in_progress")]
    return batch_id


def names(claims: list[Claim]) -> list[str]:
    """The custom_ids of these claims, in order."""
    return [claim.custom_id for claim in claims]


async def claim_one_by_one(backend: BatchBackend, count: int, now: float = NOW) -> list[str]:
    """``count`` claims of one line each (a window freeing one place at a time), each by
    another owner; the custom_ids taken."""
    taken: list[str] = []
    for i in range(count):
        taken += names(await backend.claim("m1", f"owner{i}", 1, now, LEASE_S))
    return taken


async def test_claims_go_round_robin_across_tenants_then_batches(backend: BatchBackend) -> None:
    """Tenant t1's big batch ``a``, then t2's ``c``, then t1's ``b``: claims alternate t1, t2
    (tenants in name order), and t1's turns alternate its batches, oldest first, each batch's
    lines in order; once t2 has nothing left, t1 takes every turn. One claim of seven takes
    what seven claims of one would have."""
    await batch_of(backend, "t1", "a", 20)
    await batch_of(backend, "t2", "c", 3)
    await batch_of(backend, "t1", "b", 4)
    expected = ["a0", "c0", "b0", "c1", "a1", "c2", "b1", "a2", "b2", "a3", "b3", "a4", "a5"]
    assert await claim_one_by_one(backend, 6) == expected[:6]
    assert names(await backend.claim("m1", "X", 7, NOW, LEASE_S)) == expected[6:]


async def test_the_rotation_goes_on_where_the_last_claim_left_it(backend: BatchBackend) -> None:
    """Three tenants: whatever the claims' sizes, the turns go t1, t2, t3, t1, …; a tenant
    that joins later takes its place in name order at the next pass."""
    for tenant in ("t1", "t3"):
        await batch_of(backend, tenant, tenant + "-", 10)
    assert names(await backend.claim("m1", "A", 3, NOW, LEASE_S)) == ["t1-0", "t3-0", "t1-1"]
    await batch_of(backend, "t2", "t2-", 10)
    assert names(await backend.claim("m1", "B", 2, NOW, LEASE_S)) == ["t2-0", "t3-1"]
    assert names(await backend.claim("m1", "C", 4, NOW, LEASE_S)) == [
        "t1-2",
        "t2-1",
        "t3-2",
        "t1-3",
    ]


async def test_a_small_batch_waits_one_turn_behind_a_huge_one(backend: BatchBackend) -> None:
    """Tenant t1's 3,000 lines fill a window of 4; tenant t2 then asks for 10 lines (and
    its name sorts after t1's, so the turn is t1's). Each line that ends frees one place:
    t2's first line is the next claim, and its 10 lines are all claimed within 20 claims,
    t1's taking the other turns."""
    await batch_of(backend, "t1", "huge", 3000)
    window = await backend.claim("m1", "runner", 4, NOW, LEASE_S)
    assert names(window) == ["huge0", "huge1", "huge2", "huge3"]
    await batch_of(backend, "t2", "small", 10)
    taken: list[str] = []
    while not all(f"small{i}" in taken for i in range(10)):
        ended = window.pop(0)
        await backend.record([answer(ended)], [], "runner")
        (claim,) = await backend.claim("m1", "runner", 1, NOW, LEASE_S)
        window.append(claim)
        taken.append(claim.custom_id)
    assert taken[0] == "small0"
    assert len(taken) == 19
    assert [name for name in taken if name.startswith("huge")] == [f"huge{i}" for i in range(4, 13)]


async def test_waiting_and_stale_lines_keep_their_order(backend: BatchBackend) -> None:
    """A tenant whose only line was sent back to wait has no turn until it is due, then
    takes the next one; a line whose lease ran out comes before any turn."""
    await batch_of(backend, "t1", "a", 10)
    await batch_of(backend, "t2", "c", 1)
    first = await backend.claim("m1", "A", 2, NOW, LEASE_S)
    assert names(first) == ["a0", "c0"]
    await backend.record([], [Retry(first[1], NOW + 10, failed=False)], "A")
    assert await claim_one_by_one(backend, 2, NOW + 1) == ["a1", "a2"]
    assert await claim_one_by_one(backend, 2, NOW + 10) == ["c0", "a3"]
    stale = NOW + LEASE_S + 0.5  # a0 (claimed at NOW) is stale; a1 and a2 not yet
    assert names(await backend.claim("m1", "B", 3, stale, LEASE_S)) == ["a0", "a4", "a5"]


async def test_an_ended_batch_gives_up_its_turns(backend: BatchBackend) -> None:
    """A cancelled batch of 2,500 lines (more than one claim clears at once) no longer runs:
    its tenant's other batch and the other tenant share the turns, and when nothing else is
    left the claims find nothing."""
    cancelled = await batch_of(backend, "t1", "gone", 2500)
    await batch_of(backend, "t1", "kept", 2)
    await batch_of(backend, "t2", "c", 2)
    assert await backend.cancel_batch("t1", cancelled, NOW)
    assert await claim_one_by_one(backend, 5) == ["kept0", "c0", "kept1", "c1"]
    assert await backend.claim("m1", "A", 10, NOW, LEASE_S) == []


async def test_a_version_2_sqlite_database_takes_turns_once_opened(tmp_path: Path) -> None:
    """A database of schema 2 (no tenant on its lines, claims by age) with two tenants'
    batches in progress opens as version 3: its lines learn their tenant and the claims
    take turns."""
    path = tmp_path / "v2.db"
    backend = SqliteBatches(str(path))
    await backend.open()
    try:
        await batch_of(backend, "t1", "a", 5)
        await batch_of(backend, "t2", "c", 5)
    finally:
        await backend.close()
    conn = sqlite3.connect(path)
    for statement in (
        "DROP INDEX lines_in_turn",
        "DROP TABLE tenant_turns",
        "DROP TABLE batch_turns",
        "ALTER TABLE lines DROP COLUMN tenant",
        "CREATE INDEX lines_to_run ON lines (model, state, batch_seq, idx)",
        "PRAGMA user_version = 2",
    ):
        conn.execute(statement)
    conn.commit()
    conn.close()
    backend = SqliteBatches(str(path))
    await backend.open()
    try:
        assert names(await backend.claim("m1", "A", 4, NOW, LEASE_S)) == ["a0", "c0", "a1", "c1"]
    finally:
        await backend.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 3
        indexes = {row[1] for row in conn.execute("PRAGMA index_list(lines)")}
        assert "lines_to_run" not in indexes
        assert "lines_in_turn" in indexes
    finally:
        conn.close()


def without_turns(server: RedisServer, prefix: str, batch_id: str | None = None) -> None:
    """Make the store look written by a version before the turns: without any (None), or
    without ``batch_id``'s place in them (validated by an older replica)."""
    base = f"{{{prefix}:batch}}:"
    with redis.Redis.from_url(server.url) as client:
        if batch_id is None:
            client.delete(base + "turns:m1", base + "turn:m1")
            return
        for entry in client.zrange(base + "turns:m1", 0, -1):
            if entry.endswith(f"/{batch_id}".encode()):
                client.zrem(base + "turns:m1", entry)


async def test_redis_batches_made_ready_before_the_turns_take_turns(
    redis_server: RedisServer,
) -> None:
    """Batches made ready by an older version have no place in the rotation: the model's
    first claim gives each one, so they take turns at once; a batch an older replica makes
    ready later (during a rolling upgrade) joins when its lines are the oldest ready. Every
    line is claimed, once."""
    backend = RedisBatches(redis_server.url, prefix="old-turns")
    await backend.open()
    try:
        for tenant, name in (("t1", "a"), ("t2", "c"), ("t1", "b")):
            await batch_of(backend, tenant, name, 3)
        without_turns(redis_server, "old-turns")
        assert await claim_one_by_one(backend, 4) == ["a0", "c0", "b0", "c1"]
        late = await batch_of(backend, "t2", "d", 2)
        without_turns(redis_server, "old-turns", late)
        taken = await claim_one_by_one(backend, 10)
        assert sorted(taken) == ["a1", "a2", "b1", "b2", "c2", "d0", "d1"]
    finally:
        await backend.close()


async def test_an_idle_redis_claim_writes_nothing(redis_server: RedisServer) -> None:
    """Every line leased, one waiting to be retried: the first claim that finds nothing
    drops the batches without ready lines from the rotation; the next ones change nothing
    in Redis (no write reaches its append-only file), however often the runners ask."""
    backend = RedisBatches(redis_server.url, prefix=new_id("idle"))
    await backend.open()
    try:
        await batch_of(backend, "t1", "a", 3)
        await batch_of(backend, "t2", "c", 2)
        claims = await backend.claim("m1", "A", 5, NOW, LEASE_S)
        await backend.record([], [Retry(claims[0], NOW + 100, failed=False)], "A")
        assert await backend.claim("m1", "B", 4, NOW, LEASE_S) == []
        with redis.Redis.from_url(redis_server.url) as client:
            before = client.info("persistence")["rdb_changes_since_last_save"]
            for i in range(5):
                assert await backend.claim("m1", f"B{i}", 4, NOW + i, LEASE_S) == []
            after = client.info("persistence")["rdb_changes_since_last_save"]
        assert after == before
    finally:
        await backend.close()


@pytest.mark.parametrize("limit", [7, 64])
async def test_twenty_tenants_take_one_line_each_per_pass(
    backend: BatchBackend, limit: int
) -> None:
    """Twenty tenants' batches waiting: a claim of ``limit`` lines takes one line of each
    tenant in name order, then again."""
    for t in range(20):
        await batch_of(backend, f"t{t:02d}", f"t{t:02d}-", 5)
    claims = await backend.claim("m1", "A", limit, NOW, LEASE_S)
    expected = [f"t{t:02d}-{i}" for i in range(5) for t in range(20)]
    assert names(claims) == expected[:limit]


Step = tuple[str, int, int]
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("batch"), st.integers(0, 3), st.integers(1, 6)),
        st.tuples(st.just("claim"), st.integers(1, 5), st.just(0)),
        st.tuples(st.just("answer"), st.integers(0, 30), st.just(0)),
        st.tuples(st.just("retry"), st.integers(0, 30), st.sampled_from([0, 5])),
        st.tuples(st.just("cancel"), st.integers(0, 10), st.just(0)),
        st.tuples(st.just("later"), st.sampled_from([1, 5, 31]), st.just(0)),
    ),
    max_size=30,
)
TENANTS = ("t1", "t2", "t10", "u")


async def replay(backend: BatchBackend, steps: list[Step]) -> list[list[str]]:
    """Apply ``steps`` to an open backend; what each claim took (custom_ids name their batch
    by its rank, so the backends' different batch ids do not matter)."""
    now, made, held, taken = float(NOW), [], [], []
    for kind, a, b in steps:
        if kind == "batch":
            lines = [line(f"{len(made)}-{i}") for i in range(b)]
            made.append(await new_batch(backend, lines, TENANTS[a]))
            await backend.validate_pending(read, int(now))
        elif kind == "claim":
            claims = await backend.claim("m1", "o", a, now, LEASE_S)
            held += claims
            taken.append(names(claims))
        elif kind in ("answer", "retry") and held:
            one = held.pop(a % len(held))
            retries = [Retry(one, now + b, failed=False)] if kind == "retry" else []
            await backend.record([] if retries else [answer(one)], retries, "o")
        elif kind == "cancel" and made:
            batch_id = made[a % len(made)]
            row = await backend.get_batch("t1", batch_id)
            for tenant in TENANTS:
                row = row or await backend.get_batch(tenant, batch_id)
            assert row is not None
            await backend.cancel_batch(row["tenant"], batch_id, int(now))
        elif kind == "later":
            now += a
            # a live runner renews what it holds; lines whose lease ran out come before any
            # turn, in an order of each backend's own (tested in the conformance suite)
            await backend.renew("o", held, now + LEASE_S)
    return taken


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=STEPS)
def test_both_backends_take_the_same_turns(redis_server: RedisServer, steps: list[Step]) -> None:
    """Any sequence of batches of four tenants, claims of any size, answers, retries that
    wait, cancels and time passing (leases renewed): SQLite and Redis hand out the same
    lines in the same order."""
    with tempfile.TemporaryDirectory() as tmp:
        backends: list[BatchBackend] = [
            SqliteBatches(str(Path(tmp) / "b.db")),
            RedisBatches(redis_server.url, prefix=new_id("agree")),
        ]

        async def both() -> list[list[list[str]]]:
            taken = []
            for backend in backends:
                await backend.open()
                try:
                    taken.append(await replay(backend, steps))
                finally:
                    await backend.close()
            return taken

        sqlite, redis_ = asyncio.run(both())
    assert sqlite == redis_
