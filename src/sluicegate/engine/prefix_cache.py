"""An LRU cache of prompt KV blocks keyed by block hash (vLLM's automatic prefix caching).

A prompt is a chain of blocks of ``block_size`` tokens; a workload names each
full block by a hash of it and everything before it (Mooncake's ``hash_ids``),
so two prompts share their first k blocks iff their first k hashes agree. The
engine asks :meth:`PrefixCache.match` how many leading blocks of a new prompt
are resident and skips their prefill; it :meth:`~PrefixCache.insert`\\ s a
prompt's blocks once they are computed.

Cached blocks live in KV memory the engine counts as free (vLLM keeps freed
blocks with their hashes in the free queue until it needs them), so the cache
holds at most the engine's free blocks: :meth:`~PrefixCache.trim` evicts the
least recently used ones past that bound. Only the skipped compute is modelled;
running sequences do not share memory.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["PrefixCache"]


class PrefixCache:
    """Block hashes in least-recently-used order, with a capacity set from outside.

    Invariant: after every call, ``len(self) <= capacity`` of the last
    :meth:`trim` (or of the call's own ``capacity`` argument).
    """

    __slots__ = ("_blocks", "_events", "hit_requests", "hit_tokens", "query_requests",
                 "query_tokens", "recording")  # fmt: skip

    def __init__(self) -> None:
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.recording = False
        """Whether stores and evictions are kept for :meth:`drain_events` (an engine that
        publishes KV events); off, nothing is kept."""
        self._events: list[tuple[bool, int]] = []  # (stored, block), in order
        self.query_tokens = 0
        """Prompt tokens of admissions that looked the cache up (vLLM ``prefix_cache_queries``)."""
        self.hit_tokens = 0
        """Prompt tokens whose prefill the cache saved (vLLM ``prefix_cache_hits``)."""
        self.query_requests = 0
        """Admissions that looked the cache up (a request run again counts again)."""
        self.hit_requests = 0
        """Of those, admissions that found at least one block cached."""

    @property
    def hit_rate(self) -> float:
        """``hit_tokens / query_tokens``; 0 before any query."""
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block: int) -> bool:
        return block in self._blocks

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of ``hashes`` are cached; marks them most recently used.

        The match stops at the first miss: a block's KV depends on every token
        before it, so a later block is useless without the earlier ones.
        """
        blocks = self._blocks
        hits = 0
        for block in hashes:
            if block not in blocks:
                break
            blocks.move_to_end(block)
            hits += 1
        return hits

    def lookup(self, hashes: Sequence[int], total: int, block_size: int, capacity: int) -> int:
        """Tokens of a sequence of ``total`` tokens the cache saves: trim, then match.

        At most ``total - 1``: the last token is always computed, to sample the next.
        """
        if not hashes:
            return 0
        self.trim(capacity)
        return min(self.match(hashes) * block_size, total - 1)

    def count(self, prompt_tokens: int, cached: int, capacity: int) -> None:
        """Record one admission's lookup (its prompt and the tokens saved), then trim."""
        self.query_tokens += prompt_tokens
        self.hit_tokens += cached
        self.query_requests += 1
        self.hit_requests += cached > 0
        self.trim(capacity)

    def insert(self, hashes: Sequence[int], capacity: int) -> None:
        """Cache ``hashes`` as most recently used (the last one most), then trim to ``capacity``."""
        blocks = self._blocks
        if self.recording:
            self._events.extend((True, block) for block in hashes if block not in blocks)
        for block in hashes:
            blocks[block] = None
            blocks.move_to_end(block)
        self.trim(capacity)

    def insert_all(self, prompts: list[tuple[int, ...]], capacity: int) -> None:
        """:meth:`insert` each prompt's hashes in turn, then empty ``prompts``."""
        for hashes in prompts:
            self.insert(hashes, capacity)
        prompts.clear()

    def trim(self, capacity: int) -> None:
        """Evict least recently used blocks until at most ``max(capacity, 0)`` remain."""
        blocks = self._blocks
        while len(blocks) > max(capacity, 0):
            evicted, _ = blocks.popitem(last=False)
            if self.recording:
                self._events.append((False, evicted))

    def drain_events(self) -> list[tuple[bool, int]]:
        """``(stored, block)`` for every block cached (True) or evicted (False) since the
        last drain, in the order it happened (an engine's ``BlockStored`` and
        ``BlockRemoved``); empty unless ``recording``."""
        events, self._events = self._events, []
        return events

    def lru_order(self) -> list[int]:
        """The cached hashes, least recently used first (for inspection and tests)."""
        return list(self._blocks)
