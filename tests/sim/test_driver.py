"""The simulator drives the real scheduler and engines faithfully (DESIGN §12).

Scenarios run on the ``tiny`` engine preset with small scheduler caps so that
queues form and policies matter, and finish in about a second each.
"""

from __future__ import annotations

import dataclasses
from array import array
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.core.spec import BackendSpec, LaneSpec, ModelSpec, SchedulerSpec, TenantSpec
from sluicegate.core.ticket import Outcome
from sluicegate.engine import Engine, StepResult, preset
from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim import replica as replica_module
from sluicegate.sim.events import ChainPoint, EventQueue
from sluicegate.sim.live import SimRequest
from sluicegate.sim.replica import Replica
from sluicegate.sim.result import TOO_LARGE, SimResult
from sluicegate.sim.run_summary import summarize
from sluicegate.sim.virtual_driver import simulate, with_replicas

TINY = preset("tiny")
OUTCOMES = {o.value for o in Outcome} | {TOO_LARGE}


def lane(name: str = "main", **fields: Any) -> LaneSpec:
    """A lane that never expires, sheds or preempts unless ``fields`` say so."""
    defaults: dict[str, Any] = {
        "max_concurrency": 8,
        "max_queue": 100_000,
        "queue_timeout_s": 1e6,
        "slo_ms": 1e9,
        "policy": "fifo",
        "preemptible": "never",
    }
    return LaneSpec(name=name, **{**defaults, **fields})


def spec(*lanes: LaneSpec, cap: int = 8, tenants: Sequence[TenantSpec] = ()) -> SchedulerSpec:
    """One model ``m`` with ``lanes`` (default one ``main`` lane) and model cap ``cap``."""
    model = ModelSpec(name="m", lanes=lanes or (lane(),), max_concurrency=cap)
    return SchedulerSpec(models=(model,), tenants=tuple(tenants))


def poisson(rate: float, n: int, seed: int, **fields: Any) -> list[WorkloadRequest]:
    """``n`` Poisson arrivals; sizes drawn per request unless ``fields`` fix them."""
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1.0 / rate, n))
    out = []
    for at in times:
        request: dict[str, Any] = {"prompt_tokens": int(rng.integers(50, 300)), "lane": "main"}
        request.update(fields)
        output = request.setdefault("output_tokens", int(rng.integers(10, 60)))
        request.setdefault("max_tokens", max(64, output))
        out.append(WorkloadRequest(arrival_s=float(at), **request))
    return out


def with_policy(base: SchedulerSpec, policy: str) -> SchedulerSpec:
    """Every lane of ``base`` set to ``policy``."""
    model = base.models[0]
    lanes = tuple(ln.model_copy(update={"policy": policy}) for ln in model.lanes)
    return base.model_copy(update={"models": (model.model_copy(update={"lanes": lanes}),)})


def run(base: SchedulerSpec, workload: list[WorkloadRequest], **kwargs: Any) -> SimResult:
    """Simulate on one ``tiny`` replica unless ``kwargs`` say otherwise."""
    options: dict[str, Any] = {"engine": TINY, "replicas": 1}
    options.update(kwargs)
    return simulate(base, "m", workload, **options)


# ---------------------------------------------------------------- bookkeeping


def mixed_trouble() -> tuple[SchedulerSpec, list[WorkloadRequest]]:
    """Rate limits, a short queue, timeouts and priority preemption all at once."""
    base = spec(
        lane(max_concurrency=2, max_queue=6, queue_timeout_s=1.5, preemptible="priority"),
        cap=2,
        tenants=[TenantSpec(name="limited", requests_per_s=0.5, burst_requests=1.0)],
    )
    urgent = poisson(4.0, 150, seed=1, priority=0, deadline_ms=400.0, output_tokens=20)
    background = poisson(2.5, 80, seed=2, priority=5, output_tokens=600, max_tokens=800)
    limited = poisson(2.0, 40, seed=3, tenant="limited")
    workload = sorted(urgent + background + limited, key=lambda w: w.arrival_s)
    return base, workload


