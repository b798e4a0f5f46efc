"""Yielding: an interactive burst's TTFT with and without a batch saturating the engine.

One emulated engine (preset ``llama-3.1-8b-h100``) behind one gateway, with the
model's default lanes (``interactive`` 32 slots lending, ``batch`` 16,
``best_effort`` 8 borrowing) and ``max_concurrency`` 32, and ``batches:`` on.
Each round runs, side by side (their order alternating between rounds):

(A) an interactive burst alone: Poisson arrivals, streamed chat completions;
(B) the same burst (same seed) while a batch of long lines fills every slot the
    burst does not use (its lines run in ``best_effort`` at priority 5 and
    borrow the idle quota of the other lanes).

It reports the burst's TTFT p50/p99 and end-to-end p99 for both, the ratio B/A
of TTFT p99 (the goal of issue 17: at most 1.2), the batch lines preempted
during the burst, and batch throughput (lines/s) in the seconds before the
burst and during it; per round, the medians of the rounds, and all rounds pooled.

    python benchmarks/bench_batch_yield.py [--rounds 5] [--variants] [--write docs/BENCHMARKS.md]

``--max-inflight N`` and ``--no-borrow`` try a configuration (``batches.max_inflight``;
``best_effort`` on its own 8 slots); ``--variants`` runs both after the one given and
adds a table comparing them.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import math
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import numpy as np
import openai
import orjson
from rich.console import Console

from livestack import (
    CpuMeter,
    Process,
    apply_presets,
    gauge,
    live_stack,
    wide_console,
    write_report,
)
from tables import Grid, ms, percentile_ms

MODEL = "llama"
PRESET = "llama-3.1-8b-h100"
SLOTS = 32
LINE_TOKENS = (128, 640)
"""Output of a batch line (``ignore_eos``), drawn uniformly: 1.2–6 s at a full batch of this
engine; mixed lengths, so that lines do not end in waves."""
OUTPUT_CHOICES = (32, 64, 128, 256)
IDLE_TIMEOUT_S = 120.0

MODES: dict[str, dict[str, object]] = {
    "smoke": {
        "rounds": 1,
        "burst_requests": 12,
        "rate": 8.0,
        "settle_s": 0.5,
        "before_s": 1.0,
        "lines": 120,
    },
}


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


def ttfts(phase: Phase) -> list[float]:
    return [s.ttft_s for s in phase.samples if not math.isnan(s.ttft_s)]


def e2es(phase: Phase) -> list[float]:
    return [s.e2e_s for s in phase.samples if not math.isnan(s.e2e_s)]


def queues(phase: Phase) -> list[float]:
    return [s.queue_s for s in phase.samples if not math.isnan(s.queue_s)]


def failed(phase: Phase) -> int:
    return sum(1 for s in phase.samples if math.isnan(s.e2e_s))


HEADERS = [
    "round (seed)", "A TTFT p50 ms", "A TTFT p99 ms", "A e2e p99 ms", "B TTFT p50 ms",
    "B TTFT p99 ms", "B e2e p99 ms", "B/A TTFT p99", "A queue p99 ms", "B queue p99 ms",
    "lines preempted",
    "batch lines/s before", "batch lines/s during", "failed A/B",
]  # fmt: skip


def figures(a: Phase, b: Phase) -> list[float]:
    """The numbers of one row (or of the pooled samples)."""
    a99, b99 = percentile_ms(ttfts(a), 99), percentile_ms(ttfts(b), 99)
    return [
        percentile_ms(ttfts(a), 50), a99, percentile_ms(e2es(a), 99),
        percentile_ms(ttfts(b), 50), b99, percentile_ms(e2es(b), 99), b99 / a99,
        percentile_ms(queues(a), 99), percentile_ms(queues(b), 99), b.preempted,
        b.lines_per_s_before, b.lines_per_s_during,
    ]  # fmt: skip


def row(label: str, values: list[float], failures: str) -> list[str]:
    """A table row from ``figures``."""
    cells = [ms(v) for v in values[:6]]
    cells += [f"{values[6]:.2f}", ms(values[7]), ms(values[8]), f"{values[9]:.0f}"]
    cells += [f"{values[10]:.2f}", f"{values[11]:.2f}"]
    return [label, *cells, failures]


def table(results: list[tuple[int, Phase, Phase]]) -> tuple[Grid, float]:
    """Per round, their medians, all rounds' requests pooled (preemptions summed, batch
    rates the medians); and the median B/A ratio of TTFT p99."""
    rows, per_round = [], []
    for seed, a, b in results:
        values = figures(a, b)
        per_round.append(values)
        rows.append(row(f"{len(rows) + 1} ({seed})", values, f"{failed(a)}/{failed(b)}"))
    medians = [statistics.median(column) for column in zip(*per_round, strict=True)]
    total = f"{sum(failed(a) for _, a, _ in results)}/{sum(failed(b) for _, _, b in results)}"
    rows.append(row("median of rounds", medians, total))
    pooled_a = Phase([s for _, a, _ in results for s in a.samples])
    pooled_b = Phase(
        [s for _, _, b in results for s in b.samples],
        preempted=sum(b.preempted for _, _, b in results),
        lines_per_s_before=medians[10],
        lines_per_s_during=medians[11],
    )
    rows.append(row("all rounds pooled", figures(pooled_a, pooled_b), total))
    title = "Interactive burst alone (A) and with a saturating batch (B)"
    return (title, HEADERS, rows), medians[6]


def arguments(argv: list[str] | None) -> argparse.Namespace:
    """The command line (``--smoke``: one tiny round, for the test suite)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="one tiny round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--burst-requests", type=int, default=80, help="requests per burst")
    parser.add_argument("--rate", type=float, default=12.0, help="burst arrivals per second")
    parser.add_argument("--settle-s", type=float, default=4.0, help="batch alone, unmeasured")
    parser.add_argument("--before-s", type=float, default=6.0, help="batch alone, measured")
    parser.add_argument("--lines", type=int, default=400, help="lines of each round's batch")
    parser.add_argument("--no-borrow", action="store_true", help="best_effort borrow: false")
    parser.add_argument("--max-inflight", type=int, default=None, help="batches.max_inflight")
    parser.add_argument(
        "--yield-hold-s", type=float, default=None, help="batches.yield_hold_s (default 5)"
    )
    parser.add_argument("--variants", action="store_true", help="also run VARIANTS")
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args(argv)
    return apply_presets(parser, args, [MODES["smoke"]] if args.smoke else [])


