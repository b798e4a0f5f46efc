"""Distributed mode (Redis) against in-memory, side by side in one run.

One private ``redis-server``, two emulated engines and eight gateways, all on this
machine (see ``distributed_stack``): a memory-mode gateway (``mem``), Redis-mode
fleets of 1, 2 and 3 replicas (``one``, ``two``, ``three``: own key prefixes, one
Redis), and one more Redis-mode gateway (``lim``) whose requests carry a
rate-limited tenant's key, so each also pays the store's ``take`` round trip.

1. Added latency: requests to the engine directly, to ``mem``, to ``one`` and to
   ``lim``, interleaved (slot i of every target, a quarter of a gap apart, in
   rotating order) at each ``--rates`` per target (the machine carries 4× that);
   added = gateway percentile − direct percentile. CPU per request of each gateway
   from /proc; store round trips per request from the gateways'
   ``sluicegate_store_round_trip_seconds_count``; falls back from global mode from
   ``sluicegate_store_transitions_total``.
2. Throughput: open-loop steps (saturation_probe's ramp ×2, then geometric bisection),
   the load spread round-robin over a fleet's replicas; the fleets take turns step by
   step. Each step records the CPU of every gateway of the fleet, of Redis, of the
   engine, of the load generator and of everything else.
3. Hand-off: model ``h`` has a cap of 1; A (40 ms) takes the slot, 15 ms later B
   queues; grant = B's send time + its ``X-Sluicegate-Queue-Ms`` − A's end (client
   clock), with B at the same gateway or at another replica. A hand-off where B queued
   for less than A's remaining 25 ms − 10 ms (B arrived late, or the cap did not hold:
   the engine's ``max_running_seen`` tells which) is counted apart.
4. Redis memory per waiting ticket: ``INFO memory`` ``used_memory`` before and after
   each ``--parked`` count of requests waits in ``one`` for ``h``'s slot; then the
   commands Redis ran over the whole run (``INFO commandstats``).

    python benchmarks/bench_distributed.py [--quick|--smoke] [--write docs/BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from distributed_load import (
    Answer,
    Target,
    client_session,
    fire,
    handoff,
    interleaved,
)
from distributed_preemption import preemption, start_preemption
from distributed_shedding import shedding_agreement
from distributed_sizing import sizing
from distributed_stack import (
    FAST_MODEL,
    HANDOFF_MODEL,
    KEYS,
    Bench,
    Fleet,
    Meter,
    idle_cores,
    link_state,
    redis_commands,
    running_redis,
    start_fleet,
    store_counters,
)
from distributed_throughput import ceiling_grid, fmt, ratio, steps_grid, throughput
from livestack import (
    LiveStack,
    Process,
    apply_presets,
    fast_loop,
    live_stack,
    raise_open_files,
    wide_console,
    write_report,
)
from tables import Grid, cells, percentile_ms

SECTION = "bench_distributed"
HOLD_TOKENS, WAIT_TOKENS, GAP_S = 4, 1, 0.015
MODES: dict[str, dict[str, object]] = {
    "quick": {"latency_s": 4.0, "warmup": 60, "idle_s": 1.5, "step_s": 1.5, "refine": 1}
    | {"handoffs": 40, "parked": [1000], "preempt_rounds": 3, "shedding_s": 15.0},
    "smoke": {"rates": [50.0], "latency_s": 1.0, "warmup": 20, "idle_s": 0.5, "step_s": 1.0}
    | {"start_rate": 100.0, "max_rate": 100.0, "refine": 0, "pause_s": 0.1, "handoffs": 5}
    | {"parked": [200], "preempt_rounds": 1, "shedding_s": 3.0, "shedding_policies": ["fifo"]},
}
"""Settings of ``--quick`` and ``--smoke`` (each unless given on the command line)."""


# --------------------------------------------------------------------- latency


@dataclass(frozen=True, slots=True)
class Window:
    """What one latency run cost: CPU µs per request per target, Redis's (net of its idle
    load, over both Redis-mode targets), cores used by processes not ours, and per fleet
    the store round trips per request and the falls back from global mode."""

    cpu_us: dict[str, float]
    redis_us: float
    others: float
    trips: dict[str, float]
    falls: dict[str, float]


async def latency(
    bench: Bench, idle: dict[str, float], args: argparse.Namespace, console: Console
) -> Grid:
    """Phase 1: added latency, gateway CPU and round trips per request, at each rate."""
    fleets = {"memory": "mem", "redis": "one", "redis + rate limit": "lim"}
    engine = bench.engines[FAST_MODEL]
    targets = [Target("direct", (engine.url,), KEYS["free"], FAST_MODEL)]
    targets += [
        bench.target(name, fleet, "limited" if fleet == "lim" else "free")
        for name, fleet in fleets.items()
    ]
    with console.status("warming up…"):
        await fire(interleaved(targets, args.warmup, 100.0), 30.0)
    rows: list[list[str]] = []
    async with client_session(10.0) as session:
        for rate in args.rates:
            n = max(100, round(rate * args.latency_s))
            start = {f: await store_counters(session, bench.fleets[f]) for f in fleets.values()}
            meter = Meter(bench.processes)
            with console.status(f"latency: {n} requests per target at {rate:g}/s…"):
                answers = await fire(interleaved(targets, n, rate), 30.0)
            used, wall = meter.read()
            end = {f: await store_counters(session, bench.fleets[f]) for f in fleets.values()}
            ours = sum(v for k, v in used.items() if k != "machine")
            window = Window(
                cpu_us={
                    name: sum(used[g.name] for g in bench.fleets[fleet].gateways) / n * 1e6
                    for name, fleet in fleets.items()
                },
                redis_us=(used["redis"] - idle["redis"] * wall) / (2 * n) * 1e6,
                others=max(0.0, used["machine"] - ours) / wall,
                trips={f: (end[f][0] - start[f][0]) / n for f in fleets.values()},
                falls={f: end[f][1] - start[f][1] for f in fleets.values()},
            )
            rows += _latency_rows(rate, answers, fleets, window)
    headers = "rate/s|target|ok|errors|p50 ms|p99 ms|added p50|added p99|added p50 vs memory|"
    headers += "added p99 vs memory|gateway CPU µs/req|vs memory|store round trips/req|"
    headers += "Redis CPU µs/req|store fallbacks|lag p99 ms|CPU others"
    title = "Added latency and CPU per request, one gateway each (per-target open-loop rate)"
    return title, cells(headers), rows


def _latency_rows(
    rate: float, answers: list[Answer], fleets: dict[str, str], window: Window
) -> list[list[str]]:
    names = ["direct", *fleets]
    ok = {
        name: [a.latency_s for a in answers if a.target == name and not a.error] for name in names
    }
    base = {q: percentile_ms(ok["direct"], q) for q in (50, 99)}
    added = {name: {q: percentile_ms(ok[name], q) - base[q] for q in (50, 99)} for name in ok}
    cpu_us = window.cpu_us
    rows = []
    for name, values in ok.items():
        sent = [a for a in answers if a.target == name]
        lag = percentile_ms([a.lag_s for a in sent], 99)
        row = [f"{rate:g}", name, str(len(values)), str(len(sent) - len(values))]
        row += [fmt(percentile_ms(values, 50)), fmt(percentile_ms(values, 99))]
        if name == "direct":
            row += ["—"] * 9
        else:
            fleet = fleets[name]
            row += [f"{added[name][50]:+.2f}", f"{added[name][99]:+.2f}"]
            row += [ratio(added[name][q], added["memory"][q]) for q in (50, 99)]
            row += [f"{cpu_us[name]:.0f}", ratio(cpu_us[name], cpu_us["memory"])]
            row += [f"{window.trips[fleet]:.2f}"]
            row += [f"{window.redis_us:.0f}" if fleet != "mem" else "—"]
            row += [f"{window.falls[fleet]:.0f}"]
        rows.append([*row, fmt(lag), f"{window.others:.2f}"])
    return rows


# -------------------------------------------------------------------- hand-off


async def handoffs(bench: Bench, args: argparse.Namespace, console: Console) -> Grid:
    """Phase 3: grant latency of the cap-1 model's slot, within a gateway and across."""
    pairs = {
        "memory, one gateway": (("mem", 0), ("mem", 0)),
        "redis, same replica": (("two", 0), ("two", 0)),
        "redis, across replicas": (("two", 0), ("two", 1)),
    }
    variants = {
        name: (
            bench.handoff_target(*holder, max_tokens=HOLD_TOKENS),
            bench.handoff_target(*waiter, max_tokens=WAIT_TOKENS),
        )
        for name, (holder, waiter) in pairs.items()
    }
    grants: dict[str, list[float]] = {name: [] for name in variants}
    verdicts: dict[str, Counter[str]] = {name: Counter() for name in variants}
    names = list(variants)
    min_wait_ms = HOLD_TOKENS * 10 - GAP_S * 1000 - 10  # A's remaining service, less slack
    async with client_session(30.0) as session:
        with console.status(f"hand-offs: {args.handoffs} per variant…"):
            for i in range(-5, args.handoffs):  # the first 5 rounds warm the connections up
                for name in names[i % 3 :] + names[: i % 3]:
                    result = await handoff(session, *variants[name], GAP_S, min_wait_ms)
                    if i >= 0:
                        verdicts[name][result.verdict] += 1
                    if i >= 0 and result.verdict == "ok":
                        grants[name].append(result.grant_s)
        engine = bench.engines[HANDOFF_MODEL].url + "/emulator/stats"
        async with session.get(engine) as response:
            most = (await response.json())["max_running_seen"]
    rows = []
    base = {q: percentile_ms(grants[names[0]], q) for q in (50, 99)}
    for name, values in grants.items():
        row = [name, str(len(values)), str(verdicts[name]["early"]), str(verdicts[name]["failed"])]
        row += [fmt(percentile_ms(values, q)) for q in (50, 90, 99, 100)]
        rows.append(row + [f"{percentile_ms(values, q) - base[q]:+.2f}" for q in (50, 99)])
    headers = (
        f"variant|hand-offs|B queued < {min_wait_ms:g} ms|failed or A queued|grant p50 ms|p90 ms|"
    )
    headers += "p99 ms|max ms|p50 − memory's ms|p99 − memory's ms"
    title = "Grant latency: slot freed by A → queued B admitted (client clock); "
    title += f"engine `h`'s most requests running at once: {most} (cap 1)"
    return title, cells(headers), rows