def test_every_request_ends_with_exactly_one_known_outcome() -> None:
    """One record per request, each with one outcome, and every kind of ending occurs."""
    base, workload = mixed_trouble()
    result = run(base, workload)
    assert [rec.index for rec in result.records] == list(range(len(workload)))
    assert all(rec.outcome in OUTCOMES and rec.finish_s is not None for rec in result.records)
    seen = {rec.outcome for rec in result.records}
    assert {
        "completed",
        "preempted",
        "expired",
        "rejected_rate_limit",
        "rejected_queue_full",
    } <= seen


def test_record_times_are_ordered_and_tokens_add_up() -> None:
    """arrival ≤ admit ≤ first token ≤ finish; completed requests generated all their tokens."""
    base, workload = mixed_trouble()
    for rec in run(base, workload).records:
        assert rec.finish_s is not None
        assert rec.arrival_s <= rec.finish_s
        if rec.outcome == "completed":
            assert rec.admit_s is not None
            assert rec.first_token_s is not None
            assert rec.arrival_s <= rec.admit_s <= rec.first_token_s <= rec.finish_s
            assert rec.generated_tokens == rec.output_tokens
        elif rec.outcome == "preempted":
            assert rec.generated_tokens < rec.output_tokens
        else:
            assert rec.admit_s is None
            assert rec.generated_tokens == 0


request_strategy = st.builds(
    WorkloadRequest,
    arrival_s=st.floats(0.0, 5.0),
    prompt_tokens=st.integers(1, 400),
    output_tokens=st.integers(1, 200),
    max_tokens=st.integers(200, 300),
    tenant=st.sampled_from(["default", "limited"]),
    lane=st.just("main"),
    priority=st.integers(0, 5),
    deadline_ms=st.none() | st.floats(50.0, 5000.0),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(request_strategy, max_size=40), st.integers(1, 3))
def test_any_workload_ends_every_request_once_in_order(
    workload: list[WorkloadRequest], replicas: int
) -> None:
    """Whatever arrives, each request gets one outcome and its times are ordered."""
    base, _ = mixed_trouble()
    records = run(base, workload, replicas=replicas).records
    assert len(records) == len(workload)
    for rec in records:
        assert rec.outcome in OUTCOMES
        assert rec.finish_s is not None
        times = [rec.arrival_s, rec.admit_s, rec.first_token_s, rec.finish_s]
        present = [t for t in times if t is not None]
        assert present == sorted(present)
        if rec.outcome == "completed":
            assert rec.generated_tokens == rec.output_tokens


class RecordingEngine(Engine):
    """An ``Engine`` that remembers which requests were aborted."""

    aborted: ClassVar[list[str]] = []

    def abort(self, req_id: str, *, now: float | None = None) -> bool:
        """Record, then abort."""
        RecordingEngine.aborted.append(req_id)
        return super().abort(req_id, now=now)


def test_preempt_decisions_reach_the_engine_as_aborts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each preempted request was aborted on its engine, and nothing else was."""
    RecordingEngine.aborted = []
    monkeypatch.setattr(replica_module, "Engine", RecordingEngine)
    base, workload = mixed_trouble()
    result = run(base, workload)
    preempted = sorted(str(rec.index) for rec in result.records if rec.outcome == "preempted")
    assert preempted
    assert sorted(RecordingEngine.aborted) == preempted


def test_requeued_requests_run_again_and_complete() -> None:
    """With ``preempt_action: requeue`` a preempted request goes back to its queue and finishes."""
    base, workload = mixed_trouble()
    model = base.models[0]
    requeue = model.lanes[0].model_copy(update={"preempt_action": "requeue", "max_requeues": 5})
    base = base.model_copy(
        update={"models": (model.model_copy(update={"lanes": (requeue,)}),), "tenants": ()}
    )
    records = run(base, workload).records
    rerun = [rec for rec in records if rec.requeues > 0]
    assert rerun
    assert any(rec.outcome == "completed" for rec in rerun)
    assert all(rec.outcome != "preempted" for rec in records)


def test_engine_batch_never_exceeds_max_num_seqs() -> None:
    """With scheduler caps above the engine's, the engine queues and its batch stays ≤ max."""
    config = dataclasses.replace(TINY, max_num_seqs=4)
    workload = poisson(40.0, 400, 4)
    result = run(
        spec(lane(max_concurrency=16), cap=16), workload, engine=config, scrape_interval_s=0.05
    )
    peaks = [max(sample) for sample in result.samples.running]
    assert max(peaks) == 4
    assert max(max(sample) for sample in result.samples.waiting) > 0
    assert all(rec.outcome == "completed" for rec in result.records)


