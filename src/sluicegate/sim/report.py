"""Simulation reports: rich tables comparing policies, per-request CSV and summary JSON.

Both files are byte-identical for identical inputs: rows in workload order,
keys sorted, floats written with a fixed number of digits, no timestamps.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sluicegate.outcomes import COMPLETED, LatencyStats, RequestOutcome
from sluicegate.sim.prefix_hits import PrefixCounts, prefix_table
from sluicegate.sim.result import PREEMPTED, SimResult
from sluicegate.sim.run_summary import GroupStats, Summary

JsonValue = None | bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"]

CSV_COLUMNS = (
    "index", "tenant", "lane", "priority", "outcome", "arrival_s", "admit_s",
    "first_token_s", "finish_s", "deadline_s", "queue_wait_s", "ttft_s", "e2e_s",
    "prompt_tokens", "output_tokens", "generated_tokens", "replica", "requeues",
)  # fmt: skip
_DASH = "–"


def _num(value: float | None, digits: int = 6) -> float | None:
    """``value`` rounded to ``digits`` significant digits; ``None`` if missing or not finite."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.{digits}g}")


def _latency_dict(stats: LatencyStats) -> dict[str, JsonValue]:
    return {
        "count": stats.count,
        "mean": _num(stats.mean),
        "p50": _num(stats.p50),
        "p90": _num(stats.p90),
        "p99": _num(stats.p99),
        "p99.9": _num(stats.p999),
    }


def group_to_dict(group: GroupStats) -> dict[str, JsonValue]:
    """A JSON-ready dict of one group's statistics (times in seconds)."""
    return {
        "requests": group.requests,
        "outcomes": dict(group.outcomes),
        "requeued": group.requeued,
        "queue_wait_s": _latency_dict(group.queue_wait),
        "ttft_s": _latency_dict(group.ttft),
        "e2e_s": _latency_dict(group.e2e),
        "slo_attainment": _num(group.slo_attainment),
        "goodput_rps": _num(group.goodput_rps),
        "goodput_tokens_per_s": _num(group.goodput_tokens_per_s),
        "throughput_tokens_per_s": _num(group.throughput_tokens_per_s),
        "jain_fairness": _num(group.fairness),
    }


def _prefix_counts_dict(counts: PrefixCounts) -> dict[str, JsonValue]:
    return {
        "token_hit_rate": _num(counts.token_hit_rate),
        "request_hit_rate": _num(counts.request_hit_rate),
        "queried_tokens": counts.queried_tokens,
        "cached_tokens": counts.cached_tokens,
        "requests": counts.requests,
        "hit_requests": counts.hit_requests,
    }


def prefix_to_dict(by_replica: Mapping[str, PrefixCounts]) -> dict[str, JsonValue] | None:
    """A run's ``prefix_cache``: hit rates and counts over all replicas, and ``replicas``
    by name (``sim/prefix_hits.py``); ``None`` when no replica looked its cache up."""
    total = PrefixCounts.total(by_replica.values())
    if not total.requests:
        return None
    out = _prefix_counts_dict(total)
    out["replicas"] = {name: _prefix_counts_dict(c) for name, c in by_replica.items()}
    return out


def summary_to_dict(summary: Summary) -> dict[str, JsonValue]:
    """A JSON-ready dict of one run's summary (``prefix_cache`` only when the engines
    looked their prefix caches up)."""
    out: dict[str, JsonValue] = {
        "label": summary.label,
        "rate_multiplier": _num(summary.rate_multiplier),
        "offered_rps": _num(summary.offered_rps),
        "span_s": _num(summary.span_s),
        "replicas": summary.replicas,
        "capacity_rps": _num(summary.capacity_rps),
        "load": _num(summary.load),
        "any_step_running": _num(summary.any_step_running),
        "slot_cap": summary.slot_cap,
        "slot_occupancy": _num(summary.slot_occupancy),
        "kv_usage_mean": _num(summary.kv_usage_mean),
        "kv_usage_peak": _num(summary.kv_usage_peak),
        "engine_preemptions": summary.engine_preemptions,
        "overall": group_to_dict(summary.overall),
        "lanes": {name: group_to_dict(g) for name, g in summary.lanes.items()},
        "tenants": {name: group_to_dict(g) for name, g in summary.tenants.items()},
    }
    prefix = prefix_to_dict(summary.prefix_by_replica)
    if prefix is not None:
        out["prefix_cache"] = prefix
    return out


