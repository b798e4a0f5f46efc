"""Simulated engines publishing KV events: grouping, delivery time, the scheduler's index
following the engines' caches, tickets' block hashes, and a run unchanged by recording."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.config import Config, parse_config
from sluicegate.core.decisions import Decision
from sluicegate.core.kv_index import BlockIndex, BlockRemoved, BlockStored, KvEvent
from sluicegate.core.kv_index import events_of as grouped_events
from sluicegate.core.scheduler import Scheduler
from sluicegate.core.spec import SchedulerSpec
from sluicegate.core.ticket import Ticket
from sluicegate.engine import preset
from sluicegate.engine.engine_config import EngineConfig
from sluicegate.sim.comparison import run_comparison
from sluicegate.sim.replica_backends import with_replicas
from sluicegate.sim.replica_kv_events import KvEventFeed, publishes_kv_events
from sluicegate.sim.virtual_driver import _Simulation, simulate
from sluicegate.sim.workloads.prefix import shared_prefix

WITH_EVENTS = """\
models:
  - name: default
    backends:
      - name: b0
        url: http://127.0.0.1:8000
        kv_events: {endpoint: "tcp://127.0.0.1:5557", max_blocks: 50000}
simulation:
  preset: llama-3.1-8b-h100
  replicas: 3
  kv_event_delay_s: 0.25
"""
WITHOUT_EVENTS = """\
models:
  - name: default
simulation:
  preset: llama-3.1-8b-h100
  replicas: 3
"""


class RecordingScheduler(Scheduler):
    """The real scheduler, also keeping every ticket and an unbounded copy of each
    backend's KV events."""

    def __init__(self, spec: SchedulerSpec) -> None:
        super().__init__(spec)
        self.tickets: list[Ticket] = []
        self.indexes: dict[str, BlockIndex] = {}
        self.batches: list[tuple[str, tuple[KvEvent, ...], int]] = []

    def submit(self, ticket: Ticket, now: float) -> list[Decision]:
        """Keep the ticket, then submit it."""
        self.tickets.append(ticket)
        return super().submit(ticket, now)

    def observe_kv_events(
        self, model: str, backend: str, events: Sequence[KvEvent], max_blocks: int
    ) -> None:
        """Keep the batch, then observe it."""
        self.batches.append((backend, tuple(events), max_blocks))
        self.indexes.setdefault(backend, BlockIndex(10**9)).apply(events)
        super().observe_kv_events(model, backend, events, max_blocks)


def config(text: str) -> Config:
    """A simulation config from YAML."""
    return parse_config(text, source="<test>", simulation=True)


def small_engine() -> EngineConfig:
    """The 8B preset with room for 1,500 KV blocks of 16 tokens, so prefixes get evicted."""
    return dataclasses.replace(preset("llama-3.1-8b-h100"), kv_capacity_tokens=1500 * 16)


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 50)), max_size=40))
def test_grouping_keeps_order_and_alternates_kinds(drained: list[tuple[bool, int]]) -> None:
    """Stores and evictions become runs of one kind, in order, each run as long as can be."""
    events = grouped_events(drained)
    flat = [
        (isinstance(e, BlockStored), h)
        for e in events
        if isinstance(e, BlockStored | BlockRemoved)
        for h in e.hashes
    ]
    assert flat == drained
    kinds = [isinstance(e, BlockStored) for e in events]
    assert all(a != b for a, b in itertools.pairwise(kinds))


def test_a_batch_arrives_at_its_step_end_plus_the_delay() -> None:
    """Published for a step ending at 1.0 with a 0.5 s delay: not delivered at 1.49, delivered
    at 1.5 with the backend's bound; batches come out in due order."""
    spec = config(WITH_EVENTS).scheduler_spec()
    scheduler = RecordingScheduler(spec)
    feed = KvEventFeed("default", 0.5, 777)
    feed.publish("b0", [(True, 1), (True, 2), (False, 1)], 1.0)
    feed.publish("b0", [(True, 3)], 0.8)
    feed.publish("b0", [], 0.1)  # nothing to say: no batch
    assert len(feed) == 2
    feed.deliver(1.29, scheduler)
    assert scheduler.batches == []
    feed.deliver(1.3, scheduler)
    assert scheduler.batches == [("b0", (BlockStored((3,)),), 777)]
    feed.deliver(1.49, scheduler)
    assert len(scheduler.batches) == 1
    feed.deliver(1.5, scheduler)
    assert scheduler.batches[1] == ("b0", (BlockStored((1, 2)), BlockRemoved((1,))), 777)
    assert len(feed) == 0
    with pytest.raises(ValueError, match="kv_event_delay_s must be >= 0"):
        KvEventFeed("default", -0.1)