def test_kv_exhaustion_preempts_inside_the_engine_without_losing_requests() -> None:
    """A KV cache too small for the batch forces recompute preemptions; all still complete.
    The gateway's token budget (derived from the KV capacity by default) is turned off so
    the engine, not the gateway, meets the shortage."""
    config = dataclasses.replace(TINY, max_num_seqs=16, kv_capacity_tokens=2048)
    workload = poisson(30.0, 200, 5, output_tokens=120, max_tokens=200)
    base = spec(lane(max_concurrency=16), cap=16)
    (model,) = base.models
    unbounded = base.model_copy(
        update={"models": (model.model_copy(update={"max_inflight_tokens": None}),)}
    )
    result = run(unbounded, workload, engine=config)
    assert result.engine_preemptions > 0
    assert all(rec.outcome == "completed" for rec in result.records)
    assert all(rec.generated_tokens == 120 for rec in result.records)


def test_requests_arriving_together_share_the_first_step() -> None:
    """Simultaneous arrivals at an idle replica are prefilled in one step: same first-token time."""
    workload = [WorkloadRequest(1.0, 100, 5, 5, lane="main") for _ in range(4)]
    first = {rec.first_token_s for rec in run(spec(), workload).records}
    assert len(first) == 1
    assert first != {None}


def test_a_request_too_large_for_the_engine_is_refused_at_once() -> None:
    """prompt + max_tokens beyond the KV capacity: outcome ``too_large``, never admitted."""
    huge = WorkloadRequest(0.5, TINY.kv_capacity_tokens, 10, 10, lane="main")
    workload = [*poisson(5.0, 5, 6), huge]
    records = run(spec(), workload).records
    assert records[-1].outcome == TOO_LARGE
    assert records[-1].admit_s is None
    assert records[-1].finish_s == 0.5
    assert all(rec.outcome == "completed" for rec in records[:-1])


def test_an_unknown_lane_is_an_error_before_anything_runs() -> None:
    """A workload lane the model lacks raises ``ValueError`` naming it."""
    with pytest.raises(ValueError, match="nowhere"):
        run(spec(), [WorkloadRequest(0.0, 10, 5, 5, lane="nowhere")])


def test_replicas_get_backends_named_r0_to_rn() -> None:
    """``with_replicas`` replaces the model's backends and keeps a configured backend cap."""
    model = ModelSpec(name="m", backends=(BackendSpec(name="gpu", max_concurrency=3),))
    built = with_replicas(SchedulerSpec(models=(model,)), "m", 3).models[0]
    assert [b.name for b in built.backends] == ["r0", "r1", "r2"]
    assert {b.max_concurrency for b in built.backends} == {3}


def test_work_spreads_over_replicas() -> None:
    """With four replicas every replica serves requests."""
    result = run(spec(cap=32), poisson(30.0, 300, 7), replicas=4)
    assert {rec.replica for rec in result.records} == {"r0", "r1", "r2", "r3"}


def test_same_inputs_give_identical_records_and_samples() -> None:
    """The simulation is deterministic."""
    base, workload = mixed_trouble()
    first, second = run(base, workload), run(base, workload)
    assert first.records == second.records
    assert first.samples == second.samples


def test_progress_reports_virtual_time_up_to_the_end() -> None:
    """Progress sees non-decreasing virtual times; the last is within a scrape of ``end_s``."""
    seen: list[float] = []
    result = run(spec(), poisson(10.0, 100, 8), progress=seen.append)
    assert seen == sorted(seen)
    assert result.end_s <= seen[-1] < result.end_s + 1.0
    assert len(seen) > 2


