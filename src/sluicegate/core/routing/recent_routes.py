"""Where a router recently sent each KV block, until the engine's events can say so."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

DEFAULT_MAX_BLOCKS = 100_000
"""Blocks remembered at most: ~1000 recent prompts of 100 blocks (a 6k-character prompt
of 16-token blocks is ~94); past it the oldest records go first."""


class RecentRoutes:
    """Block hash → (backend, expiry) for the blocks of the prompts a router just sent.

    An engine announces a prompt's blocks only once it has computed them; a sibling that
    arrives meanwhile (parallel requests sharing a system prompt) would find them nowhere
    and be spread by load. Recording each decision for ``ttl_s`` lets the router send it
    where the first went. A record lapses at ``recorded + ttl_s``; a block sent again is
    recorded afresh (to the new backend, with a new expiry). ``ttl_s == 0`` records nothing.

    Invariant: at most ``max_blocks`` records, oldest expiry first (the clock passed as
    ``now`` never goes back, so insertion order is expiry order).
    """

    __slots__ = ("_records", "max_blocks", "ttl_s")

    def __init__(self, ttl_s: float, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        if ttl_s < 0.0:
            raise ValueError(f"ttl_s must be >= 0, got {ttl_s}")
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be >= 1, got {max_blocks}")
        self.ttl_s = ttl_s
        self.max_blocks = max_blocks
        self._records: OrderedDict[int, tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def record(self, hashes: Sequence[int], backend: str, now: float) -> None:
        """``hashes`` were sent to ``backend`` at ``now``; expired records are dropped."""
        self._expire(now)
        if self.ttl_s <= 0.0:
            return
        records = self._records
        expiry = now + self.ttl_s
        for block in hashes:
            records[block] = (backend, expiry)
            records.move_to_end(block)
        while len(records) > self.max_blocks:
            records.popitem(last=False)

    def holds(self, block: int, backend: str, now: float) -> bool:
        """Whether ``block`` was sent to ``backend`` less than ``ttl_s`` before ``now``."""
        record = self._records.get(block)
        return record is not None and record[0] == backend and record[1] > now

    def _expire(self, now: float) -> None:
        records = self._records
        while records:
            block, (_, expiry) = next(iter(records.items()))
            if expiry > now:
                break
            del records[block]
