"""``GrantListener``: the long poll of this replica's grant lists (``RedisStore.next_grants``).

Other replicas' syncs push the tickets they grant to this replica onto its grant list of
each model (``keys.grants_key``). The listener waits on those lists with ``BLPOP`` on
connections of its own (a blocking pop holds its connection), then drains what else is
there with ``LPOP`` on the same connection, so a model's grants come back in the order
they were pushed. On one Redis, one pop waits on every model's list. In a Redis Cluster
a blocking pop may name the keys of one slot only, so there is one pop per slot (per
model, in practice: ``ClusterClient.route``), each on a connection to that slot's
master; a call returns as soon as one of them has popped, and the others stay in flight:
what they pop later is returned by the next call (nothing popped is dropped while the
listener lives; a call cancelled, or ``close``, drops the connections, so that Redis
unblocks the pops).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from redis.exceptions import TimeoutError as RedisTimeoutError

from sluicegate.store.resp import RespClient

__all__ = ["GrantListener", "OneNode", "Router"]

_DRAIN_MAX = 1000
"""Most grants one ``LPOP`` takes from one list after the blocking pop."""
_Group = tuple[str, tuple[str, ...]]
"""A blocking pop: the URL of the node it waits on and the keys it names."""


class Router(Protocol):
    """Where the grant lists are: ``OneNode`` or ``ClusterClient``."""

    async def route(self, keys: Sequence[str], deadline: float) -> list[tuple[str, list[str]]]:
        """``keys`` in groups that one blocking pop may name, each with its node's URL."""
        ...

    def redirected(self, reply: object) -> bool:
        """Whether an error reply says the keys moved (the next ``route`` knows where)."""
        ...


class OneNode:
    """The ``Router`` of one Redis: every list on the server of the store URL."""

    def __init__(self, url: str) -> None:
        self._url = url

    async def route(self, keys: Sequence[str], deadline: float) -> list[tuple[str, list[str]]]:
        """All of ``keys`` in one group."""
        return [(self._url, list(keys))]

    def redirected(self, reply: object) -> bool:
        """Never: one Redis does not redirect."""
        return False


class GrantListener:
    """Blocking pops of grant lists, one per ``Router`` group (see the module docstring)."""

    def __init__(self, router: Router, *, connect_timeout_s: float) -> None:
        self._router = router
        self._connect_timeout_s = connect_timeout_s
        self._clients: dict[_Group, RespClient] = {}
        self._pops: dict[_Group, asyncio.Task[list[tuple[str, str]]]] = {}

    async def pop(
        self, keys: Sequence[str], block_s: float, budget_s: float
    ) -> list[tuple[str, str]]:
        """Wait up to ``block_s`` for items on ``keys``; ``(key, item)`` pairs, in push order
        per key, ``[]`` if none came. Pops still in flight from an earlier call count too.

        Raises:
            TimeoutError: (redis-py's) no answer within ``budget_s``.
            ConnectionError: (redis-py's) a connection failed.
            ResponseError: Redis refused a pop (other than a redirection).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget_s
        groups = [(url, tuple(group)) for url, group in await self._router.route(keys, deadline)]
        for group in groups:
            if group not in self._pops:
                self._pops[group] = loop.create_task(self._pop(group, block_s, deadline))
        if not any(task.done() for task in self._pops.values()):
            # Every pop ends by its deadline; this wait's own bound is a backstop.
            wait_s = max(0.0, deadline - loop.time()) + self._connect_timeout_s
            try:
                await asyncio.wait(
                    self._pops.values(), timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
                )
            except asyncio.CancelledError:
                # Nobody listens any more: drop the connections, so that Redis unblocks the
                # pops rather than hand a grant to a reply nobody reads.
                self._abort()
                raise
        popped = self._collect()
        for group in set(self._clients) - set(groups) - set(self._pops):
            self._clients.pop(group).close()
        return popped

    def _collect(self) -> list[tuple[str, str]]:
        """What the finished pops returned; the first error of theirs is raised."""
        done = [group for group, task in self._pops.items() if task.done()]
        if not done:
            raise RedisTimeoutError("redis did not answer the blocking pop in time")
        popped: list[tuple[str, str]] = []
        error: BaseException | None = None
        for group in done:
            task = self._pops.pop(group)
            failure = task.exception()
            if failure is None:
                popped += task.result()
            elif error is None:
                error = failure
        if error is not None:
            raise error
        return popped

    async def _pop(self, group: _Group, block_s: float, deadline: float) -> list[tuple[str, str]]:
        client = self._clients.get(group)
        if client is None:
            client = RespClient(group[0], connect_timeout_s=self._connect_timeout_s)
            self._clients[group] = client
        keys = group[1]
        (reply,) = await client.execute([["BLPOP", *keys, block_s]], deadline)
        if reply is None or (isinstance(reply, Exception) and self._router.redirected(reply)):
            return []
        if isinstance(reply, Exception):
            raise reply
        popped = [(str(reply[0]), str(reply[1]))]
        drained = await client.execute([["LPOP", key, _DRAIN_MAX] for key in keys], deadline)
        for key, items in zip(keys, drained, strict=True):
            if isinstance(items, Exception):
                raise items
            popped += [(key, str(item)) for item in items or ()]
        return popped

    def _abort(self) -> list[asyncio.Task[list[tuple[str, str]]]]:
        pops, self._pops = list(self._pops.values()), {}
        for task in pops:
            task.cancel()
        clients, self._clients = self._clients, {}
        for client in clients.values():
            client.close()
        return pops

    async def close(self) -> None:
        """Stop the pops in flight (what they would pop stays in Redis, unless Redis already
        sent it) and close the connections; idempotent."""
        await asyncio.gather(*self._abort(), return_exceptions=True)
