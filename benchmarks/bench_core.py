"""Core scheduler cost: submit + grant + complete per ticket with 10,000 tickets queued.

For every registered policy: fill a lane with ``--queued`` waiting tickets
behind ``--running`` running ones, then time a steady state where each
iteration submits one new ticket (it queues) and completes one running ticket
(which grants the freed slot to the queue's head). The figure is the median
over ``--repeats`` runs of the mean cost per iteration.

    python benchmarks/bench_core.py [--write docs/BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import platform
import random
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sluicegate.core import (
    Admit,
    BackendSpec,
    LaneSpec,
    ModelSpec,
    Scheduler,
    SchedulerSpec,
    TenantSpec,
    Ticket,
    TicketId,
    Usage,
)
from sluicegate.core.policies import policy_names

BAR_US = 20.0
MARK_BEGIN = "<!-- bench_core:begin -->"
MARK_END = "<!-- bench_core:end -->"


def _scheduler(policy: str, running: int, queued: int, tenants: int) -> Scheduler:
    lane = LaneSpec(
        name="lane",
        max_concurrency=running,
        max_queue=queued * 10,
        queue_timeout_s=1e9,
        slo_ms=30_000.0,
        policy=policy,
    )
    model = ModelSpec(
        name="m",
        backends=tuple(BackendSpec(name=f"b{i}") for i in range(4)),
        lanes=(lane,),
        max_concurrency=running,
    )
    spec = SchedulerSpec(
        models=(model,),
        tenants=tuple(TenantSpec(name=f"t{i}", weight=1.0 + i % 3) for i in range(tenants)),
    )
    return Scheduler(spec)


def _ticket(n: int, now: float, rng: random.Random, tenants: int) -> Ticket:
    return Ticket(
        id=TicketId(f"t{n}"),
        model="m",
        tenant=f"t{rng.randrange(tenants)}",
        lane="lane",
        priority=rng.randrange(6),
        prompt_tokens=rng.randrange(10, 2000),
        max_tokens=rng.choice((64, 256, 1024, 4096)),
        arrival=now,
        true_output_tokens=rng.randrange(1, 512),
    )


def run_once(
    policy: str, *, queued: int, running: int, iterations: int, tenants: int, seed: int
) -> float:
    """Mean microseconds per submit + grant + complete in steady state."""
    rng = random.Random(seed)
    sched = _scheduler(policy, running, queued, tenants)
    now = 0.0
    live: list[TicketId] = []
    n = 0
    for _ in range(running + queued):
        n += 1
        now += 0.001
        for decision in sched.submit(_ticket(n, now, rng, tenants), now):
            if isinstance(decision, Admit):
                live.append(decision.ticket.id)
    assert sched.view("m").queued == queued, "the lane must hold the requested backlog"
    tickets = []
    for _ in range(iterations):
        n += 1
        tickets.append(_ticket(n, now, rng, tenants))
    usage = Usage(prompt_tokens=100, completion_tokens=100, ttft_s=0.05)
    gc.collect()
    gc.disable()
    start = time.perf_counter()
    for ticket in tickets:
        now += 0.001
        sched.submit(ticket, now)
        for decision in sched.complete(live.pop(), usage, now):
            if isinstance(decision, Admit):
                live.append(decision.ticket.id)
    elapsed = time.perf_counter() - start
    gc.enable()
    assert sched.view("m").queued == queued, "steady state must keep the backlog constant"
    return elapsed / iterations * 1e6


def _write(path: Path, section: str) -> None:
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    block = f"{MARK_BEGIN}\n{section}\n{MARK_END}"
    if MARK_BEGIN in text and MARK_END in text:
        head, rest = text.split(MARK_BEGIN, 1)
        tail = rest.split(MARK_END, 1)[1]
        text = head + block + tail
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print a table, optionally write it into a Markdown file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--running", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args(argv)

    console = Console()
    table = Table(title=f"submit + grant + complete, {args.queued:,} queued (µs per ticket)")
    for column in ("policy", "median", "min", "max", f"≤ {BAR_US:g} µs"):
        table.add_column(column, justify="right" if column != "policy" else "left")
    rows = []
    for policy in sorted(policy_names()):
        runs = [
            run_once(
                policy,
                queued=args.queued,
                running=args.running,
                iterations=args.iterations,
                tenants=args.tenants,
                seed=seed,
            )
            for seed in range(args.repeats)
        ]
        median = statistics.median(runs)
        ok = "yes" if median <= BAR_US else "NO"
        rows.append((policy, median, min(runs), max(runs), ok))
        table.add_row(policy, f"{median:.1f}", f"{min(runs):.1f}", f"{max(runs):.1f}", ok)
    console.print(table)

    if args.write is not None:
        command = "python benchmarks/bench_core.py " + " ".join(
            f"--{k} {v}"
            for k, v in (
                ("queued", args.queued),
                ("running", args.running),
                ("iterations", args.iterations),
                ("repeats", args.repeats),
                ("tenants", args.tenants),
            )
        )
        lines = [
            "## Core scheduler: submit + grant + complete per ticket",
            "",
            f"Command: `{command}`  ",
            f"Machine: {platform.machine()}, {platform.processor() or 'unknown cpu'}, "
            f"Python {platform.python_version()}, {sys.platform}  ",
            f"Date: {dt.date.today().isoformat()}  ",
            f"Bar: ≤ {BAR_US:g} µs per ticket (median of runs), SPEC §14.",
            "",
            "| policy | median µs | min µs | max µs | meets bar |",
            "|---|---:|---:|---:|---|",
            *(f"| {p} | {m:.1f} | {lo:.1f} | {hi:.1f} | {ok} |" for p, m, lo, hi, ok in rows),
        ]
        _write(args.write, "\n".join(lines))
        console.print(f"wrote {args.write}")
    return 0 if all(row[4] == "yes" for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
