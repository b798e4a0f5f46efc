"""The engine's priority policy (vLLM V1 ``--scheduling-policy priority``): waiting order,
KV victims, no preemption for admission, and refusals."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.engine import Engine, EngineConfig, StepResult

TIGHT = EngineConfig(
    max_num_seqs=6, max_num_batched_tokens=64, kv_capacity_tokens=256, block_size=8,
    base_s=0.01, per_prefill_token_s=1e-4, per_decode_seq_s=1e-3,
    scheduling_policy="priority",
)  # fmt: skip
"""Few KV blocks and a small step budget, so preemption and chunked prefill are common."""

Key = tuple[int, float, int]


def config(**changes: object) -> EngineConfig:
    """``TIGHT`` with ``changes``."""
    return dataclasses.replace(TIGHT, **changes)  # type: ignore[arg-type]


def run_until_idle(engine: Engine, now: float = 0.0) -> list[StepResult]:
    """Step the engine to idle from ``now`` (no arrivals meanwhile)."""
    results = []
    while (result := engine.step(now)) is not None:
        results.append(result)
        now += result.duration_s
    return results


def admission_order(results: list[StepResult]) -> list[str]:
    """Requests in the order of their first token."""
    return [req for result in results for req in result.first_token]


# ------------------------------------------------------------------ scenarios


def test_waiting_requests_are_admitted_by_priority_then_arrival() -> None:
    """One slot: behind a running request, the waiting ones start by (priority, arrival),
    whatever order they arrived in."""
    engine = Engine(config(max_num_seqs=1))
    engine.add_request("running", 8, 2, 0.0, ignore_eos=True)
    engine.step(0.0)
    for at, name, priority in [(0.1, "p3", 3), (0.2, "p1-early", 1), (0.3, "p0", 0),
                               (0.4, "p1-late", 1)]:  # fmt: skip
        engine.add_request(name, 8, 2, at, ignore_eos=True, priority=priority)
    assert admission_order(run_until_idle(engine, 0.5)) == ["p0", "p1-early", "p1-late", "p3"]


def test_fcfs_admits_the_same_requests_in_arrival_order() -> None:
    """The same arrivals without priorities under fcfs: arrival order."""
    engine = Engine(config(max_num_seqs=1, scheduling_policy="fcfs"))
    engine.add_request("running", 8, 2, 0.0, ignore_eos=True)
    engine.step(0.0)
    for at, name in [(0.1, "a"), (0.2, "b"), (0.3, "c")]:
        engine.add_request(name, 8, 2, at, ignore_eos=True)
    assert admission_order(run_until_idle(engine, 0.5)) == ["a", "b", "c"]


def kv_squeeze(policy: str) -> list[StepResult]:
    """``old`` (priority 5) then ``new`` (priority 0) decode until their KV (16 blocks of 8)
    runs out: each holds 7 blocks after prefilling 50 tokens, and grows."""
    engine = Engine(config(kv_capacity_tokens=128, scheduling_policy=policy))
    engine.add_request("old", 50, 60, 0.0, ignore_eos=True, priority=5 if policy != "fcfs" else 0)
    engine.step(0.0)
    engine.add_request("new", 50, 60, 0.01, ignore_eos=True)
    return run_until_idle(engine, 0.02)


def test_kv_victim_is_the_lowest_priority_running_sequence_not_the_newest() -> None:
    """Under priority the older low-priority sequence loses its KV; under fcfs the newest."""
    by_priority = [req for r in kv_squeeze("priority") for req in r.preempted]
    by_arrival = [req for r in kv_squeeze("fcfs") for req in r.preempted]
    assert by_priority[0] == "old"
    assert by_arrival[0] == "new"


def test_a_waiting_high_priority_request_never_preempts_a_running_one() -> None:
    """All slots busy with priority-9 requests: a priority-0 arrival waits for a slot
    (vLLM V1 has no admission preemption), then runs first of those waiting."""
    engine = Engine(config(max_num_seqs=2, kv_capacity_tokens=4096))
    for name in ("low-a", "low-b"):
        engine.add_request(name, 8, 5, 0.0, ignore_eos=True, priority=9)
    engine.step(0.0)
    engine.add_request("low-c", 8, 5, 0.05, ignore_eos=True, priority=9)
    engine.add_request("vip", 8, 5, 0.06, ignore_eos=True, priority=0)
    results = run_until_idle(engine, 0.1)
    assert all(not r.preempted for r in results)
    assert admission_order(results) == ["vip", "low-c"]
    finished = [req for r in results for req in r.finished]
    assert finished.index("vip") > finished.index("low-a")


def test_a_preempted_sequence_queues_again_behind_waiting_higher_priority_ones() -> None:
    """The victim goes back in its (priority, arrival) place: a priority-0 request that was
    waiting starts before it, where fcfs would put the victim at the front."""
    engine = Engine(config(kv_capacity_tokens=128, max_num_seqs=2))
    engine.add_request("old", 50, 60, 0.0, ignore_eos=True, priority=5)
    engine.step(0.0)
    engine.add_request("new", 50, 60, 0.01, ignore_eos=True, priority=1)
    first = engine.step(0.01)
    assert first is not None
    assert first.first_token == ["new"]
    engine.add_request("waiter", 8, 3, 0.02, ignore_eos=True, priority=0)
    results = run_until_idle(engine, 0.03)
    preempted_at = next(i for i, r in enumerate(results) if "old" in r.preempted)
    waiter_starts = next(i for i, r in enumerate(results) if "waiter" in r.first_token)
    old_resumes = next(i for i, r in enumerate(results) if i > preempted_at and "old" in r.tokens)
    assert preempted_at < waiter_starts < old_resumes


def test_fcfs_refuses_a_non_zero_priority_as_vllm_does() -> None:
    """vLLM: "Got priority 1 but Priority scheduling is not enabled"."""
    engine = Engine(config(scheduling_policy="fcfs"))
    with pytest.raises(ValueError, match="Priority scheduling is not enabled"):
        engine.add_request("r", 8, 2, 0.0, priority=1)
    engine.add_request("r", 8, 2, 0.0, priority=0)
    assert engine.num_requests_waiting == 1


def test_config_refuses_unknown_policies_and_priority_with_independent_servers() -> None:
    """Only fcfs and priority exist, and independent servers are FCFS."""
    with pytest.raises(ValueError, match="scheduling_policy must be one of"):
        config(scheduling_policy="sjf")
    with pytest.raises(ValueError, match="needs a shared batch"):
        config(batch_independent=True)


def test_aborting_a_waiting_request_removes_it_from_the_priority_queue() -> None:
    """An aborted waiting request never runs; the others keep their order."""
    engine = Engine(config(max_num_seqs=1))
    engine.add_request("running", 8, 2, 0.0, ignore_eos=True)
    engine.step(0.0)
    for name, priority in [("a", 2), ("b", 0), ("c", 1)]:
        engine.add_request(name, 8, 2, 0.1, ignore_eos=True, priority=priority)
    assert engine.abort("c")
    assert engine.num_requests_waiting == 2
    assert admission_order(run_until_idle(engine, 0.2)) == ["b", "a"]


# ------------------------------------------------------------------ invariants


def key(engine: Engine, req_id: str) -> Key:
    """A live request's place in vLLM's order: (priority, arrival, order added)."""
    seq = engine._seqs[req_id]  # the test reads the engine's state to check each step
    return seq.priority, seq.arrival, seq.order


def check_step(engine: Engine, now: float) -> StepResult | None:
    """One step, checked against vLLM V1's priority rules (see the assertions)."""
    running = list(engine._running)
    waiting = {seq.req_id for seq in engine._waiting}
    keys = {req: key(engine, req) for req in waiting | {s.req_id for s in running}}
    computed = [seq.computed for seq in running]
    result = engine.step(now)
    if result is None:
        return None
    # The running pass goes in admission order until its budget or KV stops it, so the
    # sequences that advanced are a prefix of those not preempted.
    advanced = [
        seq.req_id in result.finished or seq.computed > before
        for seq, before in zip(running, computed, strict=True)
        if seq.req_id not in result.preempted
    ]
    assert advanced == sorted(advanced, reverse=True), "a running sequence was skipped"
    after_running = {seq.req_id for seq in engine._running}
    still_waiting = {seq.req_id for seq in engine._waiting} & waiting
    admitted = (after_running | set(result.finished)) & waiting

    # Victims: the largest (priority, arrival) running at the step's start, in turn (ties:
    # the first in the running list, as Python's max in vLLM's scheduler).
    def victim_order(i: int) -> tuple[int, float, int]:
        priority, arrival, _ = keys[running[i].req_id]
        return -priority, -arrival, i

    ranked = sorted(range(len(running)), key=victim_order)
    expected = [running[i].req_id for i in ranked[: len(result.preempted)]]
    assert result.preempted == expected
    assert not set(result.preempted) & set(result.tokens), "a victim emitted a token"
    # No admission in a step that preempted; none skips ahead of a better waiting one.
    if result.preempted:
        assert not admitted
    for a in admitted:
        for w in still_waiting:
            assert keys[a] < keys[w], f"{a} admitted ahead of {w}"
    used = sum(seq.blocks for seq in engine._running)
    assert used + engine._free_blocks == engine.config.num_blocks
    return result