def test_an_abort_drops_the_tokens_of_the_step_in_flight() -> None:
    """Tokens of a step not yet applied are not counted as produced when a request is aborted."""
    replica = Replica(0, "r0", TINY, 0, EventQueue())
    request = SimRequest(0, WorkloadRequest(0.0, 20, 50, 50))
    replica.add(request, 0.0)
    results = [replica.start_step(step * 0.01) for step in range(3)]
    assert results[-1] is not None
    replica.inflight[1] = results[-1]
    assert replica.engine.generated(request.eid) == 3
    assert replica.abort(request, 0.025) == 2
    assert request.eid not in replica.running


def test_busy_and_slot_time_count_overlapping_steps_once() -> None:
    """Busy time is the union of the steps' intervals, slot time that weighed by the batch;
    a step started where the last ended adds its whole duration."""
    replica = Replica(0, "r0", TINY, 0, EventQueue())
    replica.add(SimRequest(0, WorkloadRequest(0.0, 20, 50, 50)), 0.0)
    first = replica.start_step(0.0)
    assert first is not None
    second = replica.start_step(first.duration_s / 2)  # starts while the first is in flight
    third = replica.start_step(10.0)  # after an idle gap
    assert second is not None
    assert third is not None
    fourth = replica.start_step(replica.busy_until, contiguous=True)
    assert fourth is not None
    union = max(first.duration_s, first.duration_s / 2 + second.duration_s)
    union += third.duration_s + fourth.duration_s
    assert replica.busy_s == pytest.approx(union, rel=1e-12)
    assert replica.slot_s == pytest.approx(union, rel=1e-12)  # one sequence in every step
    assert replica.busy_until == 10.0 + third.duration_s + fourth.duration_s


# ---------------------------------------------------------------- policies


def chat_and_documents(seed: int) -> list[WorkloadRequest]:
    """Short chat turns (75%, 3 s deadline) mixed with long documents, ~85% load."""
    rng = np.random.default_rng(seed)
    chat = poisson(13.5, 1350, seed, tenant="chat", deadline_ms=3000.0)
    docs = [
        WorkloadRequest(
            w.arrival_s + 1e-6, w.prompt_tokens, int(rng.integers(300, 700)), 1024,
            tenant="docs", lane="main", deadline_ms=60_000.0,
        )
        for w in poisson(4.5, 450, seed + 1)
    ]  # fmt: skip
    return sorted(chat + docs, key=lambda w: w.arrival_s)


@pytest.fixture(scope="module")
def chat_results() -> dict[str, SimResult]:
    """The chat-and-documents mix under fifo, sjf and slack."""
    workload = chat_and_documents(1)
    return {p: run(with_policy(spec(), p), workload) for p in ("fifo", "sjf", "slack")}


@pytest.mark.parametrize("policy", ["sjf", "slack"])
def test_size_aware_policies_cut_short_requests_p99(
    chat_results: dict[str, SimResult], policy: str
) -> None:
    """sjf and slack serve short chat turns ahead of long documents: chat p99 e2e falls ≥ 1.5×.

    Both see the difference (sjf through the predictor's per-``max_tokens``
    output estimate, slack through the tighter chat deadline), whereas fifo
    makes a chat turn wait behind every document that arrived before it.
    """
    fifo = summarize(chat_results["fifo"]).tenants["chat"].e2e.p99
    better = summarize(chat_results[policy]).tenants["chat"].e2e.p99
    assert fifo is not None
    assert better is not None
    assert better * 1.5 < fifo


def noisy_neighbour(seed: int) -> list[WorkloadRequest]:
    """A quiet tenant (2 req/s) and a noisy one sending bursts of 120 requests every 30 s."""
    rng = np.random.default_rng(seed)
    quiet = poisson(2.0, 500, seed, tenant="quiet", max_tokens=128)
    bursts = [
        WorkloadRequest(float(at), 200, int(rng.integers(50, 150)), 256, "noisy", "main")
        for start in np.arange(5.0, 240.0, 30.0)
        for at in start + np.sort(rng.uniform(0.0, 1.0, 120))
    ]
    return sorted([w for w in quiet if w.arrival_s < 240.0] + bursts, key=lambda w: w.arrival_s)


