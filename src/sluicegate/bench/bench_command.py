"""``sluicegate bench``: replay a schedule open-loop against a server and report."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sluicegate.bench.analysis import LaneSummary, compare, summarize
from sluicegate.bench.loadgen import LoadResult, run_load
from sluicegate.bench.records import RequestRecord, read_csv, write_csv
from sluicegate.outcomes import WorkloadRequest


@dataclass(frozen=True)
class BenchOptions:
    """What to send where, and where the results go."""

    url: str
    model: str
    keys: dict[str, str]
    stream: bool
    ignore_eos: bool
    timeout_s: float
    slo_ms: dict[str, float]
    out: Path | None
    compare_to: Path | None


def parse_assignments(items: list[str], name: str) -> dict[str, str]:
    """``A=B`` options into a dict; ``ValueError`` naming the option otherwise."""
    result: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise ValueError(f"{name} must look like NAME=VALUE, got {item!r}")
        result[key] = value
    return result


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value * 1000:.1f}"


def summary_table(summaries: list[LaneSummary], title: str) -> Table:
    """One column per lane (and ``all``), one row per figure; latencies in ms."""
    table = Table(title=title)
    table.add_column("figure")
    for summary in summaries:
        table.add_column(summary.lane, justify="right")
    rows: list[tuple[str, list[str]]] = [
        ("requests", [str(s.requests) for s in summaries]),
        ("succeeded", [str(s.succeeded) for s in summaries]),
        *(
            (f"status {name}", [str(s.status_counts.get(name, 0)) for s in summaries])
            for name in ("429", "503", "other")
        ),
    ]
    for label, pick in (("TTFT", "ttft"), ("e2e", "e2e"), ("queue", "queue_wait")):
        for q in ("p50", "p90", "p99", "p999"):
            cells = [_ms(getattr(getattr(s, pick), q)) for s in summaries]
            rows.append((f"{label} {q.replace('p999', 'p99.9')} ms", cells))
    rows.append(
        ("SLO attainment", [
            "—" if s.slo_attainment is None else f"{100 * s.slo_attainment:.1f}%"
            for s in summaries
        ])
    )  # fmt: skip
    rows.append(("goodput req/s", [f"{s.goodput_rps:.2f}" for s in summaries]))
    rows.append(("goodput tok/s", [f"{s.goodput_tokens_per_s:.0f}" for s in summaries]))
    for label, cells in rows:
        table.add_row(label, *cells)
    return table


def run_bench(schedule: list[WorkloadRequest], options: BenchOptions, console: Console) -> int:
    """Replay ``schedule``; print the summary (and comparison); write the CSV. Exit code."""
    with Progress(
        TextColumn("[bold]load"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=True,
    ) as bar:  # fmt: skip
        task = bar.add_task("requests", total=len(schedule))

        def advance(_record: RequestRecord) -> None:
            bar.advance(task)

        result: LoadResult = asyncio.run(
            run_load(
                schedule,
                base_url=options.url,
                model=options.model,
                api_keys=options.keys,
                stream=options.stream,
                ignore_eos=options.ignore_eos,
                timeout_s=options.timeout_s,
                on_record=advance,
            )
        )
    records = list(result.records)
    summaries = summarize(records, options.slo_ms)
    console.print(summary_table(summaries, f"{len(records)} requests to {options.url}"))
    lag_ms = result.launch_lag_p99_s * 1000
    console.print(
        f"offered {result.offered_rps:.1f} req/s, launched {result.launch_rps:.1f} req/s; "
        f"launch lag p99 {lag_ms:.1f} ms "
        + ("(the generator kept up)" if result.keeping_up() else "[yellow](the generator "
           "fell behind: its own ceiling, not the server's, limits these figures)[/yellow]")
    )  # fmt: skip
    if options.out is not None:
        write_csv(records, options.out)
        console.print(f"wrote {options.out}")
    if options.compare_to is not None:
        baseline = summarize(read_csv(options.compare_to), options.slo_ms)
        console.print(compare(baseline, summaries, (options.compare_to.name, "this run")))
    return 0
