"""The sync script against a plain-Python model, under random interleavings (Hypothesis):
two replicas offering, dropping, finishing and obeying the store's stops, with lending,
token budgets, fair lanes and preemption (urgent waiters, reclaiming lent quota)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Iterator
from typing import ClassVar, TypeVar

import pytest
import redis.asyncio as aioredis
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from sluicegate.store.keys import grants_key
from sluicegate.store.redis_store import RedisStore
from sluicegate.store.store_errors import StoreUnavailableError
from sluicegate.store.types import Drop, LaneLimits, ModelLimits, Offer, SyncResult
from tests.store.redis_server import REDIS_SERVER, running_redis
from tests.store.reference_store import ReferenceStore
from tests.store.store_helpers import MODEL

REPLICAS = ("r0", "r1")
TENANTS = ("t0", "t1", "t2")
_T = TypeVar("_T")

lane_limits = st.lists(
    st.builds(
        LaneLimits,
        name=st.just(""),
        cap=st.integers(1, 3),
        borrow=st.booleans(),
        fair=st.sampled_from([True, True, False]),
        lend=st.booleans(),
        shares=st.sampled_from(["", "always", "priority"]),
    ),
    min_size=1,
    max_size=2,
).map(
    lambda lanes: tuple(
        LaneLimits(f"l{i}", x.cap, x.borrow, x.fair, x.lend, x.shares) for i, x in enumerate(lanes)
    )
)
model_limits = st.builds(
    ModelLimits,
    model=st.just(MODEL),
    cap=st.integers(1, 4),
    token_budget=st.none() | st.integers(20, 100),
    lanes=lane_limits,
)


class StoreAgainstModel(RuleBasedStateMachine):
    """Replicas queue offers and drops, then sync; every answer must equal the model's."""

    loop: ClassVar[asyncio.AbstractEventLoop]
    stores: ClassVar[dict[str, RedisStore]]
    client: ClassVar[aioredis.Redis]

    def __init__(self) -> None:
        super().__init__()
        self.pending: dict[str, list[Offer | Drop]] = {replica: [] for replica in REPLICAS}
        self.tickets: dict[str, list[str]] = {replica: [] for replica in REPLICAS}
        self.reference = ReferenceStore(ModelLimits(MODEL, 1, None, (LaneLimits("l0", 1),)))
        self.last: dict[str, tuple[int, list[Offer | Drop], SyncResult]] = {}

    def run(self, coroutine: Awaitable[_T]) -> _T:
        """Run ``coroutine`` on the test's loop (the stores' connections live there)."""
        return self.loop.run_until_complete(coroutine)

    @initialize(limits=model_limits)
    def start(self, limits: ModelLimits) -> None:
        """A fresh store (FLUSHALL) under ``limits``."""
        self.reference = ReferenceStore(limits)
        self.run(self.client.flushall())

    @rule(
        replica=st.sampled_from(REPLICAS),
        data=st.data(),
        tenant=st.sampled_from(TENANTS),
        order=st.tuples(st.sampled_from([-1.0, 0.0, 2.5])),
        cost=st.integers(1, 60),
        charge=st.sampled_from([1.0, 7.5, 40.0]),
        weight=st.sampled_from([0.5, 1.0, 3.0]),
        priority=st.integers(0, 5),
        urgent_at=st.sampled_from([None, None, 1.0, 2.0, 1e11]),
        delay=st.sampled_from([None, 0.0, 0.0, 1000.0]),
        share_from=st.sampled_from([None, 1.0, 1.0, 1e11]),
    )
    def offer(
        self,
        replica: str,
        data: st.DataObject,
        tenant: str,
        order: tuple[float],
        cost: int,
        charge: float,
        weight: float,
        priority: int,
        urgent_at: float | None,
        delay: float | None,
        share_from: float | None,
    ) -> None:
        """An offer; ``urgent_at`` 1.0 or 2.0 is long past (urgent now), 1e11 far ahead;
        ``delay`` 0.0 preemptible at once, 1000.0 not within the test, ``None`` never;
        ``share_from`` (a lane with tenant shares) past, far ahead, or ``None``."""
        lane = data.draw(st.sampled_from([lane.name for lane in self.reference.limits.lanes]))
        ticket = f"{len(self.tickets[replica]):04x}"
        self.tickets[replica].append(ticket)
        self.pending[replica].append(
            Offer(
                ticket,
                lane,
                tenant,
                weight,
                order,
                cost,
                charge,
                priority,
                urgent_at,
                delay,
                share_from,
            )
        )

    @precondition(lambda self: any(self.tickets.values()))
    @rule(data=st.data(), correction=st.sampled_from([0.0, -5.0, 30.0]))
    def drop(self, data: st.DataObject, correction: float) -> None:
        replica = data.draw(st.sampled_from([r for r in REPLICAS if self.tickets[r]]))
        ticket = data.draw(st.sampled_from(self.tickets[replica]))
        self.pending[replica].append(Drop(ticket, correction))

    @precondition(lambda self: self.reference.leases)
    @rule(data=st.data(), correction=st.sampled_from([0.0, -5.0, 30.0]))
    def finish(self, data: st.DataObject, correction: float) -> None:
        """A running ticket ends (what most drops are), with a correction of its charge."""
        replica, ticket = data.draw(st.sampled_from(sorted(self.reference.leases)))
        self.pending[replica].append(Drop(ticket, correction))

    @precondition(lambda self: self.reference.stopping)
    @rule(data=st.data())
    def obey_stop(self, data: st.DataObject) -> None:
        """A victim's replica stops it: its drop gives the slot to the waiter it was for."""
        replica, ticket = data.draw(st.sampled_from(sorted(self.reference.stopping)))
        self.pending[replica].append(Drop(ticket, 0.0))

    @precondition(lambda self: any(self.tickets.values()))
    @rule(data=st.data())
    def offer_again(self, data: st.DataObject) -> None:
        """Re-offer a ticket the replica already offered (a no-op while waiting or running)."""
        replica = data.draw(st.sampled_from([r for r in REPLICAS if self.tickets[r]]))
        ticket = data.draw(st.sampled_from(self.tickets[replica]))
        lane = self.reference.limits.lanes[0].name
        self.pending[replica].append(Offer(ticket, lane, "t0", 1.0, (0.0,), 1, 1.0))

    @rule(replica=st.sampled_from(REPLICAS))
    def sync(self, replica: str) -> None:
        ops, self.pending[replica] = self.pending[replica], []
        time.sleep(0.0015)  # a lease of an earlier sync is strictly older (milliseconds)
        store = self.stores[replica]
        seq = store.next_seq()
        (result,) = self.run(store.sync([(self.reference.limits, ops)], seq=seq))
        granted, stops = self.reference.sync(replica, ops)
        assert list(result.granted) == granted
        assert list(result.stops) == stops
        self.last[replica] = (seq, ops, result)
        counts = result.counts
        assert counts.running == len(self.reference.leases)
        assert counts.inflight_tokens == self.reference.tokens()
        assert counts.waiting == len(self.reference.waiting)

    @precondition(lambda self: self.last)
    @rule(data=st.data())
    def retry_a_sync(self, data: st.DataObject) -> None:
        """A replica sends its last sync again (its answer was lost): the store answers
        what it answered then and changes nothing; an older sync is refused (fenced)."""
        replica = data.draw(st.sampled_from(sorted(self.last)))
        seq, ops, result = self.last[replica]
        store = self.stores[replica]
        (again,) = self.run(store.sync([(self.reference.limits, ops)], seq=seq))
        assert again == result
        if seq > 1:
            with pytest.raises(StoreUnavailableError):
                self.run(store.sync([(self.reference.limits, ops)], seq=seq - 1))

    @invariant()
    def grants_pushed_to_the_others_match(self) -> None:
        for replica in REPLICAS:
            key = grants_key("sluicegate", MODEL, replica)
            pushed = self.run(self.client.lrange(key, 0, -1))
            assert pushed == self.reference.pushed.get(replica, [])

    @invariant()
    def one_victim_per_lane_and_waiter(self) -> None:
        """A lane has at most one victim stopping for it, and a victim is marked once."""
        marks = self.run(self.client.hkeys(f"{{sluicegate:{MODEL}}}:stop"))
        pend = self.run(self.client.hgetall(f"{{sluicegate:{MODEL}}}:pend"))
        assert sorted(marks) == sorted(f"{r}|{t}" for r, t in self.reference.stopping)
        assert set(pend) == set(self.reference.pending)
        assert len(set(pend.values())) == len(pend)

    @invariant()
    def caps_hold(self) -> None:
        limits = self.reference.limits
        assert len(self.reference.leases) <= limits.cap
        for lane in limits.lanes:
            assert self.reference.own(lane.name) <= lane.cap
            if not lane.borrow:
                assert self.reference.lane_running(lane.name) <= lane.cap
        if limits.token_budget is not None and len(self.reference.leases) > 1:
            assert self.reference.tokens() <= limits.token_budget


@pytest.fixture(scope="module")
def private_url() -> Iterator[str]:
    """A redis-server for the state machine (it flushes it at every run)."""
    if not os.path.exists(REDIS_SERVER):
        pytest.skip("redis-server not installed")
    with running_redis() as server:
        yield server.url


def test_store_matches_the_model(private_url: str) -> None:
    """Grants (whose, which, in what order), counts and pushed grant lists equal the model's."""
    loop = asyncio.new_event_loop()
    stores = {
        replica: RedisStore(private_url, replica=replica, timeout_s=1.0) for replica in REPLICAS
    }
    client = aioredis.Redis.from_url(private_url, decode_responses=True)
    StoreAgainstModel.loop, StoreAgainstModel.stores, StoreAgainstModel.client = (
        loop,
        stores,
        client,
    )
    try:
        for store in stores.values():
            loop.run_until_complete(store.connect())
        run_state_machine_as_test(
            StoreAgainstModel,
            settings=settings(
                max_examples=150,
                stateful_step_count=40,
                deadline=None,
                # The explain phase traces every line: minutes with a Redis client inside.
                phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
            ),
        )
    finally:
        for store in stores.values():
            loop.run_until_complete(store.close())
        loop.run_until_complete(client.aclose())
        loop.close()