def test_fair_sharing_shields_a_quiet_tenant_from_a_noisy_one() -> None:
    """Under ``fair`` the quiet tenant's p99 e2e is far below its p99 under ``fifo``."""
    workload = noisy_neighbour(3)
    base = spec(lane(max_concurrency=4), cap=4)
    p99 = {
        policy: summarize(run(with_policy(base, policy), workload)).tenants["quiet"].e2e.p99
        for policy in ("fifo", "fair")
    }
    assert p99["fifo"] is not None
    assert p99["fair"] is not None
    assert p99["fair"] * 3 < p99["fifo"]


def test_oracle_mean_latency_is_no_worse_than_sjf() -> None:
    """Knowing true lengths beats predicting them: oracle mean e2e < sjf mean e2e.

    All requests share one ``max_tokens``, so the predictor cannot tell them
    apart and sjf degenerates to arrival order, while oracle runs the truly
    short ones first.
    """
    rng = np.random.default_rng(2)
    outputs = [min(1024, int(np.ceil(x))) for x in rng.exponential(150.0, 3000)]
    workload = [
        WorkloadRequest(w.arrival_s, w.prompt_tokens, o, 1024, lane="main")
        for w, o in zip(poisson(18.0, 3000, 2), outputs, strict=True)
    ]
    mean = {
        policy: summarize(run(with_policy(spec(), policy), workload)).overall.e2e.mean
        for policy in ("sjf", "oracle")
    }
    assert mean["sjf"] is not None
    assert mean["oracle"] is not None
    assert mean["oracle"] < mean["sjf"]


# ---------------------------------------------------------------- decode runs


def step_by_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every engine refuse decode runs, so the driver posts one event per step."""
    monkeypatch.setattr(Engine, "plan_decode", lambda self, max_steps: None)


def same_result(first: SimResult, second: SimResult) -> None:
    """Records, samples, busy and slot times and step counts all agree exactly."""
    assert first.records == second.records
    assert first.samples == second.samples
    assert (first.busy_s, first.slot_s) == (second.busy_s, second.slot_s)
    assert (first.engine_steps, first.end_s) == (second.engine_steps, second.end_s)
    assert first == second


def test_decode_runs_are_used_and_change_nothing_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """Skipping pure-decode step events (with preemptions, expiries, ties and scrapes cutting
    runs short on three replicas) gives exactly the step-by-step result."""
    base, workload = mixed_trouble()
    together = [WorkloadRequest(2.0, 50, 30, 30, lane="main") for _ in range(6)]
    workload = sorted(workload + together, key=lambda w: w.arrival_s)
    advanced: list[int] = []
    advance = Engine.advance_decode

    def counting(self: Engine, run: Any, steps: int, now: float) -> None:
        advanced.append(steps)
        advance(self, run, steps, now)

    with monkeypatch.context() as patch:
        patch.setattr(Engine, "advance_decode", counting)
        fast = run(base, workload, replicas=3, scrape_interval_s=0.1)
    assert max(advanced) > 1
    step_by_step(monkeypatch)
    same_result(fast, run(base, workload, replicas=3, scrape_interval_s=0.1))


@settings(max_examples=25, deadline=None)
@given(st.lists(request_strategy, max_size=30), st.integers(1, 3))
def test_any_workload_gives_the_same_result_with_and_without_decode_runs(
    workload: list[WorkloadRequest], replicas: int
) -> None:
    """Decode runs are invisible in every simulation result."""
    base, _ = mixed_trouble()
    fast = run(base, workload, replicas=replicas, scrape_interval_s=0.2)
    with pytest.MonkeyPatch.context() as patch:
        step_by_step(patch)
        slow = run(base, workload, replicas=replicas, scrape_interval_s=0.2)
    same_result(fast, slow)


def test_an_arrival_exactly_at_a_step_boundary_inside_a_run_joins_the_step_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A boundary at the arrival's instant counts as passed (steps sort before arrivals), as
    step by step: the late request's first token is no earlier than the step after next."""
    engine = Engine(TINY, seed=0)  # replica r0's twin: its step boundaries, chained the same way
    engine.add_request("0", 100, 60, 1.0, output_tokens=40)
    boundaries = [1.0]
    for _ in range(6):
        step = engine.step(boundaries[-1])
        assert isinstance(step, StepResult)
        boundaries.append(boundaries[-1] + step.duration_s)
    late = WorkloadRequest(boundaries[5], 20, 5, 5, lane="main")
    workload = [WorkloadRequest(1.0, 100, 40, 60, lane="main"), late]
    fast = run(spec(), workload)
    first_token = fast.records[1].first_token_s
    assert first_token is not None
    assert first_token > boundaries[6]
    step_by_step(monkeypatch)
    same_result(fast, run(spec(), workload))


