"""A hostile engine against two gateways, before and after: per mode, the gateway's peak RSS
growth and its ``/healthz`` p99 while the hostile answer runs (issue 27).

Each mode gets a fresh ``sluicegate serve`` process per build (the baseline from
``--baseline REV``, checked out with ``git worktree``, or ``--baseline-src``; then this
checkout) in front of ``tests/hardening/hostile_engine.py``; three healthy requests warm it,
then one request meets the hostile answer while another thread probes ``/healthz`` every
5 ms, then the engine turns healthy and one more request must get its own answer. The
engine stops sending after ``--budget-mib`` or ``--budget-s``, so a build without caps
cannot take the machine.

    python benchmarks/bench_hostile_engine.py --baseline REV [--write docs/BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from livestack import write_report
from profile_gateway import baseline_source
from tables import Grid

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.gateway.gateway_harness import http_call
from tests.hardening.gateway_process import gateway_process, probing
from tests.hardening.hostile_engine import HostileEngine, Mode

SERVER = "upstream_first_byte_timeout_s: 5, upstream_idle_timeout_s: 5"
MODEL = "circuit_failures: 1000"
ASK = {"model": "tiny", "max_tokens": 4}


def measure(mode: Mode, src: Path | None, budget_bytes: int, budget_s: float) -> dict[str, Any]:
    """One hostile request through a fresh gateway running ``src`` (None: this checkout)."""
    engine = HostileEngine(budget_bytes=budget_bytes, budget_s=budget_s)
    engine.start()
    try:
        with (
            tempfile.TemporaryDirectory() as tmp,
            gateway_process(
                engine.url,
                Path(tmp),
                server=SERVER,
                model=MODEL,
                pythonpath="" if src is None else str(src),
            ) as gateway,
        ):
            url = gateway.url
            for i in range(3):
                warm = http_call(url, "POST", "/v1/completions", json={**ASK, "prompt": f"w{i}"})
                assert warm.status == 200, warm
            time.sleep(0.3)
            gateway.reset_peak()
            base = gateway.rss()
            engine.mode = mode
            body = {**ASK, "prompt": "hostile", "stream": mode is Mode.ENDLESS_EVENT}
            with probing(gateway.url) as probe:
                started = time.monotonic()
                try:
                    reply = http_call(gateway.url, "POST", "/v1/completions", json=body, timeout=12)
                    result = str(reply.status)
                    if reply.status != 200 and reply.body.startswith(b"{"):
                        result += " " + str(reply.json()["error"]["code"])
                except OSError as exc:
                    result = type(exc).__name__
                took = time.monotonic() - started
            growth = (gateway.peak_rss() - base) / 2**20
            engine.mode = Mode.HEALTHY
            try:
                own_ask = {**ASK, "prompt": "own"}
                after = http_call(url, "POST", "/v1/completions", json=own_ask, timeout=10)
                own = after.status == 200 and after.json()["choices"][0]["text"] == "own"
            except OSError:
                own = False
            return {
                "growth": growth,
                "p99_ms": probe.p99() * 1000,
                "result": result,
                "took": took,
                "next": "own answer" if own else "NOT its own",
            }
    finally:
        engine.stop()


HEADERS = [
    "mode",
    "before: RSS MiB",
    "before: healthz p99 ms",
    "before: answer",
    "after: RSS MiB",
    "after: healthz p99 ms",
    "after: answer",
    "after: next request",
]


def run(args: argparse.Namespace, console: Console) -> list[Grid]:
    """Both builds, mode by mode (interleaved); the table."""
    if args.modes:
        modes = [Mode(m) for m in args.modes]
    else:
        modes = [m for m in Mode if m is not Mode.HEALTHY]
    rows: list[list[str]] = []
    budget = args.budget_mib << 20
    with baseline_source(args) as old_src:
        for mode in modes:
            before = measure(mode, old_src, budget, args.budget_s)
            after = measure(mode, None, budget, args.budget_s)
            rows.append([
                mode.value,
                f"{before['growth']:.1f}", f"{before['p99_ms']:.1f}",
                f"{before['result']} ({before['took']:.2f} s)",
                f"{after['growth']:.1f}", f"{after['p99_ms']:.1f}",
                f"{after['result']} ({after['took']:.2f} s)", after["next"],
            ])  # fmt: skip
            console.print(f"{mode.value}: done")
    return [("A hostile engine: gateway RSS growth and /healthz p99", HEADERS, rows)]


def main(argv: list[str] | None = None) -> int:
    """Measure, print, and optionally write the section."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--baseline", default="HEAD~1", help="git revision of 'before'")
    parser.add_argument("--baseline-src", default=None, help="or: a src directory to run")
    parser.add_argument("--modes", nargs="*", default=None, help="hostile modes (default: all)")
    parser.add_argument("--budget-mib", type=int, default=768, help="the engine sends at most")
    parser.add_argument("--budget-s", type=float, default=6.0, help="for at most (seconds)")
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args(argv)
    console = Console(width=160)
    grids = run(args, console)
    notes = [
        f"Before: `{args.baseline_src or args.baseline}`; after: this checkout. A fresh "
        "`sluicegate serve` per mode and build, first-byte and idle timeouts 5 s, default caps; "
        f"the engine stops at {args.budget_mib} MiB or {args.budget_s:g} s. RSS: the peak "
        "(`VmHWM`, reset before the request) minus the resident size before it. The p99 is "
        "over the `/healthz` probes (every 5 ms) during the hostile request: a request that "
        "ends in milliseconds has few samples.",
    ]
    write_report(
        args, script="bench_hostile_engine.py", section="bench_hostile_engine",
        title="A hostile engine: memory and event-loop stalls, before and after (issue 27)",
        notes=notes, grids=grids, argv=argv, out=console,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
