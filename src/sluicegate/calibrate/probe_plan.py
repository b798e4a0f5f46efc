"""What ``sluicegate calibrate`` measures, and how the engine model predicts each probe.

Three kinds of probe, all on an otherwise idle engine:

* **prefill**: one request of P prompt tokens and one token out, for P spread
  geometrically from 16 to 0.9 × the longest context a request may have. The model
  spends the prefill steps of ``EngineConfig.solo_service_s`` on it (chunks of at most
  ``max_num_batched_tokens``, the last emitting the first token); a client sees them
  plus the two fixed overheads as its time to first token.
* **decode**: B requests started together (B from 1 to the engine's slots), each
  ``decode_tokens`` tokens out, at a short and a long prompt. Their inter-token gap is
  one step with B sequences decoding at the mean context P + decode_tokens / 2 — when
  their B prompts prefill in one step: a batch whose prompts exceed the step budget
  has its first requests decode beside the others' prefill chunks, and those steps
  (hundreds of times a decode's) would be read as decode time (``decode_probes``).
* the **fixed overheads**, read from every request (``probes.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sluicegate.engine.engine_config import COEFFICIENTS

SHORTEST_PROMPT = 16
LONGEST_SHARE = 0.9
PREFILL_LENGTHS = 7
DECODE_TOKENS = 32
MOST_BATCH_SIZES = 6

_INDEX = {name: i for i, name in enumerate(COEFFICIENTS)}


@dataclass(frozen=True, slots=True)
class ProbePlan:
    """The probes of one calibration run.

    Attributes:
        prefill_lengths: prompt tokens of the prefill probes, ascending.
        batch_sizes: requests started together in the decode probes, ascending.
        decode_contexts: prompt tokens of the decode probes (short, long).
        decode_tokens: tokens out of each decode request.
        budget_tokens: the engine's per-step token budget (prefill chunk size).
    """

    prefill_lengths: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    decode_tokens: int
    budget_tokens: int


def plan_probes(
    *, slots: int, context_tokens: int, kv_capacity_tokens: int, budget_tokens: int
) -> ProbePlan:
    """The probes for an engine of ``slots`` sequences, ``context_tokens`` per request
    and ``kv_capacity_tokens`` in all (so the longest decode batch fits its KV).

    Raises:
        ValueError: a context too short to probe (under 64 tokens) or no slot.
    """
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    if context_tokens < 64:
        raise ValueError(f"a context of {context_tokens} tokens is too short to calibrate")
    longest = int(LONGEST_SHARE * context_tokens)
    ratio = (longest / SHORTEST_PROMPT) ** (1.0 / (PREFILL_LENGTHS - 1))
    lengths = sorted({round(SHORTEST_PROMPT * ratio**i) for i in range(PREFILL_LENGTHS)})
    sizes = {1, slots}
    if slots > 2:
        step = (slots - 1) / (MOST_BATCH_SIZES - 1)
        sizes |= {1 + round(step * i) for i in range(MOST_BATCH_SIZES)}
    per_sequence = min(context_tokens, kv_capacity_tokens // slots) - DECODE_TOKENS
    long_context = max(SHORTEST_PROMPT, per_sequence // 2)
    contexts = (
        (SHORTEST_PROMPT, long_context)
        if long_context > 4 * SHORTEST_PROMPT
        else (SHORTEST_PROMPT,)
    )
    return ProbePlan(
        prefill_lengths=tuple(lengths),
        batch_sizes=tuple(sorted(sizes)),
        decode_contexts=contexts,
        decode_tokens=DECODE_TOKENS,
        budget_tokens=budget_tokens,
    )


def prefill_features(prompt_tokens: int, budget_tokens: int) -> tuple[float, ...]:
    """The coefficients' multipliers for a lone prompt's prefill steps: chunks of at most
    ``budget_tokens``, each a step over its tokens, its context and its attention pairs
    (as ``EngineConfig.solo_service_s`` counts them)."""
    features = [0.0] * len(COEFFICIENTS)
    context = 0
    while context < prompt_tokens:
        n = min(budget_tokens, prompt_tokens - context)
        features[_INDEX["base_s"]] += 1.0
        features[_INDEX["per_prefill_token_s"]] += n
        features[_INDEX["per_kv_token_s"]] += context + n
        features[_INDEX["per_prefill_attn_s"]] += n * context + n * (n + 1) / 2
        context += n
    return tuple(features)


def first_token_features(prompt_tokens: int, budget_tokens: int) -> tuple[float, ...]:
    """What a client waits for a lone request's first token: its prefill steps plus the
    request's two fixed overheads."""
    features = list(prefill_features(prompt_tokens, budget_tokens))
    features[_INDEX["request_overhead_s"]] = 1.0
    features[_INDEX["response_overhead_s"]] = 1.0
    return tuple(features)


def decode_features(batch: int, context_tokens: float) -> tuple[float, ...]:
    """One step in which ``batch`` sequences of ``context_tokens`` context each decode."""
    features = [0.0] * len(COEFFICIENTS)
    features[_INDEX["base_s"]] = 1.0
    features[_INDEX["per_decode_seq_s"]] = float(batch)
    features[_INDEX["per_kv_token_s"]] = batch * context_tokens
    return tuple(features)


def mean_decode_context(prompt_tokens: int, decode_tokens: int) -> float:
    """The mean context a decode step attends for one sequence: P + g over g = 1 … o − 1."""
    return prompt_tokens + decode_tokens / 2


def decode_probes(plan: ProbePlan) -> list[tuple[int, int]]:
    """The (prompt tokens, batch size) of every decode probe: each context with each
    batch size whose prompts fit one step's budget together (batch 1 always)."""
    return [
        (context, batch)
        for context in plan.decode_contexts
        for batch in plan.batch_sizes
        if batch == 1 or batch * context <= plan.budget_tokens
    ]


def request_count(plan: ProbePlan, repeats: int) -> int:
    """How many requests the plan sends with ``repeats`` (for a progress bar)."""
    decode = sum(batch for _, batch in decode_probes(plan))
    return repeats * (1 + len(plan.prefill_lengths) + decode)
