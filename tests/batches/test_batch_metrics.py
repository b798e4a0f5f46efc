"""The batch lane's metrics and ``/admin/state`` count what really happened to the lines."""

from __future__ import annotations

import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.batches.batch_harness import batch_stack, chat_line, client, start_batch, wait_batch
from tests.gateway.gateway_harness import ADMIN_KEY, MODEL, Stack, engine_config, http_call


def _samples(live: Stack) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    reply = http_call(live.base_url, "GET", "/metrics")
    assert reply.status == 200
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(reply.body.decode())
        for sample in family.samples
    }


def _value(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _batches_state(live: Stack) -> dict[str, object]:
    reply = http_call(live.base_url, "GET", "/admin/state", key=ADMIN_KEY)
    assert reply.status == 200
    state: dict[str, object] = reply.json()["batches"]
    return state


def test_line_gauges_add_up_while_a_batch_runs_and_outcomes_are_counted(tmp_path: Path) -> None:
    """While a batch of 80 runs on a slow engine, its lines per state (queued, running,
    completed, failed) add up to 80 in both ``sluicegate_batch_lines`` and ``/admin/state``,
    and ``sluicegate_batches`` shows it ``in_progress``; once it has ended, the batch is
    ``completed`` and ``sluicegate_batch_line_runs_total`` counts 79 completed runs and one
    failed (the line whose temperature is a string: the gateway answers it 400)."""
    lines = [chat_line(f"c{i}", max_tokens=24) for i in range(79)]
    lines.append(chat_line("bad", max_tokens=24, temperature="hot"))
    settings = "  max_inflight: 4\n  poll_interval_s: 0.05\n"
    with batch_stack(tmp_path, settings=settings, engine=engine_config(max_num_seqs=4)) as live:
        sdk = client(live)
        batch = start_batch(sdk, lines)
        wait_batch(
            sdk,
            batch.id,
            until=lambda b: b.request_counts is not None and b.request_counts.completed >= 4,
        )
        samples = _samples(live)
        states = {
            state: _value(samples, "sluicegate_batch_lines", model=MODEL, state=state)
            for state in ("queued", "running", "completed", "failed")
        }
        assert sum(states.values()) == 80, states
        assert _value(samples, "sluicegate_batches", status="in_progress") == 1
        seen = _batches_state(live)
        lines_state = seen["lines"]
        assert isinstance(lines_state, dict)
        assert sum(lines_state[MODEL].values()) == 80
        ended = wait_batch(sdk, batch.id)
        assert ended.status == "completed"
        assert ended.request_counts is not None
        assert (ended.request_counts.completed, ended.request_counts.failed) == (79, 1)
        runs = "sluicegate_batch_line_runs_total"
        samples = _samples(live)
        assert _value(samples, runs, model=MODEL, outcome="completed") == 79
        assert _value(samples, runs, model=MODEL, outcome="failed") == 1
        # The gauges are read from the database every poll (0.05 s): within a few polls
        # they show the batch completed and no line of an unfinished batch.
        deadline = time.monotonic() + 5.0
        while _value(samples, "sluicegate_batches", status="completed") != 1:
            assert time.monotonic() < deadline, "sluicegate_batches never showed it completed"
            time.sleep(0.05)
            samples = _samples(live)
        assert _value(samples, "sluicegate_batches", status="in_progress") == 0
        assert not [k for k in samples if k[0] == "sluicegate_batch_lines" and samples[k]]
        assert _batches_state(live)["batches"] == {
            "validating": 0, "in_progress": 0, "finalizing": 0, "completed": 1,
            "failed": 0, "expired": 0, "cancelling": 0, "cancelled": 0,
        }  # fmt: skip
