"""`prefix_affinity` vs `least_inflight` on a shared-prefix workload, with prefix caching.

Generates the shared-prefix workload (``sim/workloads/prefix.py``: system prompts
with Zipf popularity plus unique suffixes, block hashes at the engine's KV block
size), replays it through the real scheduler and N Llama-3.1-8B/H100 replicas
whose engine model caches prompt blocks (LRU, DESIGN §11), once per router, and
prints (or writes into docs/POLICIES.md) prefix-cache hit rate, TTFT p50/p99 and
throughput.

    python benchmarks/prefix_routing.py [--setups 2:12,4:24] [--write docs/POLICIES.md]

Each setup is ``REPLICAS:RATE`` (requests per second).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np

from mdsection import write_section
from sluicegate.config import parse_config
from sluicegate.engine import preset
from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.virtual_driver import simulate
from sluicegate.sim.workloads.prefix import shared_prefix

ROUTERS = ("least_inflight", "prefix_affinity")
CONFIG = """\
models:
  - name: default
    router: {router}
    max_concurrency: {cap}
    lanes:
      - name: interactive
        max_concurrency: {cap}
simulation:
  preset: llama-3.1-8b-h100
  replicas: {replicas}
"""


def workload(
    rate: float, duration_s: float, seed: int, prompts: int, blocks: int, zipf: float
) -> list[WorkloadRequest]:
    """The compared workload, with hashes at the preset's KV block size."""
    block = preset("llama-3.1-8b-h100").block_size
    return shared_prefix(
        rate, duration_s, seed=seed, prompts=prompts, blocks=blocks, zipf=zipf, block_size=block
    )


def run(
    router: str, requests: list[WorkloadRequest], replicas: int, seed: int, label: str
) -> list[str]:
    """One run; the table row: hit rate, TTFT p50/p99 (ms), req/s, output tok/s."""
    config = parse_config(
        CONFIG.format(router=router, replicas=replicas, cap=128 * replicas),
        source="<prefix>",
        simulation=True,
    )
    result = simulate(
        config.scheduler_spec(), "default", requests, preset(config.simulation.preset),
        replicas, seed=seed, scrape_interval_s=config.simulation.scrape_interval_s,
    )  # fmt: skip
    hits = result.prefix_hit_rate
    done = [r for r in result.records if r.outcome == "completed"]
    ttft = np.array([r.first_token_s - r.arrival_s for r in done if r.first_token_s is not None])
    span = result.end_s - result.start_s
    p50, p99 = np.percentile(ttft, [50, 99])
    tokens = sum(r.generated_tokens for r in done)
    offered = len(requests) / (requests[-1].arrival_s or 1.0)
    return [
        str(replicas), f"{offered:.1f}", label, f"{hits:.1%}",
        f"{p50 * 1000:.0f}", f"{p99 * 1000:.0f}", f"{len(done) / span:.2f}",
        f"{tokens / span:.0f}", f"{len(done)}/{len(requests)}",
    ]  # fmt: skip


def main() -> None:
    """Run both routers and print the Markdown table (or write it)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--setups", default="2:12,4:24", help="REPLICAS:RATE,...")
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompts", type=int, default=512, help="system prompts")
    parser.add_argument("--blocks", type=int, default=128, help="blocks per system prompt")
    parser.add_argument("--zipf", type=float, default=0.8, help="popularity exponent")
    parser.add_argument("--write", type=Path, default=None)
    args = parser.parse_args()
    header = [
        "replicas", "offered (req/s)", "router", "prefix-cache hit rate", "TTFT p50 (ms)",
        "TTFT p99 (ms)", "throughput (req/s)", "output tok/s", "completed",
    ]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for setup in args.setups.split(","):
        replicas, rate = setup.split(":")
        requests = workload(
            float(rate), args.duration, args.seed, args.prompts, args.blocks, args.zipf
        )
        plain = [replace(r, prefix=()) for r in requests]
        rows = [run("least_inflight", plain, int(replicas), args.seed, "no prefix cache")]
        rows += [run(r, requests, int(replicas), args.seed, f"`{r}`") for r in ROUTERS]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
    command = (
        f"python benchmarks/prefix_routing.py --setups {args.setups} "
        f"--duration {args.duration:g} --seed {args.seed} --prompts {args.prompts} "
        f"--blocks {args.blocks} --zipf {args.zipf:g}"
    )
    body = f"`{command}`:\n\n" + "\n".join(lines)
    print(body)
    if args.write is not None:
        write_section(args.write, "prefix_routing", body)


if __name__ == "__main__":
    main()
