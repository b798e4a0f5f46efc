"""What issues 30 and 31 added to the gateway's work, per request and per scrape.

Side by side in one process, CPU µs per call (``time.process_time``, median of
``--rounds`` interleaved rounds):

- per request: ``without_priority`` on a body without and with sluicegate's
  ``priority`` (every backend without ``priority_passthrough``); ``with_priority`` (a
  passthrough backend); ``prompt_block_hashes`` of a chat with a 6,000-character system
  prompt (only models routed by ``precise_prefix``); ``parse_body`` of the same body, the
  work every request already did, for scale;
- per scrape: the vLLM profile reading a recorded-format page, and prometheus-client's
  full parser on the same page, for scale;
- per KV event batch: ``decode_batch`` of a vLLM batch of 16 stored blocks.

    python benchmarks/bench_engine_paths.py [--rounds 7] [--write docs/BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson
from prometheus_client.parser import text_string_to_metric_families

from mdsection import write_section
from sluicegate.core.kv_index import BlockStored
from sluicegate.core.spec import ModelSpec
from sluicegate.engine_profiles import profile
from sluicegate.engine_profiles.kv_events_wire import decode_batch, encode_batch
from sluicegate.gateway.ops.scrape import parse_engine_metrics
from sluicegate.gateway.request.classify import parse_body, prompt_block_hashes
from sluicegate.gateway.request.engine_priority import with_priority, without_priority

REPO = Path(__file__).resolve().parents[1]
PAGE = (REPO / "tests" / "engines" / "fixtures" / "vllm" / "metrics.prom").read_text()
SYSTEM = ("You are a careful assistant for the billing team. " * 120)[:6000]


def _body(priority: bool) -> bytes:
    body: dict[str, object] = {
        "model": "m",
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "What does invoice 1042 cover?"},
        ],
        "max_tokens": 256,
    }
    if priority:
        body["priority"] = 2
    return orjson.dumps(body)


def _us(call: Callable[[], object], repeat: int) -> float:
    start = time.process_time()
    for _ in range(repeat):
        call()
    return (time.process_time() - start) / repeat * 1e6


def main(argv: list[str] | None = None) -> int:
    """Measure each path; print, and write the section with ``--write``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=2000)
    parser.add_argument("--write", type=Path, default=None)
    args = parser.parse_args(argv)
    plain, marked = _body(False), _body(True)
    parsed = parse_body(plain, "chat")
    precise = ModelSpec.model_validate(
        {"name": "m", "router": "precise_prefix", "backends": [{"name": "b"}]}
    )
    vllm = profile("vllm")
    batch = encode_batch(0.0, [BlockStored(tuple(range(1 << 40, (1 << 40) + 16)))], 0)
    paths: list[tuple[str, str, Callable[[], object]]] = [
        ("request", "`parse_body` (every request, for scale)", lambda: parse_body(plain, "chat")),
        ("request", "`without_priority`, no `priority` in the body",
         lambda: without_priority(plain)),
        ("request", "`without_priority`, a `priority` to strip", lambda: without_priority(marked)),
        ("request", "`with_priority` (passthrough backend)",
         lambda: with_priority(marked, "priority", 2)),
        ("request", "`prompt_block_hashes`, 6,000-char system prompt (`precise_prefix` only)",
         lambda: prompt_block_hashes(parsed, precise)),
        ("scrape", "vLLM profile reads a metrics page", lambda: parse_engine_metrics(vllm, PAGE)),
        ("scrape", "prometheus-client's parser, same page (for scale)",
         lambda: list(text_string_to_metric_families(PAGE))),
        ("KV batch", "`decode_batch`, 16 stored blocks", lambda: decode_batch(batch)),
    ]  # fmt: skip
    samples: list[list[float]] = [[] for _ in paths]
    for _ in range(args.rounds):
        for i, (_, _, call) in enumerate(paths):
            samples[i].append(_us(call, args.repeat))
    rows = [
        (kind, name, statistics.median(s))
        for (kind, name, _), s in zip(paths, samples, strict=True)
    ]
    for kind, name, us in rows:
        print(f"{kind:9} {us:8.2f} µs  {name}")
    if args.write is not None:
        write_section(args.write, "bench_engine_paths", _section(args, rows))
    return 0


def _section(args: argparse.Namespace, rows: list[tuple[str, str, float]]) -> str:
    lines = [
        "## What the engine profiles, priority passthrough and KV events cost (issues 30, 31)",
        "",
        f"Command: `python benchmarks/bench_engine_paths.py --rounds {args.rounds} "
        f"--repeat {args.repeat} --write docs/BENCHMARKS.md` ({dt.date.today().isoformat()}, "
        f"{os.cpu_count()} cores, Python {sys.version.split()[0]}). CPU µs per call, median of "
        f"{args.rounds} interleaved rounds of {args.repeat} calls each, in one process.",
        "",
        "| path | what | µs per call |",
        "|---|---|---:|",
        *(f"| {kind} | {name} | {us:.2f} |" for kind, name, us in rows),
        "",
        "Every request pays `without_priority`'s byte scan (a parse and a dump only when the "
        "body names `priority`); only `precise_prefix` models pay the hashing, and only "
        "passthrough backends the rewrite. Scrapes and KV event batches are off the request "
        "path.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