def test_who_publishes() -> None:
    """A backend with kv_events or the precise_prefix router publishes; neither does not."""
    assert publishes_kv_events(config(WITH_EVENTS).models[0])
    plain = config(WITHOUT_EVENTS).models[0]
    assert not publishes_kv_events(plain)
    assert publishes_kv_events(plain.model_copy(update={"router": "precise_prefix"}))
    assert KvEventFeed.for_model(plain, 0.0) is None
    feed = KvEventFeed.for_model(config(WITH_EVENTS).models[0], 0.25)
    assert feed is not None
    assert (feed.delay_s, feed.max_blocks) == (0.25, 50000)


@pytest.mark.parametrize("delay", [0.0, 0.25])
def test_the_index_follows_each_engines_cache(delay: float) -> None:
    """After a run with evictions, every replica's events (the late ones delivered too)
    leave the scheduler knowing exactly the blocks its engine holds; tickets carry their
    request's prefix hashes."""
    cfg = config(WITH_EVENTS)
    workload = shared_prefix(12.0, 40.0, seed=3, prompts=12, blocks=48)
    spec = with_replicas(cfg.scheduler_spec(), "default", 3)
    feed = KvEventFeed.for_model(cfg.models[0], delay)
    sim = _Simulation(spec, "default", workload, small_engine(), 0, feed)
    scheduler = RecordingScheduler(spec)
    sim.scheduler = scheduler
    sim.run(1.0, None)
    assert feed is not None
    feed.deliver(math.inf, scheduler)  # any due after the run's last event
    removed = sum(isinstance(e, BlockRemoved) for _, batch, _ in scheduler.batches for e in batch)
    assert removed > 0, "the test needs evictions"
    for rep in sim.replicas:
        held = rep.engine.prefix_cache.lru_order()
        index = scheduler.indexes[rep.name]
        assert len(index) == len(held) > 0
        assert all(block in index for block in held)
    assert {max_blocks for _, _, max_blocks in scheduler.batches} == {50000}
    by_arrival = sorted(workload, key=lambda w: w.arrival_s)
    assert [t.block_hashes for t in scheduler.tickets] == [w.prefix for w in by_arrival]


def test_recording_events_changes_no_outcome() -> None:
    """least_inflight ignores the index: the same run with and without KV events gives
    identical records, engine counters and hit rates."""
    workload = shared_prefix(12.0, 40.0, seed=5, prompts=12, blocks=48)
    runs = [
        simulate(
            config(text).scheduler_spec(),
            "default",
            workload,
            small_engine(),
            3,
            kv_event_delay_s=0.1,
        )
        for text in (WITH_EVENTS, WITHOUT_EVENTS)
    ]
    assert runs[0].records == runs[1].records
    assert runs[0].prefix_by_replica == runs[1].prefix_by_replica
    assert runs[0].prompt_tokens_cached > 0


def test_a_delay_without_publishers_is_refused(tmp_path: Path) -> None:
    """simulation.kv_event_delay_s on a model whose engines publish nothing does nothing:
    simulate refuses it, naming the setting and the model."""
    cfg = config(WITHOUT_EVENTS.replace("replicas: 3", "replicas: 3\n  kv_event_delay_s: 0.2"))
    workload = shared_prefix(2.0, 5.0, seed=1, prompts=2, blocks=4)
    with pytest.raises(ValueError, match=r"kv_event_delay_s is 0\.2 but model 'default'"):
        run_comparison(cfg, workload, ["config"], out_dir=tmp_path, workers=1)
    with pytest.raises(ValueError, match="kv_event_delay_s"):
        config(WITHOUT_EVENTS.replace("replicas: 3", "replicas: 3\n  kv_event_delay_s: -1"))