# ------------------------------------------------------------------------ main


def start(stack: LiveStack, redis: Process) -> Bench:
    """Start the engines and the fleets (see the module docstring)."""
    engines = {
        FAST_MODEL: stack.engine(FAST_MODEL, "instant"),
        HANDOFF_MODEL: stack.engine(HANDOFF_MODEL, "independent"),
    }
    urls = {model: engine.url for model, engine in engines.items()}
    sizes = {"one": 1, "two": 2, "three": 3, "lim": 1}
    fleets = {"mem": start_fleet(stack, "mem", "memory", urls, 1)}
    fleets |= {name: start_fleet(stack, name, redis.url, urls, n) for name, n in sizes.items()}
    return Bench(redis, engines, fleets)


async def run(
    bench: Bench, pre: tuple[Process, Fleet, Fleet], args: argparse.Namespace, console: Console
) -> list[Grid]:
    """Every phase, in order (the throughput phase, which overloads the machine, last); the
    grids to print and write."""
    with console.status("idle load…"):
        idle = await idle_cores(bench, args.idle_s)
    grids = [await latency(bench, idle, args, console)]
    states = [await link_state(bench, "latency")]
    grids.append(await handoffs(bench, args, console))
    states.append(await link_state(bench, "hand-offs"))
    with console.status("preemption across replicas…"):
        grids.append((await preemption(pre[0], pre[1:], args.preempt_rounds))[0])
    grids.append(await sizing(bench, args, console))
    states.append(await link_state(bench, "parking"))
    console.print("throughput steps:")
    steps = await throughput(bench, args, console)
    await asyncio.sleep(3.0)  # a replica that fell back probes every 0.5 s
    states.append(await link_state(bench, "throughput (+3 s)"))
    headers = cells("after phase|in global mode|not in global mode|store fallbacks so far")
    grids.append(("Redis-mode gateways' store link after each phase", headers, states))
    grids += [
        await redis_commands(bench),
        ceiling_grid(bench, steps, idle, min(200.0, args.start_rate)),
    ]
    return [*grids, steps_grid(bench, steps)]


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs (under 3 minutes)")
    parser.add_argument("--smoke", action="store_true", help="a tiny run, for the smoke test")
    parser.add_argument("--rates", type=float, nargs="+", default=[50.0, 100.0], help="per target")
    parser.add_argument("--latency-s", type=float, default=15.0, help="per rate")
    parser.add_argument("--idle-s", type=float, default=3.0, help="idle CPU measured first")
    parser.add_argument("--warmup", type=int, default=200, help="requests per target")
    parser.add_argument("--start-rate", type=float, default=200.0)
    parser.add_argument("--max-rate", type=float, default=6400.0)
    parser.add_argument("--step-s", type=float, default=3.0)
    parser.add_argument("--refine", type=int, default=3, help="bisections after the ramp")
    parser.add_argument("--pause-s", type=float, default=0.5)
    parser.add_argument("--p99-limit-ms", type=float, default=500.0)
    parser.add_argument("--noisy-cores", type=float, default=0.25, help="retry threshold")
    parser.add_argument("--handoffs", type=int, default=200, help="per variant")
    parser.add_argument("--parked", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--park-rate", type=float, default=2000.0, help="parked requests/s")
    parser.add_argument("--preempt-rounds", type=int, default=5, help="per fleet")
    parser.add_argument("--shedding-s", type=float, default=30.0, help="per policy")
    parser.add_argument("--shedding-policies", nargs="+", default=["fifo", "slack"])
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args(argv)
    return apply_presets(parser, args, [MODES[m] for m in ("quick", "smoke") if getattr(args, m)])


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the tables, optionally write them into Markdown."""
    args = _arguments(argv)
    console = wide_console()
    raise_open_files(max(args.parked) + 4096)
    with running_redis() as redis, live_stack(console, "sluicegate-distributed-") as stack:
        with console.status("starting Redis, 2 engines and 8 gateways…"):
            bench = start(stack, redis)
            pre = start_preemption(stack, redis)
        with asyncio.Runner(loop_factory=fast_loop) as runner:
            grids = runner.run(run(bench, pre, args, console))
            shedding = shedding_agreement(
                stack, redis, policies=args.shedding_policies, duration_s=args.shedding_s,
                console=console,
            )  # fmt: skip
            grids.append(runner.run(shedding))
    notes = [
        "Engines: model `m` on the `instant` preset, caps 256 (nothing queues: the gateway "
        "dominates); model `h` on `independent` (10 ms per output token), cap 1. Lanes `fifo`; "
        "Redis mode with `lease_ttl_s: 5`, `timeout_ms: 50`. Redis, engines, gateways and the "
        "load generator all share the machine's cores.",
        "Latency: one gateway per target (`memory`, `redis` = 1 Redis-mode replica, "
        "`redis + rate limit` = its requests carry a rate-limited tenant's key, limits far "
        "above the load); Redis CPU per request counts both Redis-mode targets' requests.",
        "Rates are per target: the four targets together offer the machine 4× that.",
        "Throughput: pass = achieved ≥ 95% of offered, p99 < "
        f"{args.p99_limit_ms:g} ms, no errors; {args.step_s:g} s steps; a failed step while "
        f"other users of the machine kept > {args.noisy_cores:g} cores busy is run once more. "
        "CPU-bound ceiling = cores × 10⁶ / (µs per request of gateways + Redis + engine + "
        "load generator), from the passing steps: less sensitive to the machine's other users.",
        f"Grant latency: A ({HOLD_TOKENS * 10} ms) holds the cap-1 slot, B is sent "
        f"{GAP_S * 1000:g} ms later; grant = B's send time + its `X-Sluicegate-Queue-Ms` − "
        "the client's receipt of A's answer (client clock: A's answer reaches the client "
        "after its slot is freed, so the memory-mode gateway, which hands the slot over within "
        "one event-loop turn, reads below 0: read the columns relative to it).",
        "Store fallbacks: how often the gateways left global mode (a store round trip "
        "slower than `timeout_ms`); a gateway not in global mode admits by its local limits.",
    ]
    write_report(
        args,
        script="bench_distributed.py",
        section=SECTION,
        title="Distributed mode (Redis) vs in-memory",
        notes=notes,
        grids=grids,
        argv=argv,
        out=console,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
