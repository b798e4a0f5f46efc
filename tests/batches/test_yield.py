"""Yielding (issue 17): a batch that fills every slot gives them back to interactive work.

One real gateway and one emulated engine on loopback. The model has four slots;
the ``interactive`` lane owns all four and lends them, ``best_effort`` owns one
and borrows the rest, so a batch (``batches.max_inflight`` 6: four lines running,
two waiting) keeps every slot busy. Each interactive request then arrives with
batch lines queued ahead of it in ``best_effort`` and every slot taken by a
batch line. The facts checked (never a latency):

(a) the interactive request is admitted before every batch line that was
    waiting when it arrived (no ``best_effort`` admission between);
(b) it gets its slot by preempting a batch line (``sluicegate_requests_total``
    outcome ``preempted`` in ``best_effort`` and
    ``sluicegate_batch_line_runs_total{outcome="preempted"}`` both count it);
(c) every preempted line runs again: the output holds one full answer per
    ``custom_id``, status 200, and ``request_counts.completed`` is the total;
(d) the batch's usage counts each line once: ``usage.output_tokens`` is the sum
    of the output lines' ``completion_tokens``, not what the preempted runs added.
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.gateway_harness import (
    MODEL,
    Stack,
    http_call,
    lane_state,
    read_events,
    stack,
    wait_until,
)

SLOTS = 4
LINES = 12
LINE_TOKENS = 1000
"""Long enough (~2.5 s on the tiny engine) that batch lines hold their slots while a
round runs, short enough that the whole batch ends in seconds."""
ROUNDS = 3
MAX_TRIES = 8
"""Rounds tried to get ROUNDS conclusive ones (a batch line that ends by itself during a
round makes it inconclusive: its slot may rightly go to a waiting line)."""
INTERACTIVE_TOKENS = 200
"""Long enough to still hold its slot while the test reads the metrics."""


def _config(db: Path, hold_s: float = 0.0) -> str:
    """The model's lanes and the batch lane; ``hold_s`` is ``batches.yield_hold_s`` (0 here:
    a preempted line's place is refilled at once, so every round starts saturated)."""
    return f"""\
    max_concurrency: {SLOTS}
    max_inflight_tokens: off
    lanes:
      - {{name: interactive, max_concurrency: {SLOTS}, max_queue: 16, policy: fifo,
          preemptible: never}}
      - {{name: best_effort, max_concurrency: 1, max_queue: 64, policy: fifo,
          preemptible: always}}
batches:
  path: {db}
  poll_interval_s: 0.05
  max_inflight: {SLOTS + 2}
  yield_hold_s: {hold_s}
"""


def _batch_input() -> bytes:
    lines = [
        orjson.dumps(
            {
                "custom_id": f"line-{i}",
                "method": "POST",
                "url": "/v1/completions",
                "body": {
                    "model": MODEL,
                    "prompt": f"batch line {i}",
                    "max_tokens": LINE_TOKENS,
                    "ignore_eos": True,
                },
            }
        )
        for i in range(LINES)
    ]
    return b"\n".join(lines) + b"\n"


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _samples(base_url: str) -> Samples:
    text = http_call(base_url, "GET", "/metrics").body.decode()
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = float(sample.value)
    return found


def _value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def _batch_lane_counts(base_url: str) -> dict[str, float]:
    """What the batch lane has been through so far: admissions and ends by outcome."""
    samples = _samples(base_url)
    counts = {
        "admitted": _value(
            samples, "sluicegate_queue_wait_seconds_count", model=MODEL, lane="best_effort"
        ),
        "line_preempted": _value(
            samples, "sluicegate_batch_line_runs_total", model=MODEL, outcome="preempted"
        ),
    }
    for outcome in ("completed", "preempted", "failed", "expired", "cancelled"):
        counts[outcome] = _value(
            samples, "sluicegate_requests_total", model=MODEL, lane="best_effort", outcome=outcome
        )
    return counts


def _saturated(base_url: str) -> bool:
    """Every slot runs a batch line and at least one more waits behind them."""
    batch = lane_state(base_url, "best_effort")
    interactive = lane_state(base_url, "interactive")
    return batch["running"] == SLOTS and batch["queued"] >= 1 and interactive["running"] == 0


async def _interactive(base_url: str) -> tuple[dict[str, float], list[bytes]]:
    """One streamed interactive request: the batch lane's counts once its first token came
    (it holds its slot then), and its payloads."""
    body = {
        "model": MODEL, "prompt": "hello", "max_tokens": INTERACTIVE_TOKENS,
        "ignore_eos": True, "stream": True,
    }  # fmt: skip
    headers = {"Authorization": "Bearer x", "X-Sluicegate-Lane": "interactive"}
    timeout = aiohttp.ClientTimeout(total=60)
    url = base_url + "/v1/completions"
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.post(url, json=body, headers=headers) as r,
    ):
        assert r.status == 200, await r.read()
        first = await r.content.readline()
        assert first.startswith(b"data:"), first
        admitted = await asyncio.to_thread(_batch_lane_counts, base_url)
        rest = await read_events(r)
    assert rest[-1] == b"[DONE]", rest
    assert len(rest) >= 2
    return admitted, rest


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Stack]:
    """The gateway and engine of this module, with an empty batch database."""
    with stack(_config(tmp_path / "batches.db")) as running:
        yield running


