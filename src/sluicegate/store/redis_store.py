"""``RedisStore``: the global waiting sets, leases and rate buckets of distributed mode, in Redis.

Key layout. Every key of model ``m`` starts with ``{<prefix>:<m>}:`` (one hash
tag, so one Lua script sees all of a model's state atomically):

============================  ======  ===================================================
key (after the tag)           type    holds
============================  ======  ===================================================
``replicas``                  ZSET    replica → liveness expiry (ms, Redis ``TIME``)
``held:<replica>``            HASH    the replica's running tickets per lane ``l:<lane>``,
                                      of them borrowed ``b:<lane>``, their tokens ``t``
``lease:<replica>``           HASH    running ticket → msgpack(lane, tenant, cost, weight,
                                      priority, admitted, preemptible from, borrowed)
``wait:<replica>``            HASH    waiting ticket → msgpack(lane, tenant, cost, weight,
                                      vtc_charge, member, fair, priority, urgent at,
                                      preemption delay, share from)
``pv``                        ZSET    preemptible leases ``<replica>|<ticket>`` by priority,
                                      then admission (the cheapest victim scores highest)
``urg``                       ZSET    waiting members by when they turn urgent
``stop`` / ``pend``           HASH    victim → msgpack(lane, waiter, borrowed); lane → its
                                      one victim stopping
``tr:<lane>`` / ``tw:<lane>`` HASH    tenant → running tickets / its weight
``last:<replica>``            STRING  msgpack(sequence, answer) of the session's last sync
``q:<lane>``                  ZSET    waiting tickets of a lane without fairness
``fq:<len>:<lane>:<tenant>``  ZSET    a tenant's waiting tickets in a ``vtc`` lane (``len``
                                      the lane's byte length: lane and tenant stay apart)
``bk:<lane>``                 HASH    tenant → waiting tickets (``vtc`` lanes, backlogged
                                      tenants only)
``vtc:<lane>``                HASH    tenant → virtual token counter
``front:<lane>``              STRING  the VTC frontier (the last served tenant's counter
                                      before its charge)
``grants:<replica>``          LIST    the replica's tickets granted by other replicas'
                                      syncs (expires 3 lease TTLs after the last push)
``work:<replica>``            HASH    lane → the replica's work summary (``work_summary``)
============================  ======  ===================================================

Waiting-set members all score 0 and read ``<order>|<replica>|<ticket>``, the
order as ``order.encode_order`` (so ``ZRANGE q 0 0`` is the best waiter of the
lane, whichever replica holds it; equal orders fall to replica id, then ticket
id). A tenant's buckets are the hash ``{<prefix>:rate:<tenant>}`` (level and
time of each bucket); it expires once the buckets would have refilled, as a
missing bucket is a full one.

A replica's leases count only while its expiry (refreshed by every sync,
heartbeat and resync to now + ``lease_ttl_s``) is in the future: the fill sums
the live replicas' ``held`` hashes, so a replica killed with -9 frees its slots
within one TTL, and the first heartbeat (of any replica) more than one further
TTL later deletes its keys. Reaping uses the caller's TTL: every replica of a
fleet must have the same ``lease_ttl_s``.

Round trips. ``sync`` is one pipelined round trip for all models of a flush
(one script call per model, plus one per refund); ``take`` one per rate-limited
admission; ``heartbeat`` and ``live_replicas`` one each per period for all
models; ``next_grants`` is a long poll (``BLPOP``) on a connection of its own,
then one ``LPOP`` round trip to drain what else arrived. A request costs its
share of two syncs (its offer, its drop, batched with whatever else the flush
carries) plus one ``take`` if its tenant is rate-limited. After a Redis restart
the first call of each script costs one more (``NOSCRIPT``, ``SCRIPT LOAD``,
retry). Every connection speaks RESP itself (``store/resp.py``: one write and one
future per round trip). Latencies and Redis CPU per request:
``benchmarks/bench_store_rtt.py`` and docs/BENCHMARKS.md.

Memory pressure: the scripts run while Redis is at its ``maxmemory``; see ``store/lua.py``.

Redis Cluster (``cluster=True``): each call goes to the master of its key's slot, a
pipeline split per master (``store/cluster_client.py``); a round trip then lasts as long
as its slowest master, and ``timeout_s`` bounds each.

Sizing. A waiting ticket takes about 340 bytes of Redis memory (fifo order,
32-character replica id; about 410 with a 3-float order in a ``vtc`` lane of 100
tenants: ``MEMORY USAGE`` over 10,000 waiting tickets); a running one about 110
(its lease field). Rate buckets: one small hash per recently active tenant.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, TypeVar

from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from sluicegate.store.cluster_client import ClusterClient
from sluicegate.store.grant_listener import GrantListener, OneNode
from sluicegate.store.keys import check_replica_id, grants_key, model_base, rate_key
from sluicegate.store.lua import Call, LimitScripts, milliseconds, sync_args, sync_result
from sluicegate.store.resp import Pipelined, RespClient
from sluicegate.store.store_errors import StoreSessionLostError, StoreUnavailableError
from sluicegate.store.tenant_counts import ModelCounts, counts_args, parse_counts
from sluicegate.store.types import (
    Drop,
    Lease,
    ModelLimits,
    Offer,
    Refund,
    SyncResult,
    TenantRates,
)

__all__ = ["RedisStore"]

_T = TypeVar("_T")


_STORE_ERRORS = (RedisError, OSError, EOFError, TimeoutError)
BLOCK_LATENESS_S = 0.1
"""How late Redis may end a ``BLPOP`` past its timeout: it checks blocked clients'
timeouts on its cron, every 1/hz s (hz 10 by default); ``next_grants`` waits this much longer."""


def _rate_args(rate: float | None, burst: float) -> list[str | int | float]:
    return ["" if rate is None else float(rate), float(burst)]


class RedisStore:
    """One replica's connection to the shared store (see the module docstring).

    Every method raises ``StoreUnavailableError`` on any Redis error, timeout
    or connection error, and none takes longer than ``timeout_s`` (``next_grants``:
    its ``block_s`` plus ``BLOCK_LATENESS_S`` plus ``timeout_s``). Invalid arguments
    raise ``ValueError`` before anything is sent.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "sluicegate",
        replica: str,
        lease_ttl_s: float = 5.0,
        timeout_s: float = 0.05,
        cluster: bool = False,
    ) -> None:
        if not 0.0 < lease_ttl_s < math.inf or not 0.0 < timeout_s < math.inf:
            raise ValueError("lease_ttl_s and timeout_s must be positive and finite")
        self._url = url
        self._prefix = prefix
        self._replica = check_replica_id(replica)
        self._ttl_ms = max(1, round(lease_ttl_s * 1000.0))
        self._timeout_s = timeout_s
        self._cluster = cluster
        self._client: Pipelined | None = None
        self._grants: GrantListener | None = None
        self._grant_models: dict[str, str] = {}
        self._scripts = LimitScripts()
        self._seq = 0
        self._joined: set[str] = set()  # models this session resynced: the store knows it

    @property
    def replica(self) -> str:
        """This replica's id in the store."""
        return self._replica

    async def connect(self) -> None:
        """Create the clients, register the scripts and ping (``StoreUnavailableError`` if down)."""
        if self._client is None:
            # Hot path (every sync, take and heartbeat): the lean pipelined client(s).
            router: ClusterClient | OneNode
            if self._cluster:
                self._client = router = ClusterClient(self._url, connect_timeout_s=self._timeout_s)
            else:
                self._client = RespClient(self._url, connect_timeout_s=self._timeout_s)
                router = OneNode(self._url)
            self._grants = GrantListener(router, connect_timeout_s=self._timeout_s)
            self._scripts.reset()
        await self.ping()
        await self._guarded(self._scripts.load(self._main, self._deadline()))

    async def close(self) -> None:
        """Close every connection (idempotent, never raises: a store that stopped answering
        cannot refuse a close); ``connect`` may be called again afterwards."""
        client, grants = self._client, self._grants
        self._client = self._grants = None
        if client is not None:
            client.close()
        if grants is not None:
            await grants.close()

    def _main(self) -> Pipelined:
        if self._client is None:
            raise StoreUnavailableError("the store is not connected")
        return self._client

    def _deadline(self) -> float:
        """When a call starting now must have its answer (the event loop's clock)."""
        return asyncio.get_running_loop().time() + self._timeout_s

    @staticmethod
    async def _guarded(call: Awaitable[_T]) -> _T:
        """``call``, with the main client's errors as ``StoreUnavailableError`` (it keeps
        its own deadline: no ``asyncio.timeout`` needed)."""
        try:
            return await call
        except _STORE_ERRORS as error:
            message = f"redis store: {type(error).__name__}: {error}"
            timed_out = isinstance(error, TimeoutError | RedisTimeoutError)
            raise StoreUnavailableError(message, timed_out=timed_out) from error

    async def ping(self) -> None:
        """One round trip to the store (in a cluster, to every master at once)."""
        main = self._main()
        (reply,) = await self._guarded(main.execute([["PING"]], self._deadline()))
        if isinstance(reply, Exception):
            raise StoreUnavailableError(f"redis store: {type(reply).__name__}: {reply}")

    async def _run(self, calls: Sequence[Call]) -> list[Any]:
        """Run script calls in one pipeline; reload the scripts a restarted Redis lost.
        The whole of it (reload and retry included) within ``timeout_s``."""
        return await self._guarded(self._scripts.run(self._main, calls, self._deadline()))

    def _sync_call(
        self, limits: ModelLimits, ops: Sequence[Offer | Drop | Refund], seq: int
    ) -> Call:
        joined = limits.model in self._joined
        args = sync_args(self._replica, self._ttl_ms, limits, ops, time.time(), seq, joined)
        return self._scripts["sync"], [model_base(self._prefix, limits.model)], args

    def _refund_call(self, refund: Refund) -> Call | None:
        rates = refund.rates
        if rates.tokens_per_s is None or refund.tokens <= 0:
            return None
        args: list[str | int | float] = [*_rate_args(rates.tokens_per_s, rates.burst_tokens)]
        args.append(int(refund.tokens))
        return self._scripts["refund"], [rate_key(self._prefix, rates.tenant)], args

    async def sync(
        self,
        batches: Sequence[tuple[ModelLimits, Sequence[Offer | Drop | Refund]]],
        *,
        seq: int | None = None,
    ) -> list[SyncResult]:
        """Apply each model's ops in order, then fill; one pipelined round trip for all.

        Also refreshes this replica's liveness in every model of ``batches``.
        Returns one result per batch, in order: this replica's tickets granted
        and to stop, and the model's global counts after it (``lanes_*`` empty).
        ``seq`` retries the sync of that number (``next_seq``; default: a new one):
        applied at most once, answered again if it was (``sync.lua``'s fencing).

        Raises:
            ValueError: an offer's lane is not in its model's limits, or a
                weight, charge, cost or correction is out of range.
            StoreUnavailableError: also when a sync newer than ``seq`` was applied.
        """
        number = self.next_seq() if seq is None else seq
        sync_calls = [self._sync_call(limits, ops, number) for limits, ops in batches]
        refund_calls = [
            call
            for _, ops in batches
            for op in ops
            if isinstance(op, Refund) and (call := self._refund_call(op)) is not None
        ]
        replies = await self._run([*sync_calls, *refund_calls])
        return [sync_result(reply) for reply in replies[: len(sync_calls)]]

    def next_seq(self) -> int:
        """The number of this replica's next sync (increasing within its session)."""
        self._seq += 1
        return self._seq

    async def take(self, rates: TenantRates, tokens: int, *, request: str | None = None) -> float:
        """Charge 1 request and ``tokens`` tokens if both of the tenant's buckets allow.

        ``core.ratelimit.TenantRateLimiter.try_acquire`` on Redis time: returns
        0.0 when taken, else the seconds until it could be (the longest wait of
        the refusing buckets) and nothing is charged. A tenant without limits
        is admitted without a round trip. With ``request`` (unique in this replica's
        session) a retried take is charged once: its answer is kept for a minute.

        Raises:
            ValueError: if ``tokens`` is negative.
        """
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens}")
        if rates.requests_per_s is None and rates.tokens_per_s is None:
            return 0.0
        args = [
            *_rate_args(rates.requests_per_s, rates.burst_requests),
            *_rate_args(rates.tokens_per_s, rates.burst_tokens),
            int(tokens),
        ]
        keys = [rate_key(self._prefix, rates.tenant)]
        if request is not None:
            keys.append(f"{keys[0]}:take:{self._replica}:{request}")
        call = (self._scripts["take"], keys, args)
        replies = await self._run([call])
        return float(replies[0])

    def _per_model(
        self, script: str, models: Sequence[str], args: list[str | int | float]
    ) -> list[Call]:
        return [(self._scripts[script], [model_base(self._prefix, m)], args) for m in models]

    async def run_each(self, script: str, args: Mapping[str, list[str | int | float]]) -> list[Any]:
        """Run ``script`` once per model of ``args``, with its arguments, in one round trip."""
        calls = [(self._scripts[script], [model_base(self._prefix, m)], a) for m, a in args.items()]
        return await self._run(calls) if calls else []

    async def heartbeat(self, models: Sequence[str]) -> int:
        """Refresh liveness in ``models``, reap replicas dead for over one TTL; live replicas.

        Reaping deletes a dead replica's leases, held counts, waiters (with
        their sorted-set members) and grant list. Returns the most live
        replicas seen in any of ``models`` (0 for none).

        Raises:
            StoreSessionLostError: a model this session resynced no longer knows it.
        """
        calls: list[Call] = []
        for model in models:
            args: list[str | int | float] = [
                self._replica,
                self._ttl_ms,
                int(model in self._joined),
            ]
            calls.append((self._scripts["heartbeat"], [model_base(self._prefix, model)], args))
        if not calls:
            return 0
        replies = [int(reply) for reply in await self._run(calls)]
        if min(replies) < 0:
            raise StoreSessionLostError("the store does not know this replica's session")
        return max(replies)

    async def live_replicas(self, models: Sequence[str]) -> set[str]:
        """The ids of the replicas live (by Redis time) in any of ``models``; one round trip."""
        calls = self._per_model("live", models, [])
        if not calls:
            return set()
        replies = await self._run(calls)
        return {str(replica) for reply in replies for replica in reply}

    async def resync(self, limits: ModelLimits, leases: Sequence[Lease]) -> None:
        """After the store came back: make ``leases`` this replica's only state in the model.

        Replaces its leases and held counts, withdraws all its waiters, clears
        its grant list and marks it live. Counters are not charged again.
        """
        args: list[str | int | float] = [self._replica, self._ttl_ms, len(leases)]
        for lease in leases:
            args += [lease.ticket, lease.lane, lease.tenant, float(lease.weight)]
            args += [int(lease.cost_tokens), int(lease.priority)]
            args += [milliseconds(lease.preemptible_in_s), int(lease.borrowed)]
            args.append(int(lease.counted))
        call = (self._scripts["resync"], [model_base(self._prefix, limits.model)], args)
        await self._run([call])
        self._joined.add(limits.model)

    async def next_grants(
        self, models: Sequence[str], block_s: float = 1.0
    ) -> list[tuple[str, str]]:
        """Wait up to ``block_s`` for grants to this replica; ``(model, ticket)`` pairs.

        Blocks on this replica's grant lists of all ``models`` on a connection
        of its own (in a cluster, one per slot: ``store/grant_listener.py``), then
        drains what else is there. Returns ``[]`` when nothing came within ``block_s``.
        """
        if not 0.0 < block_s < math.inf:
            raise ValueError(f"block_s must be positive and finite, got {block_s}")
        grants = self._grants
        if grants is None:
            raise StoreUnavailableError("the store is not connected")
        keys = {grants_key(self._prefix, model, self._replica): model for model in models}
        if not keys:
            return []
        self._grant_models.update(keys)
        budget_s = block_s + BLOCK_LATENESS_S + self._timeout_s
        popped = await self._guarded(grants.pop(list(keys), block_s, budget_s))
        return [(self._grant_models[key], ticket) for key, ticket in popped]

    async def counts(self, limits: ModelLimits) -> ModelCounts:
        """The model's global counts, with running tickets per lane and per tenant and
        waiting tickets per lane (``store/tenant_counts.py``); read-only, O(running tickets)."""
        model = [model_base(self._prefix, limits.model)]
        (reply,) = await self._run([(self._scripts["counts"], model, counts_args(limits))])
        return parse_counts(limits, reply)
