"""One request of a workload, as the simulator and the load generator replay it."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

PREFIX_KEY_BLOCKS = 4
"""Leading block hashes the routing key covers (64 tokens at 16-token blocks, about
the gateway's 256 characters at 4 characters per token)."""


@dataclass(frozen=True, slots=True)
class WorkloadRequest:
    """A request to replay.

    Attributes:
        arrival_s: arrival time in seconds from the start of the workload.
        prompt_tokens: prompt length.
        output_tokens: the true output length (what the engine will generate).
        max_tokens: the client's cap (≥ output_tokens).
        tenant: who sends it.
        lane: the lane it is classified into.
        priority: 0 (critical) … 5 (background).
        deadline_ms: optional per-request deadline relative to arrival; ``None``
            means the lane's SLO.
        prefix: hashes of the prompt's KV blocks in order (Mooncake-style
            ``hash_ids``; equal leading hashes mean a shared prompt prefix);
            empty when the workload does not say.
        prefix_block_tokens: tokens each ``prefix`` hash names (a trace's own block
            size, Mooncake's 512); ``None``: one engine KV block each. The simulator
            expands larger ones into engine blocks (``sim/workloads/trace_blocks.py``).
    """

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    max_tokens: int
    tenant: str = "default"
    lane: str = "interactive"
    priority: int = 2
    deadline_ms: float | None = None
    prefix: tuple[int, ...] = ()
    prefix_block_tokens: int | None = None

    @property
    def prefix_key(self) -> int | None:
        """The ticket's ``prefix_key`` for ``prefix_affinity``: CRC-32 of the first
        :data:`PREFIX_KEY_BLOCKS` block hashes, as the gateway hashes the prompt's
        leading text; ``None`` without hashes."""
        if not self.prefix:
            return None
        lead = ",".join(str(h) for h in self.prefix[:PREFIX_KEY_BLOCKS])
        return zlib.crc32(lead.encode())
