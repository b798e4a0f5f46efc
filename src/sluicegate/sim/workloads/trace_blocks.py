"""A trace's block hashes as the engine's: each hash of an N-token block becomes N ÷ B
hashes of the engine's B-token KV blocks.

A trace names its prompts' blocks in its own size: Mooncake's ``hash_ids`` name blocks
of 512 tokens (``--field prefix=hash_ids:512``), while the engine model caches blocks
of ``EngineConfig.block_size`` (16) tokens and reads every hash as one of its own. Read
as they are, a Mooncake prefix hit would skip 16 of every 512 tokens (1/32 of its
prefill). Expanded, each trace hash ``h`` becomes the engine-block hashes
``e_1 … e_k`` (``k = N ÷ B``), chained as an engine chains its block hashes::

    e_j = blake2b("<e_{j−1}>:<h>:<j>", 8 bytes) as a big-endian integer

where ``e_0`` is the last hash of the previous trace block (0 before the first
block). Equal trace prefixes therefore give equal engine prefixes, and a whole trace
block hit credits its N tokens. The engine keeps only the prompt's full blocks
(``prompt_tokens ÷ B``), so a partly filled last trace block counts its full engine
blocks only. The expansion is deterministic (no seed: the same trace gives the same
hashes in every run and process).
"""

from __future__ import annotations

from collections.abc import Sequence
from hashlib import blake2b

__all__ = ["MAX_PREFIX_BLOCK_TOKENS", "EngineBlocks"]

MAX_PREFIX_BLOCK_TOKENS = 1 << 20
"""The largest block a trace hash may name (1 Mi tokens)."""


class EngineBlocks:
    """Expands trace block hashes into engine-block hashes, remembering every trace block
    it expanded (shared prefixes are expanded once).

    Args:
        engine_block_size: tokens per engine KV block, ``>= 1``.
    """

    __slots__ = ("_memo", "engine_block_size")

    def __init__(self, engine_block_size: int) -> None:
        if engine_block_size < 1:
            raise ValueError(f"engine_block_size must be >= 1, got {engine_block_size}")
        self.engine_block_size = engine_block_size
        self._memo: dict[tuple[int, int, int], tuple[int, ...]] = {}

    def per_trace_block(self, trace_block_tokens: int) -> int:
        """Engine blocks in one trace block.

        Raises:
            ValueError: ``trace_block_tokens`` is not a positive multiple of the engine's
                block size (a trace block would then straddle engine blocks).
        """
        size = self.engine_block_size
        if not 1 <= trace_block_tokens <= MAX_PREFIX_BLOCK_TOKENS or trace_block_tokens % size:
            raise ValueError(
                f"a trace's prefix blocks of {trace_block_tokens} tokens are not a whole "
                f"number of the engine's {size}-token KV blocks"
            )
        return trace_block_tokens // size

    def expand(
        self, hashes: Sequence[int], trace_block_tokens: int | None, prompt_tokens: int
    ) -> tuple[int, ...]:
        """The engine-block hashes of a prompt of ``prompt_tokens`` tokens whose trace
        blocks of ``trace_block_tokens`` tokens are ``hashes`` (``None``: already engine
        blocks), cut to the prompt's full engine blocks (module docstring)."""
        full = prompt_tokens // self.engine_block_size
        if trace_block_tokens is None:
            return tuple(hashes[:full])
        k = self.per_trace_block(trace_block_tokens)
        if k == 1:
            return tuple(hashes[:full])
        out: list[int] = []
        parent = 0
        memo = self._memo
        for block in hashes[: (full + k - 1) // k]:
            key = (parent, block, k)
            derived = memo.get(key)
            if derived is None:
                derived = _derive(parent, block, k)
                memo[key] = derived
            out.extend(derived)
            parent = derived[-1]
        return tuple(out[:full])


def _derive(parent: int, block: int, count: int) -> tuple[int, ...]:
    """``count`` chained engine-block hashes of trace block ``block`` after ``parent``."""
    out: list[int] = []
    for j in range(1, count + 1):
        digest = blake2b(f"{parent}:{block}:{j}".encode(), digest_size=8).digest()
        parent = int.from_bytes(digest, "big")
        out.append(parent)
    return tuple(out)