def write_json(
    path: Path,
    summaries: Sequence[Summary],
    *,
    sweep: Sequence[Summary] = (),
    meta: Mapping[str, JsonValue] | None = None,
) -> Path:
    """Write the summaries (and any load sweep) as JSON with sorted keys; returns ``path``."""
    document: dict[str, JsonValue] = {
        "meta": dict(meta or {}),
        "policies": {s.label: summary_to_dict(s) for s in summaries},
        "sweep": [summary_to_dict(s) for s in sweep],
    }
    text = json.dumps(document, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False)
    path.write_text(text + "\n", encoding="utf-8")
    return path


def record_row(rec: RequestOutcome) -> list[str]:
    """One CSV row of ``CSV_COLUMNS``; times with 6 decimals, empty when missing."""
    times = (
        rec.arrival_s, rec.admit_s, rec.first_token_s, rec.finish_s, rec.deadline_s,
        rec.queue_wait_s, rec.ttft_s, rec.e2e_s,
    )  # fmt: skip
    return [
        str(rec.index), rec.tenant, rec.lane, str(rec.priority), rec.outcome,
        *["" if t is None else f"{t:.6f}" for t in times],
        str(rec.prompt_tokens), str(rec.output_tokens), str(rec.generated_tokens),
        rec.replica or "", str(rec.requeues),
    ]  # fmt: skip


def write_csv(path: Path, result: SimResult) -> Path:
    """Write one row per request (workload order), times in seconds; returns ``path``."""
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        writer.writerows(record_row(rec) for rec in result.records)
    return path


# ---------------------------------------------------------------------- tables


def _seconds(value: float | None) -> str:
    return _DASH if value is None else f"{value:.3f}"


def _percent(value: float | None) -> str:
    return _DASH if value is None else f"{100.0 * value:.1f}%"


def _rate(value: float | None) -> str:
    return _DASH if value is None else f"{value:.2f}"


GroupRow = tuple[str, Callable[[GroupStats], str]]


def _latency_cell(attr: str, name: str) -> Callable[[GroupStats], str]:
    def cell(group: GroupStats) -> str:
        stats: LatencyStats = getattr(group, attr)
        value: float | None = getattr(stats, name)
        return _seconds(value)

    return cell


def _outcome_cell(outcome: str) -> Callable[[GroupStats], str]:
    def cell(group: GroupStats) -> str:
        return str(group.outcomes.get(outcome, 0))

    return cell


_STATS = (("mean", "mean"), ("p50", "p50"), ("p90", "p90"), ("p99", "p99"), ("p99.9", "p999"))
_LATENCY_ROWS: tuple[GroupRow, ...] = tuple(
    (f"{title} {label}", _latency_cell(attr, name))
    for title, attr in (("queue wait", "queue_wait"), ("TTFT", "ttft"), ("e2e", "e2e"))
    for label, name in _STATS
)
_ROWS: tuple[GroupRow, ...] = (
    ("requests", lambda g: str(g.requests)),
    ("completed", lambda g: str(g.completed)),
    ("preempted", lambda g: str(g.preempted)),
    ("requeued", lambda g: str(g.requeued)),
    *_LATENCY_ROWS,
    ("SLO attainment", lambda g: _percent(g.slo_attainment)),
    ("goodput req/s", lambda g: _rate(g.goodput_rps)),
    ("goodput tok/s", lambda g: _rate(g.goodput_tokens_per_s)),
    ("throughput tok/s", lambda g: _rate(g.throughput_tokens_per_s)),
    ("Jain fairness", lambda g: _DASH if g.fairness is None else f"{g.fairness:.3f}"),
)


def group_table(
    title: str, groups: Mapping[str, GroupStats | None], caption: str | None = None
) -> Table:
    """A table with one column per policy (``groups`` maps policy label → its stats)."""
    table = Table(title=title, title_justify="left", caption=caption)
    table.add_column("metric (times in s)")
    for label in groups:
        table.add_column(label, justify="right")
    present = [g for g in groups.values() if g is not None]
    reasons = sorted({o for g in present for o in g.outcomes} - {COMPLETED, PREEMPTED})
    rows: list[GroupRow] = list(_ROWS[:2])
    rows += [(o, _outcome_cell(o)) for o in reasons]
    rows += _ROWS[2:]
    for name, cell in rows:
        table.add_row(name, *(_DASH if g is None else cell(g) for g in groups.values()))
    return table


