"""One simulated run of ``benchmarks/prefix_precise.py``: a workload, a router set-up, a KV
event delay → TTFT percentiles, throughput, prefix-cache hit rate and load imbalance.

The three workloads:

- ``b2b``: llm-d's precise prefix-cache scenario (``sim/workloads/b2b.py``): 150
  customers with 6,000-token shared contexts, Zipf(1.1) popularity, short questions.
- ``shared``: the shared-system-prompt workload of ``benchmarks/prefix_routing.py``
  (``sim/workloads/prefix.py``: 512 prompts of 128 blocks, Zipf 0.8).
- ``trace``: a synthetic Mooncake-style JSONL trace (``synthetic_trace``) loaded through
  ``--field prefix=hash_ids:512`` exactly as a real Mooncake trace would be. The
  repository ships no Mooncake trace (``data/traces`` holds the two Azure ones, which
  carry no hashes), so the benchmark writes its own.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sluicegate.config import parse_config
from sluicegate.engine import preset
from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.virtual_driver import simulate
from sluicegate.sim.workloads.b2b import b2b
from sluicegate.sim.workloads.fields import load_mapped, parse_fields
from sluicegate.sim.workloads.prefix import shared_prefix

PRESET = "llama-3.1-8b-h100"
PREFILL_TOKENS_PER_S = 1.0 / preset(PRESET).per_prefill_token_s
"""The preset's prefill rate (40,000 tokens/s), given to the sticky router's penalty test."""
TRACE_BLOCK_TOKENS = 512
"""Tokens each ``hash_ids`` entry names, as in Mooncake's traces."""
TRACE_FIELDS = (
    "arrival=timestamp:ms",
    "prompt=input_length",
    "output=output_length",
    f"prefix=hash_ids:{TRACE_BLOCK_TOKENS}",
)

CONFIG = """\
models:
  - name: default
    router: {router}
    max_concurrency: {cap}
    prefix_routing:
      max_ttft_penalty_ms: {penalty}
      recent_ttl_s: {ttl}
      prefill_tokens_per_s: {rate}
    lanes:
      - name: interactive
        max_concurrency: {cap}
simulation:
  preset: {preset}
  replicas: {replicas}
"""


@dataclass(frozen=True, slots=True)
class Setup:
    """A router set-up: its table label, the strategy, the sticky penalty (None: off)."""

    label: str
    router: str
    penalty_ms: float | None = None

    @property
    def reads_events(self) -> bool:
        """Whether the router reads KV events (so the event delay changes its run)."""
        return self.router == "precise_prefix"


@dataclass(frozen=True, slots=True)
class Job:
    """One run: ``workload`` (b2b, shared, trace) at ``rate`` req/s for ``duration_s``."""

    workload: str
    rate: float
    setup: Setup
    delay_s: float
    replicas: int
    duration_s: float
    seed: int
    ttl_s: float
    trace_path: str = ""


@dataclass(frozen=True, slots=True)
class Metrics:
    """What a run measured (TTFT over completed requests, from arrival; seconds)."""

    job: Job
    offered: int
    completed: int
    p50_s: float
    p90_s: float
    p99_s: float
    output_tok_s: float
    hit_rate: float
    imbalance: float

    @property
    def sustained(self) -> bool:
        """Every request completed with TTFT p90 within ``SUSTAIN_P90_S``."""
        return self.completed == self.offered and self.p90_s <= SUSTAIN_P90_S


SUSTAIN_P90_S = 1.0
"""A load is *sustained* when nothing is refused and TTFT p90 stays within 1 s."""


def workload(job: Job) -> list[WorkloadRequest]:
    """The requests of ``job``'s workload, hashed at the preset's KV block size."""
    block = preset(PRESET).block_size
    if job.workload == "b2b":
        return b2b(job.rate, job.duration_s, seed=job.seed, block_size=block)
    if job.workload == "shared":
        return shared_prefix(
            job.rate, job.duration_s, seed=job.seed, prompts=512, blocks=128, zipf=0.8,
            block_size=block,
        )  # fmt: skip
    if job.workload == "trace":
        return load_mapped(job.trace_path, parse_fields(TRACE_FIELDS))
    raise ValueError(f"unknown workload {job.workload!r}")


