"""``ClusterClient``: the store's pipelines on a Redis Cluster (or Valkey cluster), each
split by the master that serves its keys' slots.

Every key of one model shares a hash tag, and so does every key of one tenant's buckets
(``store/keys.py``), and each limit script builds the keys it touches from the one it
declares: a script call lands in one slot, and that slot's master runs it (Redis ≥ 7
refuses a script with a flags line that touches a key of another slot). A ``sync``
carries calls of several models, which may live on different masters: the client groups
the calls of a pipeline by master, writes one pipeline to each (a ``RespClient`` per
node: still one write and one future per node), waits for all of them at once and
returns the replies in the order of the calls. A command without a key (``PING``,
``SCRIPT LOAD``) goes to every master: a script is loaded on each, and a ping answers
only if every master does.

The slot map comes from ``CLUSTER SLOTS``, asked of every known node at once (the first
answer wins): when the client starts, and on the call after a connection error, a
timeout, ``CLUSTERDOWN``, ``TRYAGAIN`` or a redirection. A ``MOVED`` reply (the slot has
a new master: a failover or a resharding ended) moves that slot and sends the command
again there, within the same deadline. An ``ASK`` reply (the slot is being migrated) is
not followed: the slot's keys are then split between two nodes, and a script on the
importing node would see only part of a model's state, so the call fails (the replica
falls back until the slot has moved). The nodes a cluster announced are remembered per
seed URL for the life of the process, so that a store opened after the seed node died
(the link's probe opens a new one) still finds the cluster.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any

from redis.crc import key_slot
from redis.exceptions import ClusterDownError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

from sluicegate.store.redis_url import check_cluster_url, node_url, parse_redis_url
from sluicegate.store.resp import Arg, RespClient

__all__ = ["ClusterClient"]

_SLOTS = 16384
_MAX_MOVES = 2
"""How many ``MOVED`` replies one command follows in one call."""
_TO_EVERY_MASTER = frozenset({"PING", "SCRIPT"})
_RELOAD_ON = ("CLUSTERDOWN", "TRYAGAIN", "ASK ")
_UNSET: Any = object()
_learned: dict[str, tuple[str, ...]] = {}
"""The nodes (``host:port``) each seed URL's cluster announced last."""

Entry = tuple[int, Sequence[Arg]]
"""A command of a pipeline, with its index there."""


def _key(command: Sequence[Arg]) -> str | None:
    """The key a command is routed by (a script's first declared key, else the first
    argument); None for a command every master gets (``PING``, ``SCRIPT``, no argument).

    Raises:
        ValueError: a script call that declares no key (it could run on any master).
    """
    name = str(command[0]).upper()
    if name in _TO_EVERY_MASTER or len(command) < 2:
        return None
    if name in ("EVALSHA", "EVAL"):
        if int(command[2]) < 1:
            raise ValueError("in a Redis Cluster a script call must declare its key")
        return str(command[3])
    return str(command[1])


def _moved(reply: object) -> tuple[int, str] | None:
    """The slot and its new master's ``host:port`` if ``reply`` is a ``MOVED`` error."""
    if isinstance(reply, ResponseError):
        parts = str(reply).split()
        if len(parts) == 3 and parts[0] == "MOVED":
            return int(parts[1]), parts[2]
    return None


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # an ask that lost the race: its error is of no interest


