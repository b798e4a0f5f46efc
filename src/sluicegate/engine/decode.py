"""Runs of pure-decode steps, planned ahead so a simulator can skip their step-by-step events.

While nothing waits and every running sequence decodes, the next steps have a
fixed shape until a sequence finishes: step j (from 0) of a run over ``d``
sequences whose contexts sum to ``K`` lasts ``step_s(0, d, K + d·(j + 1))``,
emits one token per sequence, and grows each sequence's KV by one token.
``Engine.plan_decode`` computes such a run; ``Engine.advance_decode`` applies
its first steps, leaving the engine exactly as that many ``step`` calls would.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluicegate.engine.engine_config import EngineConfig
from sluicegate.engine.step import SeqState, StepResult


@dataclass(frozen=True, slots=True)
class DecodeRun:
    """Consecutive pure-decode steps an engine would run next, without finishing anyone.

    Attributes:
        durations_s: each step's duration, in order; step i starts when step i − 1 ends.
        req_ids: the requests decoding; each emits one token per step.
        version: the engine state the run was planned from (it applies only to that state).
    """

    durations_s: tuple[float, ...]
    req_ids: tuple[str, ...]
    version: int

    @property
    def steps(self) -> int:
        """How many steps the run has."""
        return len(self.durations_s)

    def result(self, index: int) -> StepResult:
        """The ``StepResult`` that ``Engine.step`` returns for step ``index`` of the run."""
        ids = self.req_ids
        return StepResult(self.durations_s[index], dict.fromkeys(ids, 1), [], [], [], 0, len(ids))


def plan_run(
    running: list[SeqState], config: EngineConfig, free_blocks: int, max_steps: int, version: int
) -> DecodeRun | None:
    """Plan up to ``max_steps`` pure-decode steps of ``running`` (nothing may be waiting).

    A run stops before the first step in which a sequence would finish. It is
    refused (``None``) when a sequence is still prefilling, the batch exceeds
    the step budget, or KV might run short within the run (a step that could
    preempt must go through ``Engine.step``).
    """
    d = len(running)
    if d == 0 or d > config.max_num_batched_tokens:
        return None
    steps = max_steps
    context = 0
    for seq in running:
        computed = seq.computed
        if computed < seq.prefill_end or seq.total - computed != 1:
            return None
        left = seq.target - seq.generated - 1
        if left < steps:
            steps = left
        context += computed
    if steps < 1:
        return None
    bs = config.block_size
    # A sequence grows by at most ⌈steps/bs⌉ blocks; count exactly only when that could not fit.
    if d * ((steps + bs - 1) // bs) > free_blocks:
        grow = 0
        for seq in running:
            grow += (seq.computed + steps + bs - 1) // bs - seq.blocks
        if grow > free_blocks:
            return None
    # Written as EngineConfig.step_s(0, d, kv) evaluates it, so durations match bit for bit.
    fixed = config.base_s + config.per_prefill_token_s * 0 + config.per_decode_seq_s * d
    per_kv = config.per_kv_token_s
    kvs = range(context + d, context + d * steps + 1, d)
    durations = tuple([fixed + per_kv * kv for kv in kvs])
    return DecodeRun(durations, tuple([seq.req_id for seq in running]), version)


def blocks_grown(running: list[SeqState], block_size: int, steps: int) -> int:
    """The KV blocks a planned run's sequences gain over its first ``steps`` steps."""
    grown = 0
    for seq in running:
        blocks = (seq.computed + steps + block_size - 1) // block_size
        if blocks > seq.blocks:
            grown += blocks - seq.blocks
    return grown


def apply_run(running: list[SeqState], block_size: int, steps: int) -> int:
    """Advance every sequence of a planned run by ``steps`` decode steps; returns blocks grown."""
    grown = 0
    for seq in running:
        computed = seq.computed + steps
        seq.computed = computed
        seq.generated += steps
        seq.total = computed + 1
        blocks = (computed + block_size - 1) // block_size
        if blocks > seq.blocks:
            grown += blocks - seq.blocks
            seq.blocks = blocks
            seq.capacity = blocks * block_size
    return grown
