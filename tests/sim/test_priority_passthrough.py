"""``priority_passthrough`` in the simulator: the replica's engine runs vLLM's priority
policy and gets each ticket's priority, so the engine's own queue favours the lower value."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sluicegate.core.spec import BackendSpec, LaneSpec, ModelSpec, SchedulerSpec
from sluicegate.engine import preset
from sluicegate.engine.engine_config import SchedulingPolicy
from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.events import EventQueue
from sluicegate.sim.live import SimRequest
from sluicegate.sim.replica import Replica
from sluicegate.sim.result import SimResult
from sluicegate.sim.virtual_driver import simulate

ENGINE = dataclasses.replace(preset("tiny"), max_num_seqs=8)
"""Eight sequence slots behind a gateway that lets 200 in: the engine's queue is the queue."""


def spec(passthrough: bool) -> SchedulerSpec:
    """One FIFO lane of 200 slots (far above the engine's 8) on backends passing priority
    through or not."""
    lane = LaneSpec(
        name="main", max_concurrency=200, max_queue=100_000, queue_timeout_s=1e6,
        slo_ms=1e9, policy="fifo", preemptible="never",
    )  # fmt: skip
    backend = BackendSpec(name="r0", priority_passthrough=passthrough)
    model = ModelSpec(name="m", lanes=(lane,), max_concurrency=200, backends=(backend,))
    return SchedulerSpec(models=(model,))


def workload() -> list[WorkloadRequest]:
    """600 Poisson arrivals at 100/s, more than the engine serves: half ``chat`` (priority 1,
    20–80 tokens out), half ``bulk`` (priority 4, 100–300 tokens out)."""
    rng = np.random.default_rng(1)
    out, at = [], 0.0
    for _ in range(600):
        at += float(rng.exponential(0.01))
        chat = bool(rng.random() < 0.5)
        output = int(rng.integers(20, 80) if chat else rng.integers(100, 300))
        out.append(
            WorkloadRequest(
                at, int(rng.integers(50, 200)), output, 400, tenant="chat" if chat else "bulk",
                lane="main", priority=1 if chat else 4,
            )
        )  # fmt: skip
    return out


def mean_ttft(result: SimResult, tenant: str) -> float:
    """Mean time to first token of ``tenant``'s requests, from arrival."""
    return float(
        np.mean([
            r.first_token_s - r.arrival_s
            for r in result.records
            if r.tenant == tenant and r.first_token_s is not None
        ])
    )  # fmt: skip


def test_passthrough_lets_the_engine_serve_chat_first_at_bulks_cost() -> None:
    """Same requests, same gateway: with passthrough every request still completes, chat's
    mean TTFT falls to under half, and bulk's rises (the engine admits chat ahead of it)."""
    plain = simulate(spec(False), "m", workload(), ENGINE, 1, seed=0)
    passed = simulate(spec(True), "m", workload(), ENGINE, 1, seed=0)
    for result in (plain, passed):
        assert {r.outcome for r in result.records} == {"completed"}
    assert mean_ttft(passed, "chat") < 0.5 * mean_ttft(plain, "chat")
    assert mean_ttft(passed, "bulk") > mean_ttft(plain, "bulk")


def test_without_passthrough_the_engine_gets_no_priority() -> None:
    """A replica not passing priority through hands its fcfs engine priority 0 (an fcfs
    engine refuses any other); one passing it through gives its engine the ticket's."""
    cases: list[tuple[bool, SchedulingPolicy, int]] = [(False, "fcfs", 0), (True, "priority", 3)]
    for passthrough, policy, expected in cases:
        engine = dataclasses.replace(ENGINE, scheduling_policy=policy)
        replica = Replica(0, "r0", engine, 0, EventQueue(), passthrough=passthrough)
        replica.add(SimRequest(0, WorkloadRequest(0.0, 20, 5, 5)), 0.0, priority=3)
        assert replica.engine.num_requests_waiting == 1
        replica.engine.step(0.0)
        assert replica.engine._running[0].priority == expected  # the engine's own record


def test_passthrough_on_independent_servers_is_refused() -> None:
    """Independent servers are FCFS by definition: the simulation refuses passthrough."""
    with pytest.raises(ValueError, match="needs a shared batch"):
        simulate(spec(True), "m", workload()[:5], preset("independent"), 1)