class ClusterClient:
    """Pipelines to the masters of a Redis Cluster, by slot (see the module docstring);
    the same calls as ``RespClient``, and the ``Router`` of the grant listener."""

    def __init__(self, url: str, *, connect_timeout_s: float) -> None:
        check_cluster_url(url)
        seed = parse_redis_url(url)
        self._url = url
        self._seed = f"{seed.host}:{seed.port}"
        self._connect_timeout_s = connect_timeout_s
        self._nodes: dict[str, RespClient] = {}
        self._slots: list[str] = []  # slot → its master's host:port ("" if none); [] unknown
        self._masters: tuple[str, ...] = ()
        self._reload = True

    def _node(self, name: str) -> RespClient:
        client = self._nodes.get(name)
        if client is None:
            host, _, port = name.rpartition(":")
            url = node_url(self._url, host.strip("[]"), int(port))
            client = self._nodes[name] = RespClient(url, connect_timeout_s=self._connect_timeout_s)
        return client

    async def _slot_map(self, deadline: float) -> list[str]:
        if self._reload or not self._slots:
            await self._load_slots(deadline)
        return self._slots

    async def _load_slots(self, deadline: float) -> None:
        """Ask every known node for the slot map at once; keep the first answer."""
        known = dict.fromkeys([*self._masters, self._seed, *_learned.get(self._url, ())])
        loop = asyncio.get_running_loop()
        asks = [loop.create_task(self._ask_slots(name, deadline)) for name in known]
        for ask in asks:
            ask.add_done_callback(_retrieve)
        last: BaseException | None = None
        try:
            for answer in asyncio.as_completed(asks):
                try:
                    self._use(*await answer)
                    return
                except (RedisError, OSError, EOFError, TimeoutError) as error:
                    last = error
        finally:
            for ask in asks:
                ask.cancel()
        raise RedisConnectionError(f"no node of the cluster answered CLUSTER SLOTS: {last}")

    async def _ask_slots(self, name: str, deadline: float) -> tuple[list[Any], str]:
        (reply,) = await self._node(name).execute([["CLUSTER", "SLOTS"]], deadline)
        if isinstance(reply, Exception):
            raise reply
        if not reply:
            raise ClusterDownError(f"{name} serves no slot map (not in a cluster yet?)")
        return reply, name.rpartition(":")[0]

    def _use(self, rows: list[Any], asked_host: str) -> None:
        slots = [""] * _SLOTS
        masters: list[str] = []
        nodes: list[str] = []
        for start, end, *serving in rows:
            # An empty or "?" endpoint: unknown to the node; reach it where the map came from.
            names = [
                f"{asked_host if node[0] in ('', '?') else node[0]}:{node[1]}" for node in serving
            ]
            first, last = int(start), int(end)
            slots[first : last + 1] = [names[0]] * (last - first + 1)
            masters.append(names[0])
            nodes += names
        self._slots, self._masters, self._reload = slots, tuple(dict.fromkeys(masters)), False
        _learned[self._url] = tuple(dict.fromkeys(nodes))
        for gone in set(self._nodes) - set(nodes) - {self._seed}:
            self._nodes.pop(gone).close()

    def _plan(self, entries: Sequence[Entry]) -> dict[str, list[Entry]]:
        """The commands by the node each goes to ("": a slot no master serves)."""
        plan: dict[str, list[Entry]] = {}
        for entry in entries:
            key = _key(entry[1])
            names = self._masters if key is None else (self._slots[key_slot(key.encode())],)
            for name in names:
                plan.setdefault(name, []).append(entry)
        return plan

    async def execute(self, commands: Sequence[Sequence[Arg]], deadline: float) -> list[Any]:
        """Send ``commands`` to the masters that serve their keys, one pipeline per master,
        all at once; their replies in order, error replies as exception objects (a command
        sent to every master: its first error, else the first master's reply).
        ``deadline`` is on the event loop's clock.

        Raises:
            TimeoutError: (redis-py's) a master did not answer by ``deadline``.
            ConnectionError: (redis-py's) a connection failed, or no node gave a slot map.
        """
        if not commands:
            return []
        await self._slot_map(deadline)
        replies: list[Any] = [_UNSET] * len(commands)
        plan = self._plan(list(enumerate(commands)))
        for _ in range(_MAX_MOVES + 1):
            moved = await self._send(plan, replies, deadline)
            if not moved:
                break
            for index, _command in moved:
                replies[index] = _UNSET
            plan = self._plan(moved)
        return replies

    async def _send(
        self, plan: dict[str, list[Entry]], replies: list[Any], deadline: float
    ) -> list[Entry]:
        """Run ``plan``, write the replies into ``replies``; the commands ``MOVED`` elsewhere."""
        names = list(plan)
        results: list[list[Any] | BaseException]
        if len(names) == 1:
            try:
                results = [await self._on(names[0], plan[names[0]], deadline)]
            except Exception:
                self._reload = True
                raise
        else:
            # Written at once, awaited together (futures: no task per master).
            calls = [self._on_now(name, plan[name], deadline) for name in names]
            results = await asyncio.gather(*calls, return_exceptions=True)
        moved: list[Entry] = []
        for name, result in zip(names, results, strict=True):
            if isinstance(result, BaseException):
                self._reload = True
                raise result
            for entry, reply in zip(plan[name], result, strict=True):
                index = entry[0]
                if replies[index] is _UNSET or (
                    isinstance(reply, Exception) and not isinstance(replies[index], Exception)
                ):
                    replies[index] = reply
                if (redirect := _moved(reply)) is not None:
                    slot, master = redirect
                    self._slots[slot] = master
                    self._reload = True
                    moved.append(entry)
                elif isinstance(reply, ResponseError) and str(reply).startswith(_RELOAD_ON):
                    self._reload = True
        return moved

    async def _on(self, name: str, entries: list[Entry], deadline: float) -> list[Any]:
        if not name:
            self._reload = True
            return [ClusterDownError("CLUSTERDOWN Hash slot not served")] * len(entries)
        return await self._node(name).execute([command for _, command in entries], deadline)

    def _on_now(self, name: str, entries: list[Entry], deadline: float) -> Awaitable[list[Any]]:
        if not name:
            return self._on(name, entries, deadline)
        return self._node(name).submit([command for _, command in entries], deadline)

    async def route(self, keys: Sequence[str], deadline: float) -> list[tuple[str, list[str]]]:
        """``keys`` grouped by slot (a blocking pop may wait on one slot's keys only), each
        group with the URL of the master that serves it."""
        slots = await self._slot_map(deadline)
        groups: dict[int, list[str]] = {}
        for key in keys:
            groups.setdefault(key_slot(key.encode()), []).append(key)
        routed = []
        for slot, group in groups.items():
            name = slots[slot]
            if not name:
                self._reload = True
                raise ClusterDownError(f"CLUSTERDOWN no master serves slot {slot}")
            host, _, port = name.rpartition(":")
            routed.append((node_url(self._url, host.strip("[]"), int(port)), group))
        return routed

    def redirected(self, reply: object) -> bool:
        """Whether ``reply`` ends a blocking pop because its slot moved: ``MOVED`` (the slot
        is moved in the map) or ``UNBLOCKED`` (the master became a replica); the next
        ``route`` reloads the map."""
        redirect = _moved(reply)
        if redirect is not None and self._slots:
            self._slots[redirect[0]] = redirect[1]
        elif not (isinstance(reply, ResponseError) and str(reply).startswith("UNBLOCKED")):
            return False
        self._reload = True
        return True

    def close(self) -> None:
        """Drop every node's connection (pending calls fail); idempotent."""
        nodes, self._nodes = self._nodes, {}
        for client in nodes.values():
            client.close()
