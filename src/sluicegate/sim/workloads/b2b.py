"""A B2B workload: many customers, each with a long shared context and short questions.

The shape of llm-d's precise prefix-cache benchmark (a service for ``customers``
businesses, each with a context of thousands of tokens — its documents and
instructions — that every one of its users' questions repeats). There are
``customers`` contexts of ``context_tokens`` tokens; every request picks a customer by
a Zipf law (customer ``i`` with probability ∝ ``1/(i+1)^zipf``) and asks a short
question after its context: its prompt is the context plus a question drawn from
``question``, and its ``prefix`` names the prompt's full KV blocks — the context's
``context_tokens ÷ block_size`` full blocks, shared by every request of the customer,
then fresh hashes for the rest (a context block cut by the question is the request's
own). Its tenant is ``cust<i>``.

Arrivals are Poisson (``burst = 1``) or gamma bursts with inter-arrival coefficient of
variation ``burst`` (``> 1``: bursts and lulls; :func:`~.synthetic.gamma_bursts`), the
same for the same seed; lengths come from a second stream and the customer from a
third, so changing the customers leaves arrivals and lengths unchanged.

The default question (median 128 tokens) and answer (median 128) lengths are our
assumption of "short" beside a context of thousands of tokens.

CLI: ``sluicegate simulate --b2b-workload RATE:CUSTOMERS:CONTEXT_TOKENS[:ZIPF[:BURST]]``
with ``--duration``.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.workloads.synthetic import DEFAULT_OUTPUT, LengthDist, gamma_bursts, poisson

__all__ = ["DEFAULT_QUESTION", "b2b", "parse_b2b_workload"]

DEFAULT_QUESTION = LengthDist.lognormal(128.0, 0.75, min_tokens=8, max_tokens=2048)
"""Default question lengths: median 128 tokens, at least 8, at most 2048."""


def b2b(
    rate_per_s: float,
    duration_s: float,
    *,
    seed: int,
    customers: int = 150,
    context_tokens: int = 6000,
    zipf: float = 1.1,
    burst: float = 1.0,
    block_size: int = 16,
    question: LengthDist = DEFAULT_QUESTION,
    output: LengthDist = DEFAULT_OUTPUT,
) -> list[WorkloadRequest]:
    """Requests of ``customers`` customers sharing their own long contexts (module docstring).

    Args:
        rate_per_s: mean arrivals per second, ``> 0``.
        duration_s: arrivals fall in ``[0, duration_s)``.
        seed: seeds arrivals, lengths and the choice of customer.
        customers: number of customers, ``>= 1``.
        context_tokens: tokens of each customer's shared context, ``>= 1``.
        zipf: Zipf exponent of the customers' popularity, ``>= 0`` (0: uniform).
        burst: inter-arrival coefficient of variation, in ``(0, 100]``; 1 is Poisson.
        block_size: tokens per block; use the engine's KV block size.
        question: length distribution of each request's question.
        output: output-length distribution.

    Raises:
        ValueError: an argument out of range.
    """
    if customers < 1 or context_tokens < 1 or block_size < 1:
        raise ValueError(
            "customers, context_tokens and block_size must be >= 1, got "
            f"{customers}, {context_tokens}, {block_size}"
        )
    if not (math.isfinite(zipf) and zipf >= 0.0):
        raise ValueError(f"zipf must be a finite number >= 0, got {zipf!r}")
    if burst == 1.0:
        base = poisson(rate_per_s, duration_s, seed=seed, prompt=question, output=output)
    else:
        base = gamma_bursts(
            rate_per_s, burst, duration_s, seed=seed, prompt=question, output=output
        )
    weights = 1.0 / np.arange(1, customers + 1, dtype=np.float64) ** zipf
    rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(3)[2])
    chosen = rng.choice(customers, size=len(base), p=weights / weights.sum()).tolist()
    shared = context_tokens // block_size  # full blocks of context, the same for every request
    next_hash = customers * shared  # hashes below this are the contexts' blocks
    out: list[WorkloadRequest] = []
    for request, customer in zip(base, chosen, strict=True):
        prompt = context_tokens + request.prompt_tokens
        own = prompt // block_size - shared
        hashes = tuple(range(customer * shared, (customer + 1) * shared))
        hashes += tuple(range(next_hash, next_hash + own))
        next_hash += own
        out.append(replace(request, prompt_tokens=prompt, tenant=f"cust{customer}", prefix=hashes))
    return out


def parse_b2b_workload(text: str) -> tuple[float, int, int, float, float]:
    """``RATE:CUSTOMERS:CONTEXT_TOKENS[:ZIPF[:BURST]]`` (ZIPF default 1.1, BURST 1:
    Poisson); ``ValueError`` naming the option."""
    parts = text.split(":")
    try:
        if not 3 <= len(parts) <= 5:
            raise ValueError(text)
        rate, customers, context = float(parts[0]), int(parts[1]), int(parts[2])
        zipf = float(parts[3]) if len(parts) >= 4 else 1.1
        burst = float(parts[4]) if len(parts) == 5 else 1.0
    except ValueError:
        raise ValueError(
            "--b2b-workload must look like RATE:CUSTOMERS:CONTEXT_TOKENS[:ZIPF[:BURST]], "
            f"got {text!r}"
        ) from None
    return rate, customers, context, zipf, burst
