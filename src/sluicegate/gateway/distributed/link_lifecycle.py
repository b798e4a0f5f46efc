"""The store link's life (DESIGN §16): fall back when the store fails, probe, rejoin,
keep alive, listen for grants.

``LinkLifecycle`` is the base of ``StoreLink`` (``gateway/distributed/store_link.py``), which
adds what the driver calls; this half owns the connection: a failure moves the
link to its fallback once (logged and counted), a probe opens a new session when
the store answers again, the session writes this replica's running tickets back
and waits for the other replicas to rejoin, and while in global mode a heartbeat
keeps the replica alive and fills, a listener admits grants pushed by other
replicas' syncs, and work sharing exchanges work summaries for the start estimate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from sluicegate.core.ratelimit import TenantRateLimiter
from sluicegate.core.scheduler import Scheduler
from sluicegate.core.spec import TenantSpec
from sluicegate.gateway.distributed.distributed_metrics import StoreMetrics
from sluicegate.gateway.distributed.link_modes import (
    GRANT_BLOCK_S,
    HEARTBEAT_MAX_S,
    PROBE_INTERVAL_S,
    REJOIN_POLL_S,
    LinkMode,
    StoreClient,
    distinct_replicas,
)
from sluicegate.gateway.distributed.link_view import LinkView
from sluicegate.gateway.distributed.work_sharing import work_sharing
from sluicegate.store.redis_store import RedisStore
from sluicegate.store.store_config import DistributedSpec
from sluicegate.store.store_errors import StoreSessionLostError, StoreUnavailableError
from sluicegate.store.types import LaneLimits, Lease, ModelLimits

_log = logging.getLogger("sluicegate.store")


class LinkLifecycle(ABC):
    """The connection half of a store link: modes, fallback, probe, rejoin, heartbeat,
    grant listener. Subclasses say what to write back and how to flush."""

    replica: str
    session: int
    store: RedisStore
    settings: DistributedSpec
    mode: LinkMode
    replicas: int
    metrics: StoreMetrics | None
    view: LinkView
    _open_store: Callable[[str], RedisStore]
    _tenants: Mapping[str, TenantSpec]
    _lanes: Mapping[str, tuple[LaneLimits, ...]]
    _client: StoreClient | None
    _scheduler: Scheduler
    _resyncing: bool
    _tasks: set[asyncio.Task[None]]
    # Whether the store has ever counted the replicas: until then a fallback knows no share.
    _counted: bool = False

    @abstractmethod
    def _limits(self, model: str) -> ModelLimits:
        """The model's limits as this replica sends them."""

    @abstractmethod
    def _leases(self, model: str) -> list[Lease]:
        """This replica's running tickets of ``model``, to write back on a rejoin."""

    @abstractmethod
    def _forget(self) -> None:
        """The store is gone: drop what was to be sent and what it was told."""

    @abstractmethod
    def _tick(self) -> None:
        """Run a fill of every model soon (the heartbeat's)."""

    @abstractmethod
    def _deliver(self, model: str, item: str) -> None:
        """Act on one item of this replica's grant list: a grant or a stop."""

    @abstractmethod
    def _release_offers(self) -> None:
        """Send what was held back while rejoining."""

    def _fallback_mode(self) -> LinkMode:
        """``on_store_failure``; but before the store first counted the replicas,
        ``fail_open`` needs ``expected_replicas`` to know its share, and without it the
        replica refuses (``fail_closed``) rather than admit at the whole limits."""
        settings = self.settings
        if settings.on_store_failure == "fail_open" and (
            self._counted or settings.expected_replicas is not None
        ):
            return LinkMode.FAIL_OPEN
        return LinkMode.FAIL_CLOSED

    def _fail(self, exc: StoreUnavailableError, op: str) -> None:
        """Leave global mode once (logged, counted), fall back, and probe until it returns."""
        if self.mode is not LinkMode.GLOBAL and self._client is not None and self._probing():
            return
        self.mode = self._fallback_mode()
        self._resyncing = False
        self.view.fell_back(self.mode.value)
        self._forget()
        if not self._counted:
            self.replicas = self.settings.expected_replicas or 1
        share = 1.0 / self.replicas
        effect = (
            f"local limits at 1/{self.replicas}"
            if self.mode is LinkMode.FAIL_OPEN
            else "refusing requests with 503 store_unavailable"
        )
        if not self._counted:
            effect += " until the store first answers"
        _log.warning("shared store unavailable (%s: %s): %s", op, exc, effect)
        if self.metrics is not None:
            self.metrics.transitions.labels(self.mode.value).inc()
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()
        if self._client is not None:
            limiter = TenantRateLimiter(list(self._tenants.values()), share=share)
            fail_open = self.mode is LinkMode.FAIL_OPEN
            self._client.store_lost(fail_open=fail_open, share=share, limiter=limiter)
        self._spawn(self._probe())

    async def _retrying(self, exc: StoreUnavailableError, op: str, give_up: float) -> bool:
        """After ``op`` failed: whether to send it again. A timeout is retried while the
        store answers a ping, until ``give_up``: a busy event loop or a slow moment of the
        store is no reason to drop to local limits, and the scripts apply a retried call
        once. A store that answers no ping (stopped, gone), any other failure, or a timeout
        past ``give_up`` falls back."""
        if (
            exc.timed_out
            and time.monotonic() < give_up
            and self.mode is LinkMode.GLOBAL
            and await self._answers()
            and self.mode is LinkMode.GLOBAL
        ):
            if self.metrics is not None:
                self.metrics.retries.labels(op).inc()
            return True
        self._fail(exc, op)
        return False

    def _retry_budget_s(self) -> float:
        """How long a timed-out call is retried: half a lease TTL (the replica's leases
        stay live meanwhile: its heartbeats run apart) and at least two timeouts."""
        return max(self.settings.lease_ttl_s / 2.0, 2.0 * self.settings.timeout_ms / 1000.0)

    def _probing(self) -> bool:
        return any(task.get_name() == "store-probe" for task in self._tasks)

    async def _probe(self) -> None:
        """In a fallback: try a new session every ``PROBE_INTERVAL_S`` until one connects."""
        task = asyncio.current_task()
        assert task is not None
        task.set_name("store-probe")
        while True:
            await asyncio.sleep(PROBE_INTERVAL_S)
            store = self._open_store(f"{self.replica}.{self.session + 1}")
            try:
                await store.connect()
            except StoreUnavailableError:
                with contextlib.suppress(StoreUnavailableError):
                    await store.close()
                continue
            task.set_name("store-restore")
            self.session += 1
            old, self.store = self.store, store
            with contextlib.suppress(StoreUnavailableError):
                await old.close()
            await self._restore()
            return

    async def _restore(self) -> None:
        """Enter global mode: offer what waits (held back), write the running tickets back,
        then let the offers go and start the heartbeat and the grant listener."""
        client = self._client
        assert client is not None
        self.mode = LinkMode.GLOBAL
        self._resyncing = True
        self.view.entered("rejoining")
        client.store_restored()
        try:
            for model in self._lanes:
                await self.store.resync(self._limits(model), self._leases(model))
            await self._rejoin()
        except StoreUnavailableError as exc:
            self._resyncing = False
            self._fail(exc, "resync")
            return
        self._resyncing = False
        self._counted = True
        self.view.entered(LinkMode.GLOBAL.value)
        _log.warning("shared store available: global mode, %d replica(s)", self.replicas)
        if self.metrics is not None:
            self.metrics.transitions.labels(LinkMode.GLOBAL.value).inc()
        self._spawn(self._heartbeat())
        self._spawn(self._listen())
        ttl_s, observe = self.settings.lease_ttl_s, self._observe
        sharing = work_sharing(self.store, self._scheduler, self._client, ttl_s, observe)
        if sharing is not None:
            self._spawn(sharing)
        self._release_offers()

    async def _rejoin(self) -> None:
        """Wait until every replica seen before the failure has written its leases back (or
        one lease TTL passed): a store that restarted empty knows only the replicas that
        rejoined, and a fill before the others did would not count what they run."""
        expected = self.replicas
        models = list(self._lanes)
        deadline = time.monotonic() + self.settings.lease_ttl_s
        while True:
            await self.store.heartbeat(models)
            self.replicas = distinct_replicas(await self.store.live_replicas(models))
            if self.replicas >= expected or time.monotonic() >= deadline:
                return
            await asyncio.sleep(REJOIN_POLL_S)

    async def _heartbeat(self) -> None:
        """Keep this replica alive, learn the replica count, and fill: capacity a dead
        replica's leases stop holding (its TTL ran out) is granted by the next fill, and
        with no traffic no sync would run one."""
        period = min(HEARTBEAT_MAX_S, self.settings.lease_ttl_s / 4.0)
        while self.mode is LinkMode.GLOBAL:
            await asyncio.sleep(period)
            started = time.perf_counter()
            try:
                await self.store.heartbeat(list(self._lanes))
                self.replicas = distinct_replicas(await self.store.live_replicas(list(self._lanes)))
            except StoreUnavailableError as exc:
                if not isinstance(exc, StoreSessionLostError) and await self._answers():
                    continue
                self._fail(exc, "heartbeat")
                return
            self._observe("heartbeat", started)
            self._tick()

    async def _listen(self) -> None:
        """Admit what other replicas' syncs granted to this one, as soon as it is pushed."""
        models = list(self._lanes)
        while self.mode is LinkMode.GLOBAL:
            try:
                grants = await self.store.next_grants(models, GRANT_BLOCK_S)
            except StoreUnavailableError as exc:
                if not await self._answers():
                    self._fail(exc, "grant listener")
                    return
                # A grant popped before the failure may be lost: offering every waiting
                # ticket again has the store grant a leased one again (sync.lua).
                if self.metrics is not None:
                    self.metrics.retries.labels("grant listener").inc()
                client = self._client
                assert client is not None
                client.store_restored()
                continue
            for model, item in grants:
                self._deliver(model, item)

    async def _answers(self) -> bool:
        """After a call timed out or a listener failed: does the store answer a ping (within
        ``timeout_ms``)? If it does, the call was slowed (a busy event loop, a busy store),
        not lost, and is retried; if not, the store is stopped or gone."""
        try:
            await self.store.ping()
        except StoreUnavailableError:
            return False
        return True

    def _observe(self, op: str, started: float) -> None:
        elapsed = time.perf_counter() - started
        if op == "sync":
            self.view.synced(elapsed)
        if self.metrics is not None:
            self.metrics.round_trip.labels(op).observe(elapsed)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
