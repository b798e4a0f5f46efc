"""The live phase of ``prefix_precise.py`` (``--live``): the B2B comparison of routers in
real time, against four emulated replicas publishing KV events through a real gateway,
beside the simulator's run of the very same requests and configuration.

Engines: four ``sluicegate emulate --preset prefix-live --kv-events tcp://…
--kv-events-replay tcp://…`` processes (the 8B/H100 timings slowed ten-fold and a KV
cache of 1,000 blocks, ``engine/presets.py``), fresh for every run so each starts cold.
Gateway: ``sluicegate serve`` with the four as ``engine: emulator`` backends carrying
``kv_events: {endpoint, replay_endpoint}``, the router under test, the model and its lane
capped far above what is ever in flight (nothing waits in the gateway). Requests: the B2B
workload as real prompt texts (``prefix_precise_texts.py``), sent open loop (each at its
arrival, whatever came back) as streamed chats; TTFT is measured by the client from the
request's scheduled start to its first content chunk. Simulated: the same requests (prompt
sizes, block hashes and ring keys as the emulator and the gateway derive them from the
texts), the same configuration and preset, ``sim.virtual_driver.simulate`` with KV events
delivered at once.
"""

from __future__ import annotations

import argparse
import asyncio
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import aiohttp
import numpy as np

from livestack import CpuMeter, LiveStack, Process, live_stack, wide_console
from prefix_precise_texts import MODEL, TextRequest, b2b_texts
from sluicegate.bench.response_parsing import StreamStats
from sluicegate.config import parse_config
from sluicegate.demo.processes import free_port
from sluicegate.engine import preset
from sluicegate.outcomes.record import COMPLETED
from sluicegate.sim.virtual_driver import simulate
from sluicegate.sim.workloads.synthetic import LengthDist

PRESET = "prefix-live"
REPLICAS = 4
CUSTOMERS = 24
CONTEXT_TOKENS = 1536
QUESTION = LengthDist.lognormal(32.0, 0.5, min_tokens=8, max_tokens=128)
OUTPUT = LengthDist.constant(16)
PREFILL_TOKENS_PER_S = 1.0 / preset(PRESET).per_prefill_token_s
CAP = 512
WITHIN = 0.15
"""The issue's bar: live within 15% of the simulated figures."""
UNREACHABLE = "http://127.0.0.1:9"


@dataclass(frozen=True, slots=True)
class LiveSetup:
    """A router under test: its label, strategy and sticky penalty (None: not sticky)."""

    label: str
    router: str
    penalty_ms: float | None = None


def setups(penalty_ms: float) -> list[LiveSetup]:
    """The routers compared live."""
    return [
        LiveSetup("`random`", "random"),
        LiveSetup("`least_inflight`", "least_inflight"),
        LiveSetup("`prefix_affinity` (ring)", "prefix_affinity"),
        LiveSetup(f"`precise_prefix`, sticky {penalty_ms:g} ms", "precise_prefix", penalty_ms),
    ]


@dataclass(frozen=True, slots=True)
class Figures:
    """What one run measured: TTFT percentiles (s), output tokens/s, hit rate (tokens)."""

    completed: int
    offered: int
    p50_s: float
    p90_s: float
    p99_s: float
    output_tok_s: float
    hit_rate: float


def config_text(setup: LiveSetup, backends: Sequence[tuple[str, str, str]]) -> str:
    """The model's configuration; ``backends`` are ``(url, kv endpoint, replay endpoint)``.

    The backends are named as the simulator names its replicas (``r0``…,
    ``sim/replica_backends.py``): the ring lays its points out by backend name, so other
    names would place the customers elsewhere live than in the simulation."""
    penalty = "null" if setup.penalty_ms is None else f"{setup.penalty_ms:g}"
    lines = "".join(
        f"      - {{name: r{i}, url: '{url}', engine: emulator,"
        f" kv_events: {{endpoint: '{pub}', replay_endpoint: '{replay}'}}}}\n"
        for i, (url, pub, replay) in enumerate(backends)
    )
    return (
        f"models:\n  - name: {MODEL}\n    router: {setup.router}\n"
        f"    max_concurrency: {CAP}\n"
        f"    prefix_routing: {{max_ttft_penalty_ms: {penalty}, recent_ttl_s: 2,"
        f" prefill_tokens_per_s: {PREFILL_TOKENS_PER_S:g}}}\n"
        f"    backends:\n{lines}"
        f"    lanes:\n      - {{name: interactive, max_concurrency: {CAP}}}\n"
    )


