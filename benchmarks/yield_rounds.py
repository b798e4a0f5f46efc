"""The rounds of ``bench_batch_yield.py``: one emulated engine behind one gateway with
``batches:`` on, and per round an interactive burst alone (A) and the same burst while a
batch saturates the engine (B), with what the batch did around it."""

from __future__ import annotations

import argparse
import asyncio
import io
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import numpy as np
import openai
import orjson
from rich.console import Console

from livestack import CpuMeter, Process, gauge, live_stack

MODEL = "llama"
PRESET = "llama-3.1-8b-h100"
SLOTS = 32
LINE_TOKENS = (128, 640)
"""Output of a batch line (``ignore_eos``), drawn uniformly: 1.2–6 s at a full batch of this
engine; mixed lengths, so that lines do not end in waves."""
OUTPUT_CHOICES = (32, 64, 128, 256)
IDLE_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class Sample:
    """One interactive request: seconds to its first token, to its end, and queued in the
    gateway (``X-Sluicegate-Queue-Ms``); NaN if it failed."""

    ttft_s: float
    e2e_s: float
    queue_s: float


@dataclass(frozen=True, slots=True)
class Phase:
    """One burst: its requests, and for (B) what the batch did around it."""

    samples: list[Sample]
    preempted: float = math.nan
    lines_per_s_before: float = math.nan
    lines_per_s_during: float = math.nan


def gateway_config(engine_url: str, db: Path, args: argparse.Namespace) -> str:
    """One model on one engine with the default lanes (``--no-borrow``: ``best_effort``
    runs on its own 8 slots only)."""
    lanes = ""
    if args.no_borrow:
        lanes = (
            "    lanes:\n"
            "      - {name: interactive, max_concurrency: 32, max_queue: 256,"
            " queue_timeout_s: 30, slo_ms: 20000, policy: slack, preemptible: never}\n"
            "      - {name: batch, max_concurrency: 16, max_queue: 2048, queue_timeout_s: 300,"
            " slo_ms: 120000, policy: fair, preemptible: {after_fraction: 0.8}}\n"
            "      - {name: best_effort, max_concurrency: 8, max_queue: 8192,"
            " queue_timeout_s: 600, slo_ms: 600000, policy: fifo, preemptible: always,"
            " borrow: false}\n"
        )
    inflight = "" if args.max_inflight is None else f"  max_inflight: {args.max_inflight}\n"
    if args.yield_hold_s is not None:
        inflight += f"  yield_hold_s: {args.yield_hold_s}\n"
    return f"""\
models:
  - name: {MODEL}
    backends: [{{name: e0, url: "{engine_url}", engine: emulator}}]
    max_concurrency: {SLOTS}
    prior_output_tokens: 128
    prior_decode_tokens_per_s: 100
{lanes}batches:
  path: {db}
  poll_interval_s: 0.1
{inflight}"""


def arrivals(seed: int, count: int, rate: float) -> list[tuple[float, int, int]]:
    """(offset s, prompt words, max_tokens) of the burst: the same for the same seed."""
    rng = np.random.default_rng(seed)
    offsets = np.cumsum(rng.exponential(1.0 / rate, count))
    words = rng.integers(100, 800, count)
    outputs = rng.choice(OUTPUT_CHOICES, count)
    return [(float(o), int(w), int(m)) for o, w, m in zip(offsets, words, outputs, strict=True)]


async def one_request(
    session: aiohttp.ClientSession, url: str, words: int, max_tokens: int
) -> Sample:
    """A streamed chat completion in the interactive lane; TTFT = first content delta."""
    body = {
        "model": MODEL, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
        "messages": [{"role": "user", "content": " ".join(["word"] * words)}],
    }  # fmt: skip
    start = time.perf_counter()
    first = math.nan
    async with session.post(
        url + "/v1/chat/completions", json=body, headers={"X-Sluicegate-Lane": "interactive"}
    ) as response:
        if response.status != 200:
            await response.read()
            return Sample(math.nan, math.nan, math.nan)
        queue_s = float(response.headers.get("x-sluicegate-queue-ms", "nan")) / 1000.0
        async for line in response.content:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            if math.isnan(first):
                choices = orjson.loads(payload).get("choices") or [{}]
                if (choices[0].get("delta") or {}).get("content"):
                    first = time.perf_counter() - start
    return Sample(first, time.perf_counter() - start, queue_s)


async def burst(
    session: aiohttp.ClientSession, url: str, seed: int, args: argparse.Namespace
) -> list[Sample]:
    """Send the seed's burst open loop; every request's sample."""
    start = time.perf_counter()
    tasks = []
    for offset, words, max_tokens in arrivals(seed, args.burst_requests, args.rate):
        await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
        tasks.append(asyncio.create_task(one_request(session, url, words, max_tokens)))
    return list(await asyncio.gather(*tasks))