VARIANTS: dict[str, dict[str, object]] = {
    "batches.yield_hold_s: 0 (a preempted line's place refilled at once)": {"yield_hold_s": 0.0},
    "batches.max_inflight: 16": {"max_inflight": 16},
    "best_effort borrow: false (8 slots)": {"no_borrow": True},
}
"""What ``--variants`` runs after the configuration the command line gives."""

SUMMARY_HEADERS = [
    "configuration", "A TTFT p99 ms", "B TTFT p99 ms", "B/A TTFT p99 (pooled)",
    "B/A TTFT p99 (median of rounds)", "B/A TTFT p50", "B/A e2e p99",
    "lines preempted per interactive request", "batch lines/s before", "batch lines/s during",
]  # fmt: skip


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


def summary_row(label: str, results: list[tuple[int, Phase, Phase]], ratio: float) -> list[str]:
    """One configuration's pooled figures."""
    a = Phase([s for _, one, _ in results for s in one.samples])
    b = Phase([s for _, _, one in results for s in one.samples])
    values = figures(a, b)
    preempted = sum(one.preempted for _, _, one in results) / max(1, len(b.samples))
    before = statistics.median(one.lines_per_s_before for _, _, one in results)
    during = statistics.median(one.lines_per_s_during for _, _, one in results)
    return [
        label, ms(values[1]), ms(values[4]), f"{values[6]:.2f}", f"{ratio:.2f}",
        f"{values[3] / values[0]:.2f}", f"{values[5] / values[2]:.2f}", f"{preempted:.2f}",
        f"{before:.2f}", f"{during:.2f}",
    ]  # fmt: skip


def describe(args: argparse.Namespace) -> str:
    """The gateway configuration of a run, in words."""
    lanes = "the default lanes" + (" but `best_effort` `borrow: false`" if args.no_borrow else "")
    window = "unset (the model's 32)" if args.max_inflight is None else str(args.max_inflight)
    hold = "5 (default)" if args.yield_hold_s is None else f"{args.yield_hold_s:g}"
    return (
        f"model `max_concurrency` {SLOTS}, {lanes}, `batches.max_inflight` {window},"
        f" `batches.yield_hold_s` {hold}"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the rounds (and ``--variants``), print the tables, optionally write the section."""
    args = arguments(argv)
    out: Console = wide_console()
    results, others = measure(args, out)
    grid, ratio = table(results)
    grids = [grid]
    if args.variants:
        rows = [summary_row("as above", results, ratio)]
        for label, changes in VARIANTS.items():
            variant = argparse.Namespace(**{**vars(args), **changes})
            found, busy = measure(variant, out)
            others = max(others, busy)
            rows.append(summary_row(label, found, table(found)[1]))
        grids.append(("The same rounds under other configurations", SUMMARY_HEADERS, rows))
    a = [s for _, one, _ in results for s in one.samples]
    b = [s for _, _, one in results for s in one.samples]
    queue_p99 = percentile_ms([s.queue_s for s in b if not math.isnan(s.queue_s)], 99)
    preempted = sum(one.preempted for _, _, one in results) / max(1, len(b))
    verdict = "meets" if ratio <= 1.2 else "MISSES"
    notes = [
        f"Engine: one emulator, preset `{PRESET}`. Gateway: {describe(args)}. Burst: "
        f"{args.burst_requests} streamed chat completions at {args.rate:g}/s (Poisson), "
        f"prompts of 100–800 words, {'/'.join(map(str, OUTPUT_CHOICES))} tokens out. Batch: "
        f"{args.lines} lines of {LINE_TOKENS[0]}–{LINE_TOKENS[1]} tokens out, filling "
        f"{batch_slots(args)} slots for {args.settle_s:g} + {args.before_s:g} s (the second "
        "part measured) before the burst; cancelled after it. Queue: the gateway's "
        "`X-Sluicegate-Queue-Ms` (arrival to admission; in (B) it includes the preemption). "
        f"{len(a)} requests in (A), {len(b)} in (B).",
        f"Median B/A of interactive TTFT p99: {ratio:.2f} ({verdict} the 1.2 goal). In (B) "
        f"{preempted:.2f} batch lines were preempted per interactive request and the "
        f"interactive queue wait p99 was {queue_p99:.1f} ms: the preemption itself is quick; "
        "the rest of the gap is spent in the engine, whose steps also carry the batch's "
        "decodes and the prefills of the lines that refill every slot an interactive request "
        f"gives back. Processes not ours kept up to {others:.2f} of {os.cpu_count()} cores "
        "busy.",
    ]
    write_report(
        args, script="bench_batch_yield.py", section="bench_batch_yield",
        title="Batch yielding: interactive TTFT with a saturating batch", notes=notes,
        grids=grids, argv=argv, out=out,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