def _percentiles(ttft: Sequence[float]) -> tuple[float, float, float]:
    if not ttft:
        return math.nan, math.nan, math.nan
    p50, p90, p99 = np.percentile(np.asarray(ttft), [50, 90, 99])
    return float(p50), float(p90), float(p99)


def simulated(setup: LiveSetup, requests: list[TextRequest], seed: int) -> Figures:
    """The simulator's run of ``requests`` on the same configuration and preset."""
    backends = [(UNREACHABLE, "tcp://127.0.0.1:9", "tcp://127.0.0.1:9")] * REPLICAS
    text = config_text(setup, [(u, p, r) for u, p, r in backends])
    spec = parse_config(text, simulation=True).scheduler_spec()
    result = simulate(spec, MODEL, list(requests), preset(PRESET), REPLICAS, seed=seed)
    done = [r for r in result.records if r.outcome == COMPLETED and r.first_token_s is not None]
    ttft = [r.first_token_s - r.arrival_s for r in done if r.first_token_s is not None]
    span = result.end_s - result.start_s
    queried = result.prompt_tokens_queried
    return Figures(
        len(done), len(requests), *_percentiles(ttft),
        sum(r.generated_tokens for r in done) / span if span > 0 else math.nan,
        result.prompt_tokens_cached / queried if queried else math.nan,
    )  # fmt: skip


@dataclass(slots=True)
class _Reply:
    ttft_s: float | None = None
    output_tokens: int = 0
    ended_s: float = 0.0
    ok: bool = False


async def _send(session: aiohttp.ClientSession, url: str, request: TextRequest,
                start: float) -> _Reply:  # fmt: skip
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start + request.arrival_s - loop.time()))
    stats = StreamStats()
    reply = _Reply()
    headers = {"Content-Type": "application/json"}
    try:
        async with session.post(url, data=request.body, headers=headers) as response:
            if response.status == 200:
                async for line in response.content:
                    stats.feed_line(line, loop.time())
                stats.feed_line(b"", loop.time())
                reply.ok = not stats.error and stats.first_s is not None
    except (aiohttp.ClientError, OSError, TimeoutError):
        reply.ok = False
    reply.ended_s = loop.time() - start
    if reply.ok and stats.first_s is not None:
        reply.ttft_s = stats.first_s - start - request.arrival_s
        reply.output_tokens = stats.output_tokens
    return reply


async def drive(base_url: str, requests: Sequence[TextRequest]) -> list[_Reply]:
    """Send every request open loop at its arrival; the replies in request order."""
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=300.0)
    url = base_url + "/v1/chat/completions"
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = asyncio.get_running_loop().time() + 0.2
        return list(await asyncio.gather(*(_send(session, url, r, start) for r in requests)))


def _engine(stack: LiveStack, seed: int) -> tuple[Process, str, str]:
    pub, replay = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    extra = ["--seed", str(seed), "--kv-events", pub, "--kv-events-replay", replay]
    return stack.engine(MODEL, PRESET, extra_args=extra), pub, replay


