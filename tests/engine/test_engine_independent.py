"""batch_independent mode: max_num_seqs independent servers with solo service times."""

from __future__ import annotations

import itertools

import pytest

from sluicegate.engine import Engine, preset
from tests.engine.engine_harness import Arrival, drive

CFG = preset("independent")


def test_independent_preset_models_independent_servers() -> None:
    """The `independent` preset sets batch_independent."""
    assert CFG.batch_independent


def test_service_time_alone_is_prefill_plus_decode_time() -> None:
    """Alone, a request finishes solo_service_s after it arrives: 0.01 s per token + prefill."""
    trace = drive(Engine(CFG), [Arrival(0.0, "r", 100, 50, ignore_eos=True)])
    assert trace.finish_time("r") == pytest.approx(CFG.solo_service_s(100, 50))
    assert CFG.solo_service_s(100, 50) == pytest.approx(0.01 * 50 + 1e-5 * 100)


def test_service_time_is_the_same_under_load() -> None:
    """With the other servers busy, a request's service time and token gaps do not change."""
    focal = Arrival(0.05, "focal", 100, 50, ignore_eos=True)
    others = [Arrival(0.003 * i, f"o{i}", 10 + 40 * i, 30 + 11 * i) for i in range(7)]
    alone = drive(Engine(CFG), [focal])
    loaded = drive(Engine(CFG), [focal, *others])
    assert loaded.finish_time("focal") - focal.at == pytest.approx(CFG.solo_service_s(100, 50))
    assert loaded.token_times("focal") == pytest.approx(alone.token_times("focal"))


def test_step_time_does_not_grow_with_the_number_running() -> None:
    """Token gaps of one request are one solo decode step, however many others run."""
    arrivals = [Arrival(0.0, f"r{i}", 10, 40, ignore_eos=True) for i in range(8)]
    times = drive(Engine(CFG), arrivals).token_times("r0")
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps == pytest.approx([CFG.step_s(0, 1, 0)] * 39)


def test_a_request_beyond_the_servers_starts_when_the_first_server_frees() -> None:
    """FCFS with c servers: request c+1 starts exactly when the earliest one finishes."""
    c = CFG.max_num_seqs
    arrivals = [Arrival(0.0, f"r{i}", 10, 20 + i, ignore_eos=True) for i in range(c)]
    arrivals.append(Arrival(0.0, "late", 10, 5, ignore_eos=True))
    engine = Engine(CFG)
    trace = drive(engine, arrivals)
    start = trace.finish_time("r0")
    assert trace.finish_time("late") == pytest.approx(start + CFG.solo_service_s(10, 5))


def test_queue_counts_while_all_servers_are_busy() -> None:
    """Requests beyond max_num_seqs wait; the running count is capped at max_num_seqs."""
    engine = Engine(CFG)
    for i in range(CFG.max_num_seqs + 3):
        engine.add_request(f"r{i}", 10, 10, 0.0, ignore_eos=True)
    assert (engine.num_requests_running, engine.num_requests_waiting) == (CFG.max_num_seqs, 3)


def test_a_late_step_call_does_not_delay_the_start() -> None:
    """A request starts at its arrival even if step is first called later; overdue tokens
    come at once (zero-length steps) and the finish stays on schedule."""
    engine = Engine(CFG)
    engine.add_request("r", 10, 30, 0.0, ignore_eos=True)
    now, finish = 0.1, None
    while (result := engine.step(now)) is not None:
        now += result.duration_s
        if result.finished:
            finish = now
    assert finish == pytest.approx(CFG.solo_service_s(10, 30))


def test_abort_frees_the_server_at_the_abort_time() -> None:
    """An aborted request's server takes the next waiting request from the abort time."""
    engine = Engine(CFG)
    for i in range(CFG.max_num_seqs + 1):
        engine.add_request(f"r{i}", 10, 100, 0.0, ignore_eos=True)
    assert engine.abort("r0", now=0.2) is True
    assert engine.num_requests_waiting == 0
    now, finish = 0.2, None
    while finish is None and (result := engine.step(now)) is not None:
        now += result.duration_s
        if "r8" in result.finished:
            finish = now
    assert finish == pytest.approx(0.2 + CFG.solo_service_s(10, 100))