def test_replicas_stepping_in_lockstep_keep_their_order_through_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Identical work started at one instant gives replicas step boundaries that tie exactly;
    with runs cut short by frequent scrapes, tied completions still come in step-by-step order
    (the wake order), so completions reach the scheduler in the same order."""
    base = spec(lane(max_concurrency=4, preemptible="priority"), cap=4)
    workload = [
        WorkloadRequest(at, prompt, output, output, lane="main", priority=priority)
        for at, prompt, output, priority in [
            (0.05, 127, 79, 0), (0.05, 127, 79, 0), (0.35, 26, 41, 2), (0.35, 26, 41, 0),
            (0.65, 27, 18, 1), (0.65, 27, 18, 1), (0.65, 27, 18, 2), (0.65, 196, 17, 0),
            (1.0, 104, 75, 1), (1.0, 104, 75, 0), (1.0, 104, 75, 1), (1.3, 45, 31, 0),
            (1.4, 114, 76, 0), (1.4, 114, 76, 2), (1.7, 72, 22, 0), (1.7, 72, 22, 2),
        ]
    ]  # fmt: skip
    fast = run(base, workload, replicas=3, scrape_interval_s=0.05)
    ties = {rec.finish_s for rec in fast.records}
    assert len(ties) < len(workload)  # some requests finish at the very same instant
    step_by_step(monkeypatch)
    same_result(fast, run(base, workload, replicas=3, scrape_interval_s=0.05))


def test_an_admission_at_a_tied_step_boundary_of_another_replica_matches_step_by_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With every step lasting base_s, all replicas' boundaries coincide; a request admitted
    when another replica finishes lands on a replica inside a run, whose boundary at that
    instant counts as passed exactly when its completion would have been handled first."""
    flat = dataclasses.replace(
        TINY, base_s=0.0032, per_prefill_token_s=0.0, per_decode_seq_s=0.0, per_kv_token_s=0.0
    )
    workload = [
        WorkloadRequest(0.0, 31, 48, 128, lane="main", priority=1),
        WorkloadRequest(0.0, 31, 48, 48, lane="main", priority=2),
        *(WorkloadRequest(0.0, 158, 22, 128, lane="main", priority=2) for _ in range(3)),
    ]
    base = spec(lane(max_concurrency=4), cap=4)
    fast = run(base, workload, replicas=3, engine=flat)
    step_by_step(monkeypatch)
    same_result(fast, run(base, workload, replicas=3, engine=flat))


def point(history: list[float], origin: tuple[float, int] = (0.0, 1)) -> ChainPoint:
    """The completion of a chain's latest step (started at ``history[-1]``)."""
    return ChainPoint(array("d", history), len(history) - 1, origin)


def test_tied_completions_come_in_the_order_of_the_steps_that_posted_them() -> None:
    """Same end, same start: the chain whose previous step started first was handled first
    at that start, so it posted first."""
    early, late = point([0.0, 0.05, 0.2]), point([0.0, 0.1, 0.2])
    assert early < late
    assert not late < early


def test_a_chain_just_woken_posts_after_a_chain_already_stepping() -> None:
    """At one instant, step completions are handled before wakes: the stepping chain posts first."""
    stepping, woken = point([0.1, 0.2]), point([0.2])
    assert stepping < woken
    assert not woken < stepping


def test_chains_identical_since_their_wakes_keep_the_wake_order() -> None:
    """Lockstep chains tie all the way back; their wakes' heap order decides."""
    first, second = point([0.0, 0.1], (0.0, 7)), point([0.0, 0.1], (0.0, 8))
    assert first < second
    assert not second < first
