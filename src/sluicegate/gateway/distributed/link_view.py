"""What one replica's store link shows of itself (DESIGN §16, "What an operator sees").

The link (``gateway/distributed/store_link.py`` and its lifecycle) tells a ``LinkView``
when its mode changes, when it falls back and how long each successful sync took; the
view keeps the mode it is in (``global``, ``rejoining``, ``fail_open``, ``fail_closed``)
and since when, the fallbacks so far and the last sync's round trip and age.

It also reads, on demand, the store's running tickets per tenant (``RedisStore.counts``,
summed over the live replicas' leases). That read costs Redis O(running tickets), so it
is never made per request: ``/admin/state`` and ``/metrics`` ask for it, only in global
mode, and a read younger than ``TENANT_READ_MIN_S`` (or a failed try as young) is
reused. It runs on a connection of its own, so a slow read cannot time out the hot
path's pipeline, and it never moves the link to its fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Collection, Mapping

from sluicegate.core.views import by_tenant
from sluicegate.store.redis_store import RedisStore
from sluicegate.store.store_errors import StoreUnavailableError
from sluicegate.store.types import LaneLimits, ModelLimits

TENANT_READ_MIN_S = 1.0
"""How long a read (or a failed try) of the per-tenant counts is reused: at most one read
a second per process, however often ``/admin/state`` and ``/metrics`` (maybe open) are asked."""


class LinkView:
    """One replica's view of the store: its mode and since when, fallbacks, last sync, and
    the global running tickets per tenant as last read (see the module docstring).

    ``open_store`` opens a store connection (the link's own factory); ``lanes`` are the
    models' lanes; ``configured`` the configured tenant names (others show as ``other``).
    """

    def __init__(
        self,
        mode: str,
        open_store: Callable[[str], RedisStore],
        lanes: Mapping[str, tuple[LaneLimits, ...]],
        configured: Collection[str],
    ) -> None:
        self.mode = mode
        self.since = time.time()
        self.fallbacks = 0
        self.sync_round_trip_s: float | None = None
        self._synced_at: float | None = None
        self.tenants: dict[str, dict[tuple[str, str], int]] | None = None
        self._read_at: float | None = None
        self._tried_at: float | None = None
        self._read_error: str | None = None
        self._open_store = open_store
        self._lanes = lanes
        self._configured = frozenset(configured)
        self._reader: RedisStore | None = None
        self._lock = asyncio.Lock()

    @property
    def configured(self) -> frozenset[str]:
        """The configured tenant names (every other tenant shows as ``other``)."""
        return self._configured

    def entered(self, mode: str) -> None:
        """The link is now in ``mode`` (nothing changes if it already was)."""
        if mode != self.mode:
            self.mode = mode
            self.since = time.time()

    def fell_back(self, mode: str) -> None:
        """The link left global mode (or failed to enter it) for its fallback ``mode``."""
        self.fallbacks += 1
        self.entered(mode)

    def synced(self, round_trip_s: float) -> None:
        """A sync succeeded after ``round_trip_s``."""
        self.sync_round_trip_s = round_trip_s
        self._synced_at = time.monotonic()

    def sync_age_s(self) -> float | None:
        """Seconds since the last successful sync (``None`` before the first)."""
        return None if self._synced_at is None else time.monotonic() - self._synced_at

    async def read_tenants(self, session: str) -> None:
        """Read every model's running tickets per tenant from the store, unless a read or a
        try is younger than ``TENANT_READ_MIN_S``; a failure is kept for ``status``, not
        raised. ``session`` names the reader's connection (it writes nothing)."""
        async with self._lock:
            now = time.monotonic()
            if self._tried_at is not None and now - self._tried_at < TENANT_READ_MIN_S:
                return
            self._tried_at = now
            try:
                if self._reader is None:
                    self._reader = self._open_store(session)
                    await self._reader.connect()
                reader = self._reader
                models = list(self._lanes)
                read = await asyncio.gather(
                    *(reader.counts(ModelLimits(m, 0, None, self._lanes[m])) for m in models)
                )
            except StoreUnavailableError as exc:
                self._read_error = str(exc)
                await self.close()
                return
            self.tenants = {m: c.tenants_running for m, c in zip(models, read, strict=True)}
            self._read_at = time.monotonic()
            self._read_error = None

    async def close(self) -> None:
        """Close the reader's connection (a later read opens another)."""
        reader, self._reader = self._reader, None
        if reader is not None:
            with contextlib.suppress(StoreUnavailableError):
                await reader.close()

    def status(self) -> dict[str, object]:
        """The view's part of ``/admin/state``'s ``store``: ``mode_since`` (Unix seconds),
        ``fallbacks``, ``last_sync`` (``round_trip_s``, ``age_s``; ``null`` before the
        first) and ``global_tenants`` (``null`` before the first try): the last read's
        ``age_s`` (``null`` if none succeeded), the last try's ``error`` (``null`` if it
        succeeded) and per model the running tickets per tenant (``tenant_rows``)."""
        age = self.sync_age_s()
        last_sync = None
        if age is not None:
            last_sync = {"round_trip_s": self.sync_round_trip_s, "age_s": age}
        global_tenants = None
        if self._tried_at is not None:
            read_age = None if self._read_at is None else time.monotonic() - self._read_at
            global_tenants = {
                "age_s": read_age,
                "error": self._read_error,
                "models": {
                    model: tenant_rows(counts, self._configured)
                    for model, counts in (self.tenants or {}).items()
                },
            }
        return {
            "mode_since": self.since,
            "fallbacks": self.fallbacks,
            "last_sync": last_sync,
            "global_tenants": global_tenants,
        }


def tenant_rows(
    counts: Mapping[tuple[str, str], int], configured: Collection[str]
) -> list[dict[str, object]]:
    """Running requests per (tenant, lane) as ``/admin/state`` lists them: one row per tenant
    with running requests (configured names; others summed as ``other``), sorted, with its
    ``running`` and ``lanes`` (lane → running)."""
    return [
        {"tenant": tenant, "running": sum(lanes.values()), "lanes": dict(sorted(lanes.items()))}
        for tenant, lanes in sorted(by_tenant(counts, configured).items())
    ]
