"""A synthetic workload whose prompts share prefixes: system prompts with Zipf popularity.

There are ``prompts`` system prompts of ``blocks`` KV blocks each. Every
request picks one by a Zipf law (prompt ``i`` with probability ∝ ``1/(i+1)^zipf``)
and appends a unique suffix: its prompt is the system prompt's ``blocks ·
block_size`` tokens plus a suffix drawn like :func:`poisson`'s prompts, and its
``prefix`` names its full blocks (the system prompt's hashes, shared by every
request of that prompt, then fresh hashes for the suffix). Arrivals and
lengths are :func:`poisson`'s for the same seed; the choice of system prompt
is drawn from a third stream, and the request's tenant is ``sys<i>`` (one
tenant per system prompt, as an application with its own instructions).

CLI: ``sluicegate simulate --prefix-workload RATE:PROMPTS:BLOCKS[:ZIPF]`` with
``--duration``.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.workloads.synthetic import DEFAULT_OUTPUT, LengthDist, poisson

__all__ = ["DEFAULT_SUFFIX", "parse_prefix_workload", "shared_prefix"]

DEFAULT_SUFFIX = LengthDist.lognormal(256.0, 1.0, max_tokens=4096)
"""Default unique suffix lengths (the user's turn): median 256 tokens, at most 4096."""


def shared_prefix(
    rate_per_s: float,
    duration_s: float,
    *,
    seed: int,
    prompts: int = 16,
    blocks: int = 64,
    zipf: float = 1.1,
    block_size: int = 16,
    suffix: LengthDist = DEFAULT_SUFFIX,
    output: LengthDist = DEFAULT_OUTPUT,
) -> list[WorkloadRequest]:
    """Poisson arrivals of requests sharing ``prompts`` system prompts (module docstring).

    Args:
        rate_per_s: mean arrivals per second, ``> 0``.
        duration_s: arrivals fall in ``[0, duration_s)``.
        seed: seeds arrivals, lengths and the choice of system prompt.
        prompts: number of distinct system prompts, ``>= 1``.
        blocks: KV blocks per system prompt, ``>= 1``.
        zipf: Zipf exponent of their popularity, ``>= 0`` (0: uniform).
        block_size: tokens per block; use the engine's KV block size.
        suffix: length distribution of each request's own part of the prompt.
        output: output-length distribution.

    Raises:
        ValueError: an argument out of range.
    """
    if prompts < 1 or blocks < 1 or block_size < 1:
        raise ValueError(
            f"prompts, blocks and block_size must be >= 1, got {prompts}, {blocks}, {block_size}"
        )
    if not (math.isfinite(zipf) and zipf >= 0.0):
        raise ValueError(f"zipf must be a finite number >= 0, got {zipf!r}")
    base = poisson(rate_per_s, duration_s, seed=seed, prompt=suffix, output=output)
    weights = 1.0 / np.arange(1, prompts + 1, dtype=np.float64) ** zipf
    rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(3)[2])
    chosen = rng.choice(prompts, size=len(base), p=weights / weights.sum()).tolist()
    shared = blocks * block_size
    next_hash = prompts * blocks  # hashes below this are the system prompts' blocks
    out: list[WorkloadRequest] = []
    for request, system in zip(base, chosen, strict=True):
        prompt = shared + request.prompt_tokens
        own = prompt // block_size - blocks
        hashes = tuple(range(system * blocks, (system + 1) * blocks))
        hashes += tuple(range(next_hash, next_hash + own))
        next_hash += own
        out.append(replace(request, prompt_tokens=prompt, tenant=f"sys{system}", prefix=hashes))
    return out


def parse_prefix_workload(text: str) -> tuple[float, int, int, float]:
    """``RATE:PROMPTS:BLOCKS[:ZIPF]`` (ZIPF default 1.1); ``ValueError`` naming the option."""
    parts = text.split(":")
    try:
        if len(parts) not in (3, 4):
            raise ValueError(text)
        rate, count, blocks = float(parts[0]), int(parts[1]), int(parts[2])
        zipf = float(parts[3]) if len(parts) == 4 else 1.1
    except ValueError:
        raise ValueError(
            f"--prefix-workload must look like RATE:PROMPTS:BLOCKS[:ZIPF], got {text!r}"
        ) from None
    return rate, count, blocks, zipf