async def _engine_stats(session: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    async with session.get(url + "/emulator/stats") as response:
        stats = await response.json()
    return float(stats["prefix_cache_hit_tokens"]), float(stats["prefix_cache_query_tokens"])


async def _hit_rate(engines: Sequence[Process]) -> float:
    async with aiohttp.ClientSession() as session:
        pairs = [await _engine_stats(session, e.url) for e in engines]
    queried = sum(q for _, q in pairs)
    return sum(h for h, _ in pairs) / queried if queried else math.nan


def live(stack: LiveStack, setup: LiveSetup, requests: list[TextRequest]) -> tuple[Figures, float]:
    """One live run on fresh engines and a fresh gateway; the figures and the cores other
    processes kept busy meanwhile."""
    with ThreadPoolExecutor(REPLICAS) as pool:
        engines = list(pool.map(lambda i: _engine(stack, i), range(REPLICAS)))
    gateway = stack.gateway(config_text(setup, [(e.url, p, r) for e, p, r in engines]))
    processes = [gateway, *(e for e, _, _ in engines)]
    meter = CpuMeter(processes)
    replies = asyncio.run(drive(gateway.url, requests))
    others = meter.others_cores()
    hit_rate = asyncio.run(_hit_rate([e for e, _, _ in engines]))
    for process in processes:
        stack.stop(process)
    done = [r for r in replies if r.ok]
    span = max((r.ended_s for r in done), default=0.0) - min(r.arrival_s for r in requests)
    figures = Figures(
        len(done), len(requests), *_percentiles([r.ttft_s for r in done if r.ttft_s is not None]),
        sum(r.output_tokens for r in done) / span if span > 0 else math.nan, hit_rate,
    )  # fmt: skip
    return figures, others


def _pair(live_value: float, sim_value: float, digits: int = 2) -> list[str]:
    if math.isnan(live_value) or math.isnan(sim_value) or not sim_value:
        return ["—", "—", "—"]
    ratio = live_value / sim_value
    return [f"{live_value:.{digits}f}", f"{sim_value:.{digits}f}", f"{ratio:.2f}"]


Run = tuple[float, LiveSetup, Figures, Figures, float]
"""(offered req/s, router, live figures, simulated figures, other processes' cores)."""


def rows(runs: Sequence[Run]) -> list[str]:
    """The Markdown table: per load and router, live, simulated and live ÷ simulated, and
    the cores other processes kept busy during the live run."""
    head = [
        "offered (req/s)", "router", "completed",
        "TTFT p50 live (s)", "sim", "÷", "TTFT p90 live (s)", "sim", "÷",
        "TTFT p99 live (s)", "sim", "÷", "output tok/s live", "sim", "÷",
        "hit rate live", "sim", "within 15%", "others' cores",
    ]  # fmt: skip
    out = ["| " + " | ".join(head) + " |", "|---:|---|" + "---:|" * 15 + "---|---:|"]
    for rate, setup, got, sim, others in runs:
        pairs = [
            (got.p50_s, sim.p50_s), (got.p90_s, sim.p90_s), (got.p99_s, sim.p99_s),
            (got.output_tok_s, sim.output_tok_s),
        ]  # fmt: skip
        cells = [f"{rate:g}", setup.label, f"{got.completed}/{got.offered}"]
        for k, (live_value, sim_value) in enumerate(pairs):
            cells += _pair(live_value, sim_value, 1 if k == 3 else 2)
        cells += [f"{got.hit_rate:.1%}", f"{sim.hit_rate:.1%}"]
        cells += [_verdict([*pairs, (got.hit_rate, sim.hit_rate)]), f"{others:.2f}"]
        out.append("| " + " | ".join(cells) + " |")
    return out


def _verdict(pairs: Sequence[tuple[float, float]]) -> str:
    """Which figures are off by more than 15%."""
    names = ("p50", "p90", "p99", "tok/s", "hit rate")
    off = [n for n, (a, b) in zip(names, pairs, strict=True) if abs(a / b - 1.0) > WITHIN]
    return "yes" if not off else "no: " + ", ".join(off)


def run_live(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """Every (load, router) live and simulated; the table rows and the notes under it."""
    out = wide_console()
    rates = [float(x) for x in args.live_rates.split(",") if x]
    runs: list[Run] = []
    with live_stack(out, "sluicegate-prefix-live-") as stack:
        for rate in rates:
            requests = b2b_texts(
                rate, args.live_duration, seed=args.seed, customers=CUSTOMERS,
                context_tokens=CONTEXT_TOKENS, question=QUESTION, output=OUTPUT,
                block_size=preset(PRESET).block_size,
            )  # fmt: skip
            for setup in setups(args.live_penalty):
                with out.status(f"{rate:g} req/s, {setup.router}: {len(requests)} live…"):
                    got, others = live(stack, setup, requests)
                sim = simulated(setup, requests, args.seed)
                runs.append((rate, setup, got, sim, others))
                out.print(
                    f"{rate:g} req/s {setup.label}: live p90 {got.p90_s:.2f} s, sim "
                    f"{sim.p90_s:.2f} s; hit {got.hit_rate:.1%} / {sim.hit_rate:.1%}; "
                    f"{got.completed}/{got.offered}; others {others:.2f} cores"
                )
    notes = [
        f"{CUSTOMERS} customers with {CONTEXT_TOKENS:,}-token contexts (Zipf 1.1), questions "
        "of median 32 tokens, 16 tokens out, Poisson arrivals for "
        f"{args.live_duration:g} s per run, seed {args.seed}; {REPLICAS} replicas of the "
        f"`{PRESET}` preset. Others' cores: what processes not ours kept busy during the "
        "live run (2 cores in all)."
    ]
    return rows(runs), notes
