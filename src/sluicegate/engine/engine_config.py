"""The parameters of one modelled engine replica: capacity limits and step-time coefficients."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

_MAX_SEQS = 1_000_000
_MAX_BLOCK = 1024

SchedulingPolicy = Literal["fcfs", "priority"]
"""vLLM's ``--scheduling-policy`` values the model implements (see ``Engine``)."""
SCHEDULING_POLICIES: tuple[str, ...] = get_args(SchedulingPolicy)


def parse_scheduling_policy(name: str) -> SchedulingPolicy:
    """``name`` as a ``SchedulingPolicy``; ``ValueError`` names the choices otherwise."""
    if name == "fcfs":
        return "fcfs"
    if name == "priority":
        return "priority"
    raise ValueError(f"scheduling policy must be one of {list(SCHEDULING_POLICIES)}, got {name!r}")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _check_coefficient(name: str, value: float) -> None:
    _require(
        math.isfinite(value) and value >= 0.0,
        f"{name} must be a finite number of seconds >= 0, got {value!r}",
    )


COEFFICIENTS = (
    "base_s",
    "per_prefill_token_s",
    "per_decode_seq_s",
    "per_kv_token_s",
    "per_prefill_attn_s",
    "request_overhead_s",
    "response_overhead_s",
)
"""``EngineConfig``'s timing fields, in seconds (each a finite number >= 0)."""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Capacity and timing of one continuous-batching engine (one replica).

    A step (one forward pass over the batch) lasts::

        duration_s = base_s
                     + per_prefill_token_s · prefill_tokens
                     + per_decode_seq_s   · decode_seqs
                     + per_kv_token_s     · kv_tokens_attended
                     + per_prefill_attn_s · prefill_pairs

    where ``kv_tokens_attended`` is the sum, over the sequences in the step, of
    their context length after the step (the KV the attention kernels read), and
    ``prefill_pairs`` counts the (query, key) pairs of the step's prefill: a chunk
    of n prompt tokens after c tokens already computed attends n·c + n(n+1)/2 of
    them, so a prompt's prefill grows quadratically with its length, as
    attention's does (what makes llama.cpp's CPU prefill superlinear).

    Two fixed costs per request lie outside the steps, and the drivers (the
    simulator's replicas) apply them: ``request_overhead_s`` from the moment the
    gateway sends a request until the engine's scheduler can admit it (HTTP,
    parsing, tokenization), and ``response_overhead_s`` from a token's step until
    the gateway has it (detokenization, the server's SSE write, the relay); the
    last token's marks the end of the request, when the gateway's slot frees.

    Attributes:
        max_num_seqs: most sequences in the running batch (vLLM ``--max-num-seqs``).
        max_num_batched_tokens: per-step token budget (vLLM
            ``--max-num-batched-tokens``); a decode costs 1, a prefill chunk its length.
        kv_capacity_tokens: KV-cache size in tokens; rounded down to whole blocks.
        block_size: tokens per KV block; a sequence of n tokens holds ⌈n/block_size⌉ blocks.
        enable_chunked_prefill: split prompts longer than the remaining budget
            across steps. When off, a prompt (plus tokens to recompute after a
            preemption) must fit in one step's budget.
        base_s: fixed cost of a step (weights read once per step, launch overhead).
        per_prefill_token_s: cost per prompt (or recomputed) token in the step.
        per_decode_seq_s: cost per sequence decoding one token in the step.
        per_kv_token_s: cost per context token attended in the step.
        per_prefill_attn_s: cost per (query, key) pair of the step's prefill.
        request_overhead_s: a request's time from the gateway to the engine's queue.
        response_overhead_s: a token's time from its step to the gateway.
        batch_independent: model ``max_num_seqs`` independent servers instead of
            one shared batch: each request's service time is its solo time,
            whatever else is running, and KV capacity never preempts. Used for
            exact queueing-theory (Erlang C) checks; see ``Engine``.
        scheduling_policy: vLLM's ``--scheduling-policy``: ``fcfs`` (the
            default), or ``priority``: the waiting queue ordered by each
            request's ``priority`` (lower first) then arrival, and the
            lowest-priority running sequence preempted first (see ``Engine``).
            Not with ``batch_independent``, whose servers are FCFS by definition.
    """

    max_num_seqs: int
    max_num_batched_tokens: int
    kv_capacity_tokens: int
    block_size: int = 16
    enable_chunked_prefill: bool = True
    base_s: float = 0.005
    per_prefill_token_s: float = 0.0
    per_decode_seq_s: float = 0.0
    per_kv_token_s: float = 0.0
    per_prefill_attn_s: float = 0.0
    request_overhead_s: float = 0.0
    response_overhead_s: float = 0.0
    batch_independent: bool = False
    scheduling_policy: SchedulingPolicy = "fcfs"

    def __post_init__(self) -> None:
        _require(
            1 <= self.max_num_seqs <= _MAX_SEQS,
            f"max_num_seqs must be in [1, {_MAX_SEQS}], got {self.max_num_seqs}",
        )
        _require(
            self.max_num_batched_tokens >= 1,
            f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}",
        )
        _require(
            1 <= self.block_size <= _MAX_BLOCK,
            f"block_size must be in [1, {_MAX_BLOCK}], got {self.block_size}",
        )
        _require(
            self.kv_capacity_tokens >= self.block_size,
            f"kv_capacity_tokens must be >= block_size ({self.block_size}), "
            f"got {self.kv_capacity_tokens}",
        )
        for name in COEFFICIENTS:
            _check_coefficient(name, getattr(self, name))
        _require(
            self.base_s > 0.0, f"base_s must be > 0 (every step takes time), got {self.base_s}"
        )
        _require(
            self.scheduling_policy in SCHEDULING_POLICIES,
            f"scheduling_policy must be one of {list(SCHEDULING_POLICIES)}, "
            f"got {self.scheduling_policy!r}",
        )
        _require(
            not (self.batch_independent and self.scheduling_policy == "priority"),
            "scheduling_policy 'priority' needs a shared batch: batch_independent "
            "servers start requests FCFS (they exist for exact Erlang C checks)",
        )

    @property
    def num_blocks(self) -> int:
        """Whole KV blocks available: ``kv_capacity_tokens // block_size``."""
        return self.kv_capacity_tokens // self.block_size

    def check_request(self, prompt_tokens: int, max_tokens: int) -> None:
        """Raise ``ValueError`` unless a request of this size could ever run alone.

        It must have ``prompt_tokens, max_tokens >= 1`` and, unless
        ``batch_independent``, ``prompt + max_tokens`` within the KV capacity
        (whole blocks) and, with chunked prefill off, within the step budget.
        """
        if prompt_tokens < 1 or max_tokens < 1:
            raise ValueError(
                f"prompt_tokens and max_tokens must be >= 1, got {prompt_tokens}, {max_tokens}"
            )
        if self.batch_independent:
            return
        longest = prompt_tokens + max_tokens
        capacity = self.num_blocks * self.block_size
        if longest > capacity:
            raise ValueError(
                f"prompt_tokens + max_tokens = {longest} exceeds the KV capacity of "
                f"{capacity} tokens"
            )
        if not self.enable_chunked_prefill and longest > self.max_num_batched_tokens:
            raise ValueError(
                f"prompt_tokens + max_tokens = {longest} exceeds max_num_batched_tokens = "
                f"{self.max_num_batched_tokens} with chunked prefill off"
            )

    def solo_service_s(self, prompt_tokens: int, output_tokens: int) -> float:
        """Time from admission to last token for a request alone on the engine.

        Prefill steps (chunks of at most ``max_num_batched_tokens`` with chunked
        prefill; one step when ``batch_independent``) each cost
        ``step_s(chunk, 0, context, pairs)``, the last one emitting token 1; token g + 1
        then costs ``step_s(0, 1, prompt + g)`` for g = 1 … o − 1, which sums to
        ``(o−1)·(base + b) + c·((o−1)·p + (o−1)·o/2)``. The request's fixed
        overheads are not in it (``solo_latency_s`` adds them).
        """
        if prompt_tokens < 1 or output_tokens < 1:
            raise ValueError("prompt_tokens and output_tokens must be >= 1")
        chunk = prompt_tokens
        if self.enable_chunked_prefill and not self.batch_independent:
            chunk = self.max_num_batched_tokens
        total = 0.0
        context = 0
        while context < prompt_tokens:
            n = min(chunk, prompt_tokens - context)
            total += self.step_s(n, 0, context + n, n * context + n * (n + 1) // 2)
            context += n
        decodes = output_tokens - 1
        kv = decodes * prompt_tokens + decodes * output_tokens // 2
        return total + decodes * (self.base_s + self.per_decode_seq_s) + self.per_kv_token_s * kv

    def solo_latency_s(self, prompt_tokens: int, output_tokens: int) -> float:
        """What a client of a request alone on the engine waits from sending it to its
        last token: ``solo_service_s`` plus the request's two fixed overheads."""
        service = self.solo_service_s(prompt_tokens, output_tokens)
        return self.request_overhead_s + service + self.response_overhead_s

    def step_s(
        self, prefill_tokens: int, decode_seqs: int, kv_tokens_attended: int, prefill_pairs: int = 0
    ) -> float:
        """Duration of one step with this batch composition (the formula above)."""
        return (
            self.base_s
            + self.per_prefill_token_s * prefill_tokens
            + self.per_decode_seq_s * decode_seqs
            + self.per_kv_token_s * kv_tokens_attended
            + self.per_prefill_attn_s * prefill_pairs
        )