def _round(base_url: str) -> dict[str, float] | None:
    """One interactive request against a saturating batch; the lane's counts before and
    after, or None if the round was inconclusive (a batch line ended on its own)."""
    assert wait_until(lambda: _saturated(base_url), within_s=60, every_s=0.02)
    waiting_before = lane_state(base_url, "best_effort")["queued"]
    before = _batch_lane_counts(base_url)
    after, _ = asyncio.run(_interactive(base_url))
    if after["completed"] != before["completed"]:
        return None
    assert waiting_before >= 1
    # (a) nothing of the batch lane was admitted while the interactive request waited.
    assert after["admitted"] == before["admitted"], (before, after)
    # (b) it got its slot by preempting exactly one batch line, nothing else ended.
    assert after["preempted"] == before["preempted"] + 1, (before, after)
    for outcome in ("failed", "expired", "cancelled"):
        assert after[outcome] == before[outcome], (outcome, before, after)
    return {key: after[key] - before[key] for key in after}


def test_interactive_requests_take_slots_back_from_a_saturating_batch(gateway: Stack) -> None:
    """(a)–(d) of the module docstring, over three conclusive interactive rounds."""
    base_url = gateway.base_url
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0)
    upload = client.files.create(file=("in.jsonl", io.BytesIO(_batch_input())), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h"
    )
    conclusive = 0
    for _ in range(MAX_TRIES):
        if _round(base_url) is not None:
            conclusive += 1
        if conclusive == ROUNDS:
            break
    assert conclusive == ROUNDS, f"only {conclusive} of {MAX_TRIES} rounds were conclusive"
    lane_preempted = _batch_lane_counts(base_url)["preempted"]
    assert lane_preempted >= ROUNDS

    deadline = time.monotonic() + 180
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", batch
    counts = _batch_lane_counts(base_url)
    # Every preemption of the lane was a batch line's, and the runner saw each one.
    assert counts["line_preempted"] == counts["preempted"] >= ROUNDS, counts
    assert counts["completed"] == LINES, counts

    # (c) each line ran again after its preemption and is answered once, in full.
    assert batch.request_counts is not None
    assert batch.request_counts.total == LINES
    assert batch.request_counts.completed == LINES
    assert batch.request_counts.failed == 0
    assert batch.output_file_id is not None
    out = [
        orjson.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()
    ]
    assert sorted(line["custom_id"] for line in out) == sorted(f"line-{i}" for i in range(LINES))
    bodies: list[dict[str, Any]] = []
    for line in out:
        assert line["error"] is None, line
        assert line["response"]["status_code"] == 200, line
        body = line["response"]["body"]
        assert body["choices"][0]["finish_reason"] == "length", body
        assert body["usage"]["completion_tokens"] == LINE_TOKENS, body
        bodies.append(body)

    # (d) usage is the output lines' sum: the preempted runs' partial tokens are not in it.
    assert batch.usage is not None
    assert batch.usage.output_tokens == sum(b["usage"]["completion_tokens"] for b in bodies)
    assert batch.usage.input_tokens == sum(b["usage"]["prompt_tokens"] for b in bodies)
    served = _value(_samples(base_url), "sluicegate_tokens_total", model=MODEL, kind="completion")
    interactive_tokens = INTERACTIVE_TOKENS * lane_state(base_url, "interactive")["outcomes"].get(
        "completed", 0
    )
    # The engine did generate more for the batch than the usage shows (the partial runs).
    assert served - interactive_tokens > batch.usage.output_tokens, (served, batch.usage)


def test_a_preemption_keeps_a_place_of_the_window_empty_for_yield_hold_s(tmp_path: Path) -> None:
    """With ``yield_hold_s`` 30, a preempted line's place in the window (6) stays empty: for
    two seconds after the interactive request ended, the batch lane holds at most five lines
    (running and waiting), though more are pending; with ``yield_hold_s`` 0 (the test
    above) the runner refills at once and every round starts saturated again."""
    with stack(_config(tmp_path / "batches.db", hold_s=30.0)) as live:
        base_url = live.base_url
        client = openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0)
        upload = client.files.create(file=("in.jsonl", io.BytesIO(_batch_input())), purpose="batch")
        client.batches.create(
            input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h"
        )
        for _ in range(MAX_TRIES):
            counts = _round(base_url)
            if counts is not None:
                break
        else:
            pytest.fail(f"no conclusive round in {MAX_TRIES}")
        assert counts["preempted"] == 1, counts

        def held() -> int:
            lane = lane_state(base_url, "best_effort")
            return int(lane["running"]) + int(lane["queued"])

        deadline = time.monotonic() + 2.0
        seen = []
        while time.monotonic() < deadline:
            seen.append(held())
            time.sleep(0.05)
        assert max(seen) <= SLOTS + 1, seen
        assert max(seen) >= 1, seen
