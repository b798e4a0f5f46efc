"""Prefix-cache hit rates of a simulation run: per replica and overall, in tokens and in
requests, and their table (``sim/report.py`` writes them to ``results.json``).

The engine model counts every admission that looks its prefix cache up
(``PrefixCache.count``): the admitted prompt's tokens, the tokens whose prefill a cached
prefix saved, and whether any block was cached (a *request hit*). A request run again
after a preemption is looked up, and counted, again, as vLLM's ``prefix_cache_queries``
counts it. Workloads without block hashes look nothing up; their runs report no
prefix-cache figures at all (``results.json`` then has no ``prefix_cache`` key).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rich.table import Table

from sluicegate.engine.prefix_cache import PrefixCache

__all__ = ["PrefixCounts", "prefix_table"]

_DASH = "–"


@dataclass(frozen=True, slots=True)
class PrefixCounts:
    """Prefix-cache lookups of one replica, or of several added up.

    Attributes:
        queried_tokens: prompt tokens of the admissions that looked the cache up.
        cached_tokens: of those, tokens found cached (their prefill skipped).
        requests: admissions that looked the cache up.
        hit_requests: of those, admissions that found at least one block cached.
    """

    queried_tokens: int = 0
    cached_tokens: int = 0
    requests: int = 0
    hit_requests: int = 0

    @classmethod
    def of(cls, cache: PrefixCache) -> PrefixCounts:
        """The counters of one engine's prefix cache."""
        return cls(cache.query_tokens, cache.hit_tokens, cache.query_requests, cache.hit_requests)

    @classmethod
    def total(cls, counts: Iterable[PrefixCounts]) -> PrefixCounts:
        """The sum of ``counts``."""
        q = c = r = h = 0
        for one in counts:
            q, c = q + one.queried_tokens, c + one.cached_tokens
            r, h = r + one.requests, h + one.hit_requests
        return cls(q, c, r, h)

    @property
    def token_hit_rate(self) -> float | None:
        """Cached ÷ queried tokens; ``None`` when nothing was looked up."""
        return self.cached_tokens / self.queried_tokens if self.queried_tokens else None

    @property
    def request_hit_rate(self) -> float | None:
        """Hit ÷ looked-up requests; ``None`` when nothing was looked up."""
        return self.hit_requests / self.requests if self.requests else None


def _cell(counts: PrefixCounts | None) -> str:
    if counts is None or not counts.requests:
        return _DASH
    tokens, requests = counts.token_hit_rate or 0.0, counts.request_hit_rate or 0.0
    return f"{100.0 * tokens:.1f}% / {100.0 * requests:.1f}%"


def prefix_table(labels: Sequence[str], runs: Sequence[Mapping[str, PrefixCounts]]) -> Table | None:
    """Hit rates (tokens / requests) per policy column: all replicas, then each replica;
    ``None`` when no run looked anything up."""
    if not any(PrefixCounts.total(r.values()).requests for r in runs):
        return None
    table = Table(title="prefix cache hits", title_justify="left")
    table.add_column("tokens / requests")
    for label in labels:
        table.add_column(label, justify="right")
    table.add_row("all", *(_cell(PrefixCounts.total(r.values())) for r in runs))
    names = list(dict.fromkeys(name for r in runs for name in r))
    for name in names:
        table.add_row(name, *(_cell(r.get(name)) for r in runs))
    return table