requests = st.lists(
    st.tuples(
        st.floats(0.0, 0.5), st.integers(1, 120), st.integers(1, 60), st.integers(0, 3)
    ),
    min_size=1, max_size=40,
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(requests, st.booleans(), st.integers(0, 2**16))
def test_every_step_follows_the_priority_rules(
    arrivals: list[tuple[float, int, int, int]], chunked: bool, seed: int
) -> None:
    """Random arrivals with priorities 0–3 on a KV-starved engine: every step's victims are
    the largest (priority, arrival) running, in turn; a step that preempts admits nobody;
    no admitted request had a better one still waiting; KV blocks add up; every request
    ends with exactly its tokens."""
    cfg = config(enable_chunked_prefill=chunked, max_num_batched_tokens=64 if chunked else 256)
    engine = Engine(cfg, seed=seed)
    pending = sorted(enumerate(arrivals), key=lambda item: item[1][0])
    targets: dict[str, int] = {}
    emitted: dict[str, int] = {}
    now = 0.0
    for _ in range(100_000):
        while pending and pending[0][1][0] <= now:
            index, (at, prompt, max_tokens, priority) = pending.pop(0)
            name = f"r{index}"
            engine.add_request(name, prompt, max_tokens, at, ignore_eos=True, priority=priority)
            targets[name] = max_tokens
        result = check_step(engine, now)
        if result is None:
            if not pending:
                break
            now = pending[0][1][0]
            continue
        for req, count in result.tokens.items():
            emitted[req] = emitted.get(req, 0) + count
        now += result.duration_s
    assert engine.is_idle
    assert emitted == targets


def test_equal_priorities_without_kv_pressure_run_exactly_as_fcfs() -> None:
    """An fcfs engine and a priority engine given the same requests, all of priority 0 and
    arriving in order, with KV to spare: the same steps, tokens and finishes."""
    rng = random.Random(7)
    sizes = [(rng.randint(1, 60), rng.randint(1, 20)) for _ in range(30)]
    orders = []
    for policy in ("fcfs", "priority"):
        engine = Engine(config(kv_capacity_tokens=1 << 16, scheduling_policy=policy), seed=3)
        results: list[StepResult] = []
        now = 0.0
        for i, (prompt, max_tokens) in enumerate(sizes):
            engine.add_request(f"r{i}", prompt, max_tokens, now)
            if (result := engine.step(now)) is not None:
                results.append(result)
                now += result.duration_s
        results += run_until_idle(engine, now)
        orders.append([(r.duration_s, r.tokens, r.finished) for r in results])
    assert orders[0] == orders[1]
