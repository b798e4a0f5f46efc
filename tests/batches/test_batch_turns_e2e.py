"""A small batch does not wait for another tenant's huge one, end to end.

A real gateway (in-thread uvicorn) with the batch lane on, in front of an emulated
``tiny`` engine, and the official ``openai`` SDK as both tenants' client; batch state in
SQLite (one process) or in a real ``redis-server`` (distributed mode). Tenant a's 2,000-line
batch fills the runner's window of 4; tenant b then asks for 10 lines. Claims take turns
across tenants, so b's lines run every other time a place frees: b's batch completes
while most of a's lines still wait. (Claiming oldest batch first, b waited for all of a's
2,000 lines to be claimed.)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.batches.batch_harness import (
    ENVIRON,
    KEY_B,
    batch_stack,
    by_custom_id,
    chat_line,
    client,
    distributed_section,
    file_lines,
    start_batch,
    wait_batch,
)
from tests.gateway.gateway_harness import Stack, stack

WINDOW = 4
HUGE = 2000
SMALL = 10
TOKENS = 24
"""A line takes ~0.1 s at the ``tiny`` engine: a's batch alone would keep the window busy
for about a minute."""
MODEL = f"""\
    max_concurrency: {WINDOW}
    max_inflight_tokens: off
    lanes:
      - {{name: interactive, max_concurrency: {WINDOW}, max_queue: 16}}
      - {{name: best_effort, max_concurrency: {WINDOW}, max_queue: 64, policy: fifo}}
"""
SETTINGS = f"  max_inflight: {WINDOW}\n"


@contextlib.contextmanager
def gateway(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Stack]:
    """A gateway whose batch lane keeps its state in ``kind`` (sqlite or redis)."""
    if kind == "sqlite":
        with batch_stack(tmp_path, model=MODEL, settings=SETTINGS) as live:
            yield live
        return
    server = request.getfixturevalue("redis_server")
    body = MODEL + distributed_section(server.url, SETTINGS)
    with stack(body, environ=ENVIRON) as live:
        yield live


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_small_batch_completes_while_a_huge_one_still_runs(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Tenant a's 2,000 lines run (window full); tenant b's 10-line batch, created after,
    completes with all 10 answered while fewer than a quarter of a's lines are done.
    Prints how long b took and how far a was."""
    with gateway(kind, tmp_path, request) as live:
        sdk_a, sdk_b = client(live), client(live, KEY_B)
        huge = start_batch(sdk_a, [chat_line(f"a{i}", max_tokens=TOKENS) for i in range(HUGE)])
        wait_batch(
            sdk_a,
            huge.id,
            lambda b: b.request_counts is not None and b.request_counts.completed >= WINDOW,
        )
        started = time.monotonic()
        small = start_batch(sdk_b, [chat_line(f"b{i}", max_tokens=TOKENS) for i in range(SMALL)])
        done = wait_batch(sdk_b, small.id, within_s=60)
        waited = time.monotonic() - started
        big = sdk_a.batches.retrieve(huge.id)
        answers = by_custom_id(file_lines(sdk_b, done.output_file_id))
        sdk_a.batches.cancel(huge.id)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert done.request_counts.completed == SMALL
    assert sorted(answers) == sorted(f"b{i}" for i in range(SMALL))
    assert {answer["response"]["status_code"] for answer in answers.values()} == {200}
    assert big.request_counts is not None
    left = HUGE - big.request_counts.completed - big.request_counts.failed
    print(
        f"\n{kind}: b's {SMALL}-line batch completed {waited:.2f} s after its create;"
        f" a had {big.request_counts.completed} of {HUGE} lines done ({left} left)"
    )
    assert left > HUGE * 3 // 4, big.request_counts
