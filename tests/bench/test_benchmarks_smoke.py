"""Smoke runs of the live benchmarks: each script, in its ``--smoke`` mode, starts real
emulators and a real gateway, drives a tiny load, prints its tables and writes its
section of a Markdown file whose figures must be sane.

The benchmarks' speed bars are not asserted here (they are measured by
``make bench``, never by timed tests); only what holds on a loaded machine too:
every section and table is there, requests succeeded, rates and costs are positive
and finite, and what the gateway must do regardless of speed (reject the excess at
3× capacity, keep the parked queue as asked) happened. The one bar asserted is the
policies benchmark's live/simulator agreement, which the smoke's light load meets
with a wide margin even on a busy machine (see its test).
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"


def run_smoke(script: str, tmp_path: Path) -> tuple[str, str]:
    """Run ``benchmarks/SCRIPT --smoke --write FILE``; return its stdout and the file's text."""
    out = tmp_path / "BENCHMARKS.md"
    done = subprocess.run(
        [sys.executable, f"benchmarks/{script}", "--smoke", "--write", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout, out.read_text(encoding="utf-8")


def section(text: str, name: str) -> str:
    """The body between a benchmark's markers, which must both be there exactly once."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    assert text.count(begin) == 1, text
    assert text.count(end) == 1, text
    body = text.split(begin, 1)[1].split(end, 1)[0]
    for label in ("Command: `python benchmarks/", "Machine:", "Date:"):
        assert label in body, body
    return body


def table(body: str, title: str) -> list[dict[str, str]]:
    """The rows of the Markdown table under ``**title**``, as header → cell.

    A header that repeats an earlier one gets `` #2``, `` #3``… (``live/sim``,
    ``live/sim #2``), so that no column hides another."""
    lines = body.split(f"**{title}**", 1)[1].strip().splitlines()
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    names, _, *cells = rows
    assert cells, f"table {title!r} is empty"
    headers = [
        name if (n := names[:i].count(name)) == 0 else f"{name} #{n + 1}"
        for i, name in enumerate(names)
    ]
    return [dict(zip(headers, row, strict=True)) for row in cells]


def number(cell: str) -> float:
    """A table cell as a float (units, ``%``, ``×`` and thousands separators dropped)."""
    value = float(cell.split()[0].rstrip("%×").replace(",", ""))
    assert math.isfinite(value), cell
    return value


@pytest.mark.slow
def test_overload_smoke_rejects_the_excess_and_reports_every_step(tmp_path: Path) -> None:
    """At 3× capacity some requests are turned away with 429 and the rest succeed; every
    step has its row with sane rates and latencies, and the bars table is written."""
    stdout, text = run_smoke("bench_overload.py", tmp_path)
    assert "Per step" in stdout
    body = section(text, "bench_overload")
    steps = {row["step"]: row for row in table(body, "Per step")}
    assert list(steps) == ["0.5× (baseline)", "3× (overload)", "0.5× (after)"]
    peak = steps["3× (overload)"]
    assert number(peak["429/s"]) > 0
    assert number(peak["offered/s"]) > number(steps["0.5× (baseline)"]["offered/s"]) * 3
    for row in steps.values():
        assert number(row["other errors"]) == 0, row
        assert number(row["admitted/s"]) > 0, row
        # No answer can beat the engine's exact 320 ms service time.
        assert 320 <= number(row["e2e p99 ms"]) < 30_000, row
        assert number(row["gateway RSS MiB (max)"]) > 10, row
    bars = [row["bar"] for row in table(body, "Overload bars (issue: overload)")]
    assert len(bars) == 5


@pytest.mark.slow
def test_policies_smoke_puts_live_and_simulated_side_by_side(tmp_path: Path) -> None:
    """Both policies ran live without a failure, and each live e2e p99 is within 15% of
    the simulated one (the benchmark's own agreement bar), per policy and tenant.

    The smoke load is light (~2 requests/s, outputs of at most 48 tokens, nothing queues),
    so the live run is the emulator's engine model in real time plus the gateway's few
    milliseconds: live/sim measures 1.01-1.03, also with the machine's cores
    oversubscribed 4×, which leaves the bar a wide margin on a busy machine."""
    stdout, text = run_smoke("bench_policies.py", tmp_path)
    assert "Live vs simulated" in stdout
    body = section(text, "bench_policies")
    rows = table(body, "Live vs simulated, per policy and tenant")
    assert {(row["policy"], row["tenant"]) for row in rows} == {
        (policy, tenant) for policy in ("fifo", "slack") for tenant in ("chat", "docs")
    }
    for row in rows:
        assert number(row["live ok"]) == number(row["requests"]) > 0, row
        assert number(row["sim e2e p99 s"]) > 0, row
        # The first live/sim column is the e2e p99's, from the unrounded figures.
        assert 0.85 <= number(row["live/sim"]) <= 1.15, row
    bars = table(body, "Live vs simulator agreement (issue: policies)")
    assert [row["meets"] for row in bars] == ["yes", "yes"], bars


@pytest.mark.slow
def test_scale_smoke_keeps_the_queue_parked_and_measures_cost(tmp_path: Path) -> None:
    """Each point had exactly the waiting requests asked for before and after its
    stream (none again once the parked requests hung up), every stream request
    succeeded, and the CPU cost per request is positive."""
    stdout, text = run_smoke("bench_scale.py", tmp_path)
    assert "Gateway CPU per request" in stdout
    body = section(text, "bench_scale")
    rows = table(body, "Gateway CPU per request")
    assert {row["sweep"] for row in rows} == {"waiting", "tenants"}
    depths = [number(row["waiting (asked)"]) for row in rows if row["sweep"] == "waiting"]
    assert depths == [0, 50, 0]
    for row in rows:
        asked = number(row["waiting (asked)"])
        assert number(row["waiting before"]) == asked == number(row["waiting after"]), row
        assert number(row["ok"]) == number(row["requests"]) > 0, row
        assert 0 < number(row["net µs/req"]) < 1e5, row
        assert number(row["1-core req/s"]) > 0, row


@pytest.mark.slow
def test_distributed_smoke_serves_everything_and_keeps_the_cap(tmp_path: Path) -> None:
    """Every latency request of every target succeeded and each gateway's CPU per request
    is positive; a Redis-mode gateway that never fell back made at least one store round
    trip per request, and the rate-limited tenant's at least half a round trip more (its
    ``take``); every hand-off variant timed some hand-offs while the cap-1 engine never
    ran two requests at once; all 200 parked tickets waited in Redis's sorted set; one
    preemption round on each fleet stopped the four long requests for the four urgent ones
    without exceeding the cap; the shedding comparison replayed its arrivals on both."""
    _, text = run_smoke("bench_distributed.py", tmp_path)
    body = section(text, "bench_distributed")
    title = "Added latency and CPU per request, one gateway each (per-target open-loop rate)"
    rows = {row["target"]: row for row in table(body, title)}
    assert set(rows) == {"direct", "memory", "redis", "redis + rate limit"}
    for name, row in rows.items():
        assert number(row["ok"]) == 100, row
        assert number(row["errors"]) == 0, row
        if name != "direct":
            assert number(row["gateway CPU µs/req"]) > 0, row
    redis, limited = rows["redis"], rows["redis + rate limit"]
    if number(redis["store fallbacks"]) == 0 == number(limited["store fallbacks"]):
        assert number(redis["store round trips/req"]) >= 1.0, redis
        trips = number(limited["store round trips/req"])
        assert trips >= number(redis["store round trips/req"]) + 0.5, limited
    grants = table(
        body,
        "Grant latency: slot freed by A → queued B admitted (client clock); "
        "engine `h`'s most requests running at once: 1 (cap 1)",
    )
    assert [row["variant"] for row in grants] == [
        "memory, one gateway",
        "redis, same replica",
        "redis, across replicas",
    ]
    for row in grants:
        assert number(row["hand-offs"]) > 0, row
    (parked,) = table(body, "Redis memory per waiting ticket (INFO memory used_memory)")
    assert number(parked["parked"]) == 200 == number(parked["in the lane's sorted set"]), parked
    assert number(parked["bytes per sorted-set entry"]) > 0, parked
    preempted = table(
        body,
        "Preemption across replicas: 4 urgent interactive requests at one gateway, "
        "4 long best-effort ones running through another (cap 4, preempt_after_ms 200)",
    )
    assert [row["fleet"] for row in preempted] == ["pmem", "pre"]
    for row in preempted:
        # One round: all four interactive requests answered, all four long ones stopped
        # for them, the engine never above the cap.
        assert number(row["interactive requests"]) == 4, row
        assert row["long requests stopped"] == "4 of 4", row
        assert number(row["rounds over the cap"]) == 0, row
    shed_title = body.split("**Shedding: three replicas", 1)[1].split("**", 1)[0]
    shed = table(body, "Shedding: three replicas" + shed_title)
    assert [(row["policy"], row["compared with one process"]) for row in shed] == [
        ("fifo", "3 replicas"),
        ("fifo", "another process"),
    ]
    for row in shed:
        assert number(row["arrivals"]) > 0, row


@pytest.mark.slow
def test_floor_smoke_measures_every_target_on_both_upstreams(tmp_path: Path) -> None:
    """On both upstreams every fixed-rate phase (100/s, 300/s, streaming) served every
    request of direct, the pass-through and both sluicegates (lane set-ups ``never`` and
    ``default``) without an error, each proxy's CPU per request is positive and its ratio
    to the pass-through's is the quotient of the two; the targets tables name issue 18's
    twelve bars and issue 33's four for each sluicegate."""
    _, text = run_smoke("bench_floor.py", tmp_path)
    body = section(text, "bench_floor")
    gateways = ("sluicegate (never)", "sluicegate (default)")
    bars = table(body, "Issue 18 targets")
    assert len(bars) == 12 * len(gateways), bars
    assert {row["bar"].split(":")[0] for row in bars} == {"fake", "emulator"}
    floor_bars = table(body, "Issue 33 targets (tiny aiohttp upstream)")
    assert sorted(row["bar"].split(":")[0] for row in floor_bars) == sorted(gateways * 4)
    for upstream in ("tiny aiohttp upstream", "emulator"):
        title = (
            f"{upstream}: fixed rates per target, medians of the repeats (streaming: TTFT; "
            "direct's CPU: the upstream's per request answered)"
        )
        rows = table(body, title)
        assert {(row["phase"], row["target"]) for row in rows} == {
            (phase, target)
            for phase in ("100/s", "300/s", "stream 100/s")
            for target in ("direct", "pass-through", *gateways)
        }
        floor = {
            row["phase"]: number(row["CPU µs/req"])
            for row in rows
            if row["target"] == "pass-through"
        }
        for row in rows:
            assert number(row["errors"]) == 0, row
            cpu = number(row["CPU µs/req"])
            assert cpu > 0, row
            ratio = number(row["× pass-through"])
            assert ratio == pytest.approx(cpu / floor[row["phase"]], abs=0.006), row


@pytest.mark.slow
def test_batch_yield_smoke_runs_both_phases_and_preempts(tmp_path: Path) -> None:
    """One round: every interactive request of both phases succeeded, the batch was preempted
    at least once to make room in phase B, and every TTFT figure is a finite number."""
    _, text = run_smoke("bench_batch_yield.py", tmp_path)
    body = section(text, "bench_batch_yield")
    rows = {
        row["round (seed)"]: row
        for row in table(body, "Interactive burst alone (A) and with a saturating batch (B)")
    }
    assert set(rows) == {"1 (1)", "median of rounds", "all rounds pooled"}, rows
    for row in rows.values():
        assert row["failed A/B"] == "0/0", row
        assert number(row["lines preempted"]) >= 1, row
        for column in ("A TTFT p99 ms", "B TTFT p99 ms", "B/A TTFT p99"):
            assert number(row[column]) > 0, row


def test_batch_store_smoke_measures_both_backends(tmp_path: Path) -> None:
    """Both backends are measured, every figure positive and finite."""
    _, text = run_smoke("bench_batch_store.py", tmp_path)
    body = section(text, "bench_batch_store")
    lines = [line for line in body.splitlines() if line.startswith(("| SQLite", "| Redis"))]
    assert len(lines) == 2, body
    for line in lines:
        cells = [cell.strip() for cell in line.strip("|").split("|")][1:]
        assert len(cells) == 6, line
        assert all(number(cell) > 0 for cell in cells), line


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flags", "headings"),
    [
        ((), ("round trips on loopback", "per waiting ticket", "running tickets per tenant")),
        (("--cluster",), ("one redis-server | Redis Cluster", "sync, 3 models, redis-py")),
    ],
)
def test_store_rtt_smoke_times_every_table(
    flags: tuple[str, ...], headings: tuple[str, ...]
) -> None:
    """``bench_store_rtt.py`` with few calls ends cleanly and prints each of its tables: on
    one server the round trips, memory per waiting ticket and the per-tenant read; with
    ``--cluster`` the cluster beside the single server, redis-py's pipeline included."""
    command = [sys.executable, "benchmarks/bench_store_rtt.py", "--calls", "30", "--waiting", "50"]
    done = subprocess.run(
        [*command, *flags], cwd=ROOT, capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for heading in headings:
        assert heading in done.stdout, done.stdout
    assert "sync, 1 op" in done.stdout, done.stdout