def engine_table(summaries: Sequence[Summary]) -> Table:
    """Load and engine figures per policy: offered, capacity and ρ, slot occupancy
    against the gateway's cap, KV usage, KV preemptions (``sim/run_summary.py`` defines each)."""
    table = Table(title="engines", title_justify="left")
    table.add_column("metric")
    for s in summaries:
        table.add_column(s.label, justify="right")
    table.add_row("replicas", *(str(s.replicas) for s in summaries))
    table.add_row("offered req/s", *(_rate(s.offered_rps) for s in summaries))
    table.add_row("capacity req/s", *(_rate(s.capacity_rps) for s in summaries))
    table.add_row("load ρ", *(_rate(s.load) for s in summaries))
    table.add_row(
        "slot cap", *(_DASH if s.slot_cap is None else str(s.slot_cap) for s in summaries)
    )
    table.add_row("slot occupancy", *(_percent(s.slot_occupancy) for s in summaries))
    table.add_row("KV usage mean", *(_percent(s.kv_usage_mean) for s in summaries))
    table.add_row("KV usage peak", *(_percent(s.kv_usage_peak) for s in summaries))
    table.add_row("any step running", *(_percent(s.any_step_running) for s in summaries))
    table.add_row("KV preemptions", *(str(s.engine_preemptions) for s in summaries))
    return table


def sweep_table(summaries: Sequence[Summary]) -> Table:
    """One row per run of a load sweep: offered req/s and load ρ, p99 end-to-end per lane,
    SLO attainment."""
    lanes = list(dict.fromkeys(name for s in summaries for name in s.lanes))
    lanes = [n for n in lanes if any(s.lanes[n].requests for s in summaries if n in s.lanes)]
    table = Table(title="load sweep (p99 end-to-end, s)", title_justify="left")
    table.add_column("run")
    table.add_column("offered req/s", justify="right")
    table.add_column("load ρ", justify="right")
    for lane in lanes:
        table.add_column(lane, justify="right")
    table.add_column("SLO attainment", justify="right")
    for s in summaries:
        cells = [_seconds(s.lanes[n].e2e.p99) if n in s.lanes else _DASH for n in lanes]
        table.add_row(
            s.label, _rate(s.offered_rps), _rate(s.load), *cells, _percent(s.overall.slo_attainment)
        )
    return table


MAX_TENANT_TABLES = 12
"""The most tenant tables printed (the busiest); every tenant is in ``results.json``."""


def _busiest(tenants: Sequence[str], summaries: Sequence[Summary]) -> list[str]:
    """At most :data:`MAX_TENANT_TABLES` of ``tenants``, those with the most requests, in
    name order."""
    if len(tenants) <= MAX_TENANT_TABLES:
        return list(tenants)

    def requests(name: str) -> int:
        return max((s.tenants[name].requests for s in summaries if name in s.tenants), default=0)

    busiest = sorted(tenants, key=lambda name: (-requests(name), name))[:MAX_TENANT_TABLES]
    return sorted(busiest)


def comparison_tables(summaries: Sequence[Summary]) -> list[Table]:
    """Tables comparing ``summaries`` side by side: overall, each lane, each tenant, engines,
    and prefix-cache hits when any run looked its caches up."""
    tables = [group_table("all requests", {s.label: s.overall for s in summaries})]
    lanes = list(dict.fromkeys(name for s in summaries for name in s.lanes))
    tenants = sorted({name for s in summaries for name in s.tenants})
    for lane in lanes:
        groups = {s.label: s.lanes.get(lane) for s in summaries}
        if any(g is not None and g.requests for g in groups.values()):
            tables.append(group_table(f"lane {lane}", groups))
    if len(tenants) > 1:
        shown = _busiest(tenants, summaries)
        hidden = len(tenants) - len(shown)
        note = f"{hidden} quieter tenants are only in results.json" if hidden else None
        for tenant in shown:
            groups = {s.label: s.tenants.get(tenant) for s in summaries}
            last = tenant == shown[-1]
            tables.append(group_table(f"tenant {tenant}", groups, note if last else None))
    tables.append(engine_table(summaries))
    prefix = prefix_table([s.label for s in summaries], [s.prefix_by_replica for s in summaries])
    if prefix is not None:
        tables.append(prefix)
    return tables


LOAD_NOTE = (
    "capacity req/s: completions per second under backlog, measured once for this config and "
    "workload (the same for every policy); load ρ = offered ÷ capacity; slot occupancy = mean "
    "running requests ÷ slot cap, the most the gateway's caps and the engines let run at once"
)


def print_report(summaries: Sequence[Summary], console: Console) -> None:
    """Print every comparison table, then what the load figures mean."""
    for table in comparison_tables(summaries):
        console.print(table)
    console.print(LOAD_NOTE)
