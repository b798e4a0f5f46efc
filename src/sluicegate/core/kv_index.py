"""What each engine holds in its prefix cache, as its KV events say (sans-I/O).

Engines announce the blocks they cache and evict (vLLM's and SGLang's KV events:
``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``); the gateway's subscriber decodes
them into the events below and the scheduler applies them to each backend's
``BlockIndex``. The index is bounded: past ``max_blocks`` the oldest announced blocks
are forgotten (a lost ``BlockRemoved`` or a hostile stream cannot grow it), and a gap in
the event sequence the engine cannot replay, a reconnect or an ``AllBlocksCleared`` empty
it — an empty index only makes routing approximate, never wrong.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sluicegate.core.prefix_blocks import leading_run

DEFAULT_MAX_BLOCKS = 1_000_000
"""Blocks remembered per backend: 8 bytes of hash and an ordered-dict slot each (~100 MB
at most per backend); an 80 GB GPU of an 8B model holds ~30k blocks of 16 tokens."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    """The engine cached these blocks (in prompt order; ``parent`` precedes the first)."""

    hashes: tuple[int, ...]
    parent: int | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """The engine evicted these blocks."""

    hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The engine dropped its whole prefix cache (a reset, or a restart)."""


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


def events_of(changes: Iterable[tuple[bool, int]]) -> tuple[KvEvent, ...]:
    """``(stored, block)`` cache changes in order (``PrefixCache.drain_events``) as the
    events an engine publishes: each run of stores one ``BlockStored``, each run of
    evictions one ``BlockRemoved``, in order."""
    events: list[KvEvent] = []
    run: list[int] = []
    storing = False
    for stored, block in changes:
        if run and stored != storing:
            events.append(BlockStored(tuple(run)) if storing else BlockRemoved(tuple(run)))
            run = []
        storing = stored
        run.append(block)
    if run:
        events.append(BlockStored(tuple(run)) if storing else BlockRemoved(tuple(run)))
    return tuple(events)


class BlockIndex:
    """The block hashes one engine holds, oldest announcement first, at most ``max_blocks``.

    Invariant: ``len(self) <= max_blocks`` after every call.
    """

    __slots__ = ("_blocks", "max_blocks")

    def __init__(self, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be >= 1, got {max_blocks}")
        self.max_blocks = max_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block: object) -> bool:
        return block in self._blocks

    def apply(self, events: Iterable[KvEvent]) -> None:
        """Apply events in the order the engine sent them."""
        blocks = self._blocks
        for event in events:
            if isinstance(event, BlockStored):
                for block in event.hashes:
                    blocks[block] = None
                    blocks.move_to_end(block)
                while len(blocks) > self.max_blocks:
                    blocks.popitem(last=False)
            elif isinstance(event, BlockRemoved):
                for block in event.hashes:
                    blocks.pop(block, None)
            else:
                blocks.clear()

    def clear(self) -> None:
        """Forget everything (the engine's state is no longer known)."""
        self._blocks.clear()

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of ``hashes`` the engine holds."""
        return leading_run(hashes, self._blocks)