async def line_runs(session: aiohttp.ClientSession, url: str, outcome: str) -> float:
    """Runs of batch lines that ended with ``outcome`` so far."""
    return await gauge(session, url, "sluicegate_batch_line_runs_total", outcome=outcome)


async def wait_for(check: object, what: str) -> None:
    """Poll the coroutine function ``check`` until it returns True."""
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while not await check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def batch_input(lines: int) -> bytes:
    """A batch of ``lines`` long chat completions (the same every round)."""
    outputs = np.random.default_rng(0).integers(LINE_TOKENS[0], LINE_TOKENS[1] + 1, lines)
    rows = []
    for i, max_tokens in enumerate(outputs):
        body = {
            "model": MODEL, "max_tokens": int(max_tokens), "ignore_eos": True,
            "messages": [{"role": "user", "content": " ".join(["doc"] * 400)}],
        }  # fmt: skip
        line = {"custom_id": f"bg-{i}", "method": "POST", "url": "/v1/chat/completions"}
        rows.append(orjson.dumps({**line, "body": body}))
    return b"\n".join(rows) + b"\n"


def batch_slots(args: argparse.Namespace) -> int:
    """The slots the batch can fill with this config."""
    window = SLOTS if args.max_inflight is None else args.max_inflight
    return min(window, 8 if args.no_borrow else SLOTS)


async def alone(
    session: aiohttp.ClientSession, url: str, seed: int, args: argparse.Namespace
) -> Phase:
    """(A): the burst on an idle gateway."""
    await wait_for(lambda: _idle(session, url), "the gateway to be idle")
    return Phase(await burst(session, url, seed, args))


async def _idle(session: aiohttp.ClientSession, url: str) -> bool:
    running = await gauge(session, url, "sluicegate_inflight_requests")
    queued = await gauge(session, url, "sluicegate_queue_depth")
    return running == 0 and queued == 0


async def with_batch(
    session: aiohttp.ClientSession, url: str, seed: int, args: argparse.Namespace
) -> Phase:
    """(B): the burst while a batch saturates the model; the batch is cancelled after."""
    await wait_for(lambda: _idle(session, url), "the gateway to be idle")
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    upload = await client.files.create(
        file=("bg.jsonl", io.BytesIO(batch_input(args.lines))), purpose="batch"
    )
    batch = await client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )

    slots = batch_slots(args)

    async def saturated() -> bool:
        running = await gauge(session, url, "sluicegate_inflight_requests", lane="best_effort")
        return running >= slots

    await wait_for(saturated, "the batch to fill every slot")
    await asyncio.sleep(args.settle_s)
    done0, t0 = await line_runs(session, url, "completed"), time.perf_counter()
    await asyncio.sleep(args.before_s)
    done1, t1 = await line_runs(session, url, "completed"), time.perf_counter()
    preempted0 = await line_runs(session, url, "preempted")
    samples = await burst(session, url, seed, args)
    done2, t2 = await line_runs(session, url, "completed"), time.perf_counter()
    preempted1 = await line_runs(session, url, "preempted")
    await client.batches.cancel(batch.id)
    await client.close()
    return Phase(
        samples,
        preempted=preempted1 - preempted0,
        lines_per_s_before=(done1 - done0) / (t1 - t0),
        lines_per_s_during=(done2 - done1) / (t2 - t1),
    )


async def rounds(url: str, args: argparse.Namespace) -> list[tuple[int, Phase, Phase]]:
    """Every round's (seed, A, B), A and B alternating which goes first."""
    results = []
    timeout = aiohttp.ClientTimeout(total=300)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        for i in range(args.rounds):
            seed = args.seed + i
            if i % 2 == 0:
                a = await alone(session, url, seed, args)
                b = await with_batch(session, url, seed, args)
            else:
                b = await with_batch(session, url, seed, args)
                a = await alone(session, url, seed, args)
            results.append((seed, a, b))
    return results


def measure(args: argparse.Namespace, out: Console) -> tuple[list[tuple[int, Phase, Phase]], float]:
    """Start a stack for ``args``, run its rounds; the results and the cores others used."""
    with (
        tempfile.TemporaryDirectory(prefix="sluicegate-yield-db-") as tmp,
        live_stack(out, "sluicegate-yield-") as stack,
    ):
        engine = stack.engine(MODEL, PRESET)
        gateway: Process = stack.gateway(gateway_config(engine.url, Path(tmp) / "b.db", args))
        meter = CpuMeter([engine, gateway])
        with out.status(f"{args.rounds} rounds…"):
            results = asyncio.run(rounds(gateway.url, args))
        return results, meter.others_cores()
