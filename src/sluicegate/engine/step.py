"""What an engine step produces (``StepResult``) and the per-request state the engine keeps.

``SeqState`` and ``StepOutput`` are the engine's internals, shared by its
modules (``model``, ``servers``, ``decode``); only ``StepResult`` is public.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one engine step produced; the driver applies it at ``now + duration_s``.

    Attributes:
        duration_s: how long the step takes.
        tokens: tokens emitted this step per request (absent means none).
        first_token: requests whose first token is among ``tokens``.
        finished: requests that emitted their last token; they are gone from the engine.
        preempted: requests preempted (recompute) this step; they are waiting again.
        prefill_tokens: prompt (or recomputed) tokens processed in the step.
        decode_seqs: sequences that decoded one token in the step.
    """

    duration_s: float
    tokens: dict[str, int]
    first_token: list[str]
    finished: list[str]
    preempted: list[str]
    prefill_tokens: int = 0
    decode_seqs: int = 0


class SeqState:
    """One request inside the engine.

    ``total`` = prompt + generated tokens; ``computed`` of them have KV;
    ``blocks`` KV blocks (``capacity`` tokens) hold them; tokens before
    ``prefill_end`` are prefilled, the rest decoded one per step; ``prefix``
    names the prompt's full blocks for the prefix cache (empty: not cached);
    ``priority`` orders it under the priority policy (lower first).
    """

    __slots__ = ("arrival", "blocks", "capacity", "computed", "done", "generated", "order",
                 "prefill_end", "prefix", "priority", "prompt_tokens", "req_id", "target",
                 "total")  # fmt: skip

    def __init__(
        self,
        req_id: str,
        prompt_tokens: int,
        target: int,
        arrival: float,
        order: int,
        prefix: tuple[int, ...] = (),
        priority: int = 0,
    ):
        self.req_id = req_id
        self.priority = priority
        self.prefix = prefix  # hashes of the prompt's full KV blocks, for the prefix cache
        self.prompt_tokens = prompt_tokens
        self.target = target
        self.arrival = arrival
        self.order = order
        self.total = self.prefill_end = prompt_tokens
        self.generated = self.computed = self.blocks = self.capacity = 0
        self.done = False


class StepOutput:
    """Mutable accumulator for one step's outputs; ``result`` freezes it."""

    __slots__ = ("attn", "decode", "finished", "first", "kv", "preempted", "prefill", "released",
                 "tokens")  # fmt: skip

    def __init__(self) -> None:
        self.tokens: dict[str, int] = {}
        self.first: list[str] = []
        self.finished: list[str] = []
        self.preempted: list[str] = []
        self.prefill = self.decode = self.kv = self.released = self.attn = 0

    def result(self, duration_s: float) -> StepResult:
        """The step's ``StepResult``, lasting ``duration_s``."""
        return StepResult(
            duration_s, self.tokens, self.first, self.finished, self.preempted,
            self.prefill, self.decode,
        )  # fmt: skip
