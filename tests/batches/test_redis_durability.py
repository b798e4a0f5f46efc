"""What the batch lane keeps when redis-server is killed (``kill -9``) with its append-only
file on.

A real gateway (in-thread uvicorn) in distributed mode keeps its batch data in a private
``redis-server`` started with ``appendonly yes``, in front of an emulated engine. Tenant
a's client (the official ``openai`` SDK) uploads files and creates batches over them in a
loop while the runner answers their lines, and a watcher notes every acknowledgment and
when it came: each upload and create answered 200, and each batch's
``request_counts.completed`` as the API reports it (results the runner wrote). In the
middle of it redis-server is killed with SIGKILL; the gateway stops; redis-server starts
again on its files, and the store is read directly (no runner that could write again):

- ``appendfsync always``: every upload (its content byte for byte), every create and
  every result acknowledged before the kill is there;
- ``appendfsync everysec``: what is missing is counted and printed; only what was
  acknowledged in the last ``EVERYSEC_WINDOW_S`` before the kill may be. Redis writes its
  log before it answers and fsyncs it every second, so a killed process loses at most a
  write it held back (up to 2 s, while an fsync is slow); what ``everysec`` risks beyond
  that is a crash of the machine, which no test here can cause (OPERATIONS, "Redis
  persistence").

Then a gateway starts again on the same Redis and every batch that was kept completes,
each custom_id answered exactly once (a check the kill cut short is taken again after
3 s here instead of ``CHECK_LEASE_S``, 5 minutes).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import threading
import time
from dataclasses import dataclass, field

import openai
import orjson
import pytest

from sluicegate.batches.redis import lifecycle
from sluicegate.batches.redis.redis_batches import RedisBatches
from tests.batches.batch_harness import (
    CHAT,
    ENVIRON,
    by_custom_id,
    chat_line,
    client,
    distributed_section,
    file_lines,
    jsonl,
    wait_batch,
)
from tests.gateway.gateway_harness import Stack, stack
from tests.store.redis_server import REDIS_SERVER, RedisServer, running_redis

pytestmark = pytest.mark.skipif(
    not os.path.exists(REDIS_SERVER),
    reason=f"redis-server not installed ({REDIS_SERVER}); `make test` installs it",
)

LINES = 10
"""Lines per uploaded file (and batch)."""
LOAD_S = 3.0
"""How long uploads, creates and lines run before the kill."""
EVERYSEC_WINDOW_S = 2.5
"""With ``everysec``, the most recent acknowledgments that may be lost (Redis's 2 s, plus
the watcher's polling)."""
MODEL = """\
    max_concurrency: 16
    max_inflight_tokens: off
    lanes:
      - {name: interactive, max_concurrency: 16, max_queue: 16}
      - {name: best_effort, max_concurrency: 16, max_queue: 256, policy: fifo}
"""
SETTINGS = "  lease_s: 2\n  quota: {max_active_batches: null}\n"


@dataclass
class Acks:
    """What the API acknowledged, each with the ``time.monotonic()`` it was answered (a
    result: when the watcher first saw the count that includes it)."""

    files: dict[str, tuple[float, bytes]] = field(default_factory=dict)
    batches: dict[str, tuple[float, str]] = field(default_factory=dict)
    """Batch id → (when, its input file's id)."""
    completed: dict[str, tuple[int, float]] = field(default_factory=dict)
    refused: int = 0


def upload_and_create(live: Stack, acks: Acks, stop: threading.Event) -> None:
    """Upload a file of ``LINES`` lines and create a batch over it, again and again until
    ``stop``; note each 200 (a refusal, while Redis is down, is counted)."""
    sdk = client(live)
    round_ = 0
    while not stop.is_set():
        round_ += 1
        data = jsonl([chat_line(f"r{round_}-{i}", max_tokens=4) for i in range(LINES)])
        try:
            made = sdk.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
            acks.files[made.id] = (time.monotonic(), data)
            batch = sdk.batches.create(
                input_file_id=made.id, endpoint=CHAT, completion_window="24h"
            )
            acks.batches[batch.id] = (time.monotonic(), made.id)
        except (openai.APIStatusError, openai.APIConnectionError):
            acks.refused += 1
            time.sleep(0.05)


def watch_results(live: Stack, acks: Acks, stop: threading.Event) -> None:
    """Until ``stop``, read the newest 100 batches' ``request_counts.completed`` every
    50 ms and note each count that grew."""
    sdk = client(live)
    while not stop.is_set():
        try:
            page = sdk.batches.list(limit=100)
        except (openai.APIStatusError, openai.APIConnectionError):
            page = None
        for batch in page.data if page is not None else []:
            done = batch.request_counts.completed if batch.request_counts else 0
            if done > acks.completed.get(batch.id, (0, 0.0))[0]:
                acks.completed[batch.id] = (done, time.monotonic())
        time.sleep(0.05)


@dataclass
class Lost:
    """What the restarted Redis no longer has of what was acknowledged: for each kind, how
    long before the kill each lost thing was acknowledged (seconds)."""

    files: list[float] = field(default_factory=list)
    batches: list[float] = field(default_factory=list)
    results: list[float] = field(default_factory=list)
    result_lines: int = 0
    batch_ids: set[str] = field(default_factory=set)

    def ages(self) -> list[float]:
        """Every lost acknowledgment's age at the kill."""
        return self.files + self.batches + self.results


async def lost_after_restart(server: RedisServer, acks: Acks, killed_at: float) -> Lost:
    """Read the restarted store directly: each acknowledged file (and its content), batch
    and count of results that is missing or short."""
    store = RedisBatches(server.url, prefix="sluicegate")
    await store.open()
    lost = Lost()
    try:
        for file_id, (at, data) in acks.files.items():
            row = await store.get_file("a", file_id)
            kept = [] if row is None else await store.file_page(file_id, 0)
            if row is None or b"".join(line + b"\n" for line in kept) != data:
                lost.files.append(killed_at - at)
        for batch_id, (at, _) in acks.batches.items():
            if await store.get_batch("a", batch_id) is None:
                lost.batches.append(killed_at - at)
                lost.batch_ids.add(batch_id)
        for batch_id, (done, at) in acks.completed.items():
            short = done - (await store.batch_counts(batch_id)).completed
            if short > 0:
                lost.results.append(killed_at - at)
                lost.result_lines += short
    finally:
        await store.close()
    return lost


def gateway(server: RedisServer) -> contextlib.AbstractContextManager[Stack]:
    """A gateway whose limits and batch data are in ``server``."""
    return stack(MODEL + distributed_section(server.url, SETTINGS), environ=ENVIRON)


def kill_under_load(server: RedisServer, acks: Acks) -> tuple[float, float]:
    """Upload, create and run lines for ``LOAD_S`` (and until a result is seen), then
    ``kill -9`` redis-server and stop the gateway; when it was killed and how long the
    load ran."""
    stop = threading.Event()
    with gateway(server) as live:
        threads = [
            threading.Thread(target=work, args=(live, acks, stop), daemon=True)
            for work in (upload_and_create, watch_results)
        ]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        while time.monotonic() - started < LOAD_S or not acks.completed:
            assert time.monotonic() - started < 60, "no line answered within 60 s"
            time.sleep(0.05)
        server.kill()
        killed_at = time.monotonic()
        time.sleep(0.3)  # the calls in flight fail: nothing later is acknowledged
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    return killed_at, killed_at - started


def complete_the_rest(server: RedisServer, acks: Acks, lost: Lost) -> int:
    """A gateway again: every acknowledged batch the store kept completes, each of its
    custom_ids answered exactly once (200); how many batches."""
    kept = 0
    with gateway(server) as live:
        sdk = client(live)
        for batch_id, (_, file_id) in acks.batches.items():
            if batch_id in lost.batch_ids:
                continue
            done = wait_batch(sdk, batch_id, within_s=120)
            assert done.status == "completed", done
            answers = by_custom_id(file_lines(sdk, done.output_file_id))
            wanted = [orjson.loads(line) for line in acks.files[file_id][1].splitlines()]
            assert sorted(answers) == sorted(line["custom_id"] for line in wanted)
            assert {a["response"]["status_code"] for a in answers.values()} == {200}
            assert done.error_file_id is None
            kept += 1
    assert kept == len(acks.batches) - len(lost.batches)
    return kept


@pytest.mark.parametrize("appendfsync", ["always", "everysec"])
def test_what_a_kill_9_of_redis_loses(appendfsync: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Uploads, creates and lines running; redis-server (``appendonly yes``) killed with
    SIGKILL, then started again on its files. With ``always`` nothing acknowledged is lost;
    with ``everysec`` only what was acknowledged in the last ``EVERYSEC_WINDOW_S`` may be.
    Then every batch kept completes, exactly once per custom_id. Prints what was
    acknowledged (and how fast) and what was lost."""
    # A check cut by the kill holds its batch for CHECK_LEASE_S (300 s) before any replica
    # takes it again: 3 s here, so that the test sees it complete.
    monkeypatch.setattr(lifecycle, "CHECK_LEASE_S", 3)
    acks = Acks()
    with running_redis(appendfsync=appendfsync) as server:
        killed_at, load_s = kill_under_load(server, acks)
        server.start()
        lost = asyncio.run(lost_after_restart(server, acks, killed_at))
        results = sum(done for done, _ in acks.completed.values())
        print(
            f"\nappendfsync {appendfsync}: in {load_s:.1f} s, {len(acks.files)} uploads,"
            f" {len(acks.batches)} creates and {results} results acknowledged"
            f" ({len(acks.files) / load_s:.0f} uploads/s, {results / load_s:.0f} results/s);"
            f" after kill -9 and restart, lost {len(lost.files)} uploads,"
            f" {len(lost.batches)} creates, {lost.result_lines} results"
            f" (acknowledged {sorted(round(age, 2) for age in lost.ages())} s before the kill);"
            f" {acks.refused} calls refused while Redis was down"
        )
        if appendfsync == "always":
            assert lost == Lost()
        else:
            assert all(age <= EVERYSEC_WINDOW_S for age in lost.ages()), lost
        kept = complete_the_rest(server, acks, lost)
    print(f"{kept} batches completed after the restart, each custom_id once")