def run(job: Job) -> Metrics:
    """Simulate ``job`` through the real scheduler and ``job.replicas`` engine replicas."""
    setup = job.setup
    penalty = "null" if setup.penalty_ms is None else f"{setup.penalty_ms:g}"
    text = CONFIG.format(
        router=setup.router, cap=128 * job.replicas, penalty=penalty, ttl=job.ttl_s,
        rate=PREFILL_TOKENS_PER_S, preset=PRESET, replicas=job.replicas,
    )  # fmt: skip
    config = parse_config(text, source="<prefix_precise>", simulation=True)
    requests = workload(job)
    result = simulate(
        config.scheduler_spec(), "default", requests, preset(PRESET), job.replicas,
        seed=job.seed, kv_event_delay_s=job.delay_s,
    )  # fmt: skip
    done = [r for r in result.records if r.outcome == "completed" and r.first_token_s is not None]
    ttft = np.array([r.first_token_s - r.arrival_s for r in done if r.first_token_s is not None])
    p50, p90, p99 = np.percentile(ttft, [50, 90, 99]) if len(ttft) else (math.nan,) * 3
    span = result.end_s - result.start_s
    per_replica = Counter(r.replica for r in done)
    mean = len(done) / job.replicas
    queried = result.prompt_tokens_queried
    return Metrics(
        job=job,
        offered=len(requests),
        completed=len(done),
        p50_s=float(p50),
        p90_s=float(p90),
        p99_s=float(p99),
        output_tok_s=sum(r.generated_tokens for r in done) / span if span > 0 else math.nan,
        hit_rate=result.prompt_tokens_cached / queried if queried else math.nan,
        imbalance=max(per_replica.values()) / mean if done else math.nan,
    )


def synthetic_trace(
    path: Path, rate: float, duration_s: float, *, seed: int, sessions: int = 400
) -> Path:
    """Write a Mooncake-style JSONL trace (``timestamp`` ms, ``input_length``,
    ``output_length``, ``hash_ids`` of 512-token blocks) and return its path.

    The shape of Mooncake's conversation traces as we read their format: each request
    continues one of ``sessions`` conversations (Zipf(1.0) popularity), whose prompt is
    one of 16 system prompts (2–6 blocks) plus the conversation so far plus the new turn
    (1–4 fresh blocks, the last one partly filled, so its hash is the request's own); a
    conversation past 24 blocks starts afresh with new hashes. Poisson arrivals; output
    lognormal, median 200 tokens. Deterministic for a seed.
    """
    rng = np.random.default_rng(seed)
    systems = [list(range(s * 8, s * 8 + int(rng.integers(2, 7)))) for s in range(16)]
    next_id = 16 * 8
    weights = 1.0 / np.arange(1, sessions + 1, dtype=np.float64)
    system_of = rng.integers(0, 16, size=sessions).tolist()
    history: list[list[int]] = [[] for _ in range(sessions)]
    count = int(rng.poisson(rate * duration_s))
    arrivals = np.sort(rng.uniform(0.0, duration_s, size=count))
    chosen = rng.choice(sessions, size=count, p=weights / weights.sum()).tolist()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for at, session in zip(arrivals.tolist(), chosen, strict=True):
            if len(systems[system_of[session]]) + len(history[session]) > 24:
                history[session] = []
            fresh = list(range(next_id, next_id + int(rng.integers(1, 5))))
            next_id += len(fresh)
            blocks = systems[system_of[session]] + history[session] + fresh
            last = int(rng.integers(1, TRACE_BLOCK_TOKENS + 1))
            row = {
                "timestamp": round(at * 1000.0),
                "input_length": (len(blocks) - 1) * TRACE_BLOCK_TOKENS + last,
                "output_length": int(max(8, min(2048, rng.lognormal(math.log(200), 0.7)))),
                "hash_ids": blocks,
            }
            out.write(json.dumps(row) + "\n")
            history[session] += fresh[:-1]
    return path
