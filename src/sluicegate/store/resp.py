"""A lean Redis client for the store's hot path: one connection, pipelined RESP2.

redis-py's asyncio client cost the gateway over a quarter of its CPU in distributed
mode (py-spy, issue 18): a ``Pipeline`` object, command packing, a connection pool,
a reader task and several futures per round trip. Here a pipeline is one
``transport.write`` of the packed commands and one future, resolved by
``data_received`` once the last of its replies is parsed.

Errors are redis-py's own exception classes, so callers that caught redis-py's keep
their behaviour: an error reply is a ``ResponseError`` (``NoScriptError`` for
``NOSCRIPT``) in the reply list, as redis-py's ``execute(raise_on_error=False)``;
a deadline passed is ``TimeoutError``; a refused, lost or closed connection is
``ConnectionError``. On a timeout or a loss, every pending pipeline fails and the
connection is dropped; the next call connects again.

The store URL is parsed by :mod:`sluicegate.store.redis_url`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Sequence
from typing import Any, Protocol, cast

from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    InvalidResponse,
    NoScriptError,
    OutOfMemoryError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from sluicegate.errors import SluicegateError
from sluicegate.store.redis_url import parse_redis_url, tls_context

__all__ = ["Pipelined", "RespClient", "RespParser", "encode_commands"]

Arg = str | int | float | bytes
_ERROR_CLASSES: dict[str, type[ResponseError] | type[RedisConnectionError]] = {
    "NOSCRIPT": NoScriptError,
    "OOM": OutOfMemoryError,
    "WRONGPASS": AuthenticationError,
    "NOAUTH": AuthenticationError,
    "LOADING": BusyLoadingError,
}


def _encode_arg(arg: Arg) -> bytes:
    if isinstance(arg, str):
        return arg.encode()
    if isinstance(arg, bytes):
        return arg
    if isinstance(arg, float):
        return repr(arg).encode()  # as redis-py encodes floats
    return b"%d" % arg


def encode_commands(commands: Sequence[Sequence[Arg]]) -> bytes:
    """The RESP encoding of ``commands``, one array of bulk strings each."""
    parts: list[bytes] = []
    for command in commands:
        parts.append(b"*%d\r\n" % len(command))
        for arg in command:
            data = _encode_arg(arg)
            parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def error_reply(message: str) -> ResponseError | RedisConnectionError:
    """The redis-py exception for an error reply (``NOSCRIPT`` → ``NoScriptError``)."""
    code, _, rest = message.partition(" ")
    kind = _ERROR_CLASSES.get(code)
    return ResponseError(message) if kind is None else kind(rest)


class _IncompleteError(SluicegateError):
    """The buffer ends inside a reply: wait for more bytes."""


def _parse(buf: bytes, pos: int) -> tuple[Any, int]:
    """One reply at ``buf[pos:]`` and where the next starts; ``_IncompleteError`` if cut short."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise _IncompleteError
    kind = buf[pos]
    if kind == 36:  # $ bulk string
        size = int(buf[pos + 1 : end])
        if size < 0:
            return None, end + 2
        stop = end + 2 + size
        if len(buf) < stop + 2:
            raise _IncompleteError
        return buf[end + 2 : stop].decode("utf-8", "surrogateescape"), stop + 2
    if kind == 42:  # * array
        count = int(buf[pos + 1 : end])
        if count < 0:
            return None, end + 2
        items = []
        pos = end + 2
        for _ in range(count):
            item, pos = _parse(buf, pos)
            items.append(item)
        return items, pos
    if kind == 58:  # : integer
        return int(buf[pos + 1 : end]), end + 2
    if kind == 43:  # + simple string
        return buf[pos + 1 : end].decode("utf-8", "surrogateescape"), end + 2
    if kind == 45:  # - error
        return error_reply(buf[pos + 1 : end].decode("utf-8", "replace")), end + 2
    raise InvalidResponse(f"not a RESP2 reply: type byte {kind!r}")


class RespParser:
    """Splits a byte stream into RESP2 replies, whatever the reads' boundaries.

    Bulk strings and simple strings are ``str``, integers ``int``, nulls ``None``,
    arrays ``list``, error replies exception objects (see ``error_reply``).
    """

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, data: bytes) -> list[Any]:
        """The replies completed by ``data``, in order (``InvalidResponse`` on garbage)."""
        buf = self._rest + data if self._rest else data
        replies = []
        pos = 0
        size = len(buf)
        try:
            while pos < size:
                reply, pos = _parse(buf, pos)
                replies.append(reply)
        except _IncompleteError:
            pass
        except ValueError:
            raise InvalidResponse("malformed RESP2 length or integer") from None
        self._rest = buf[pos:] if pos < size else b""
        return replies


class _Pending:
    """A pipeline in flight: the future of its replies and how many are due."""

    __slots__ = ("due", "future", "replies")

    def __init__(self, future: asyncio.Future[list[Any]], due: int) -> None:
        self.future = future
        self.due = due
        self.replies: list[Any] = []


class _RespProtocol(asyncio.Protocol):
    """One connection: writes pipelines, matches replies to them in order."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.unreported = False
        self._parser = RespParser()
        self._pending: deque[_Pending] = deque()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        # Lost while nothing waited (Redis restarted, say): nobody has heard of it yet.
        self.unreported = not self.closed and not self._pending
        self.fail(
            RedisConnectionError(f"connection to redis lost: {exc or 'closed by the server'}")
        )

    def data_received(self, data: bytes) -> None:
        try:
            replies = self._parser.feed(data)
        except InvalidResponse as error:
            self.fail(error)
            return
        pending = self._pending
        for reply in replies:
            if not pending:
                self.fail(InvalidResponse("redis answered more than it was asked"))
                return
            head = pending[0]
            head.replies.append(reply)
            if len(head.replies) == head.due:
                pending.popleft()
                if not head.future.done():  # its caller may have been cancelled
                    head.future.set_result(head.replies)

    def send(self, payload: bytes, due: int) -> asyncio.Future[list[Any]]:
        """Write one pipeline of ``due`` commands; the future of its replies."""
        if self.closed or self.transport is None:
            raise RedisConnectionError("the connection to redis is closed")
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(future, due))
        self.transport.write(payload)
        return future

    def expire(self, future: asyncio.Future[list[Any]]) -> None:
        """A pipeline's deadline passed: if unanswered, drop the connection."""
        if not future.done():
            self.fail(RedisTimeoutError("redis did not answer in time"))

    def fail(self, error: Exception) -> None:
        """Fail every pending pipeline with ``error`` and close the connection."""
        self.closed = True
        pending, self._pending = self._pending, deque()
        for entry in pending:
            if not entry.future.done():
                # An exception object of its own per waiter: raising one in several
                # tasks would chain their tracebacks together.
                entry.future.set_exception(type(error)(*error.args))
        if self.transport is not None:
            self.transport.abort()


class Pipelined(Protocol):
    """What the store runs its commands on: ``RespClient`` (one Redis) or
    ``ClusterClient`` (``store/cluster_client.py``, the masters of a Redis Cluster)."""

    async def execute(self, commands: Sequence[Sequence[Arg]], deadline: float) -> list[Any]:
        """``commands``' replies in order, error replies as exception objects (see
        ``RespClient.execute``)."""
        ...

    def close(self) -> None:
        """Drop the connections (pending calls fail); idempotent."""
        ...


class RespClient:
    """One pipelined connection to Redis, opened on the first call and after any failure."""

    def __init__(self, url: str, *, connect_timeout_s: float) -> None:
        self.address = parse_redis_url(url)
        self._tls = None if self.address.tls is None else tls_context(self.address.tls)
        self._connect_timeout_s = connect_timeout_s
        self._protocol: _RespProtocol | None = None
        self._connecting: asyncio.Task[_RespProtocol] | None = None
        self._closes = 0  # a connection opened across a ``close`` is not kept

    async def execute(self, commands: Sequence[Sequence[Arg]], deadline: float) -> list[Any]:
        """Send ``commands`` in one write; their replies in order, error replies as
        exception objects. ``deadline`` is on the event loop's clock (``loop.time()``).

        Raises:
            TimeoutError: (redis-py's) no complete answer by ``deadline``.
            ConnectionError: (redis-py's) the connection failed or was lost.
        """
        if not commands:
            return []
        protocol = self._protocol
        if protocol is not None and protocol.unreported:
            # The next call after a silent loss fails, as redis-py's did (no retries):
            # a Redis that restarted lost this replica's state, and the store's
            # lifecycle must hear of it (fallback, then resync) rather than carry on.
            self._protocol = None
            raise RedisConnectionError("the connection to redis was lost")
        if protocol is None or protocol.closed:
            protocol = await self._connection(deadline)
        return await self._write(protocol, commands, deadline)

    def submit(self, commands: Sequence[Sequence[Arg]], deadline: float) -> Awaitable[list[Any]]:
        """``execute``, with ``commands`` written at once if the connection is open: the
        pipelines of several clients then run together without a task each
        (``ClusterClient``)."""
        protocol = self._protocol
        if commands and protocol is not None and not (protocol.closed or protocol.unreported):
            return self._write(protocol, commands, deadline)
        return self.execute(commands, deadline)

    @staticmethod
    def _write(
        protocol: _RespProtocol, commands: Sequence[Sequence[Arg]], deadline: float
    ) -> asyncio.Future[list[Any]]:
        future = protocol.send(encode_commands(commands), len(commands))
        timer = asyncio.get_running_loop().call_at(deadline, protocol.expire, future)
        future.add_done_callback(lambda _: timer.cancel())
        return future

    async def _connection(self, deadline: float) -> _RespProtocol:
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._open())
            closes = self._closes
            self._connecting.add_done_callback(lambda task: self._opened(task, closes))
        try:
            async with asyncio.timeout_at(deadline):
                return await asyncio.shield(self._connecting)
        except TimeoutError:
            raise RedisTimeoutError("redis did not accept the connection in time") from None

    def _opened(self, task: asyncio.Task[_RespProtocol], closes: int) -> None:
        if self._connecting is task:
            self._connecting = None
        if task.cancelled() or task.exception() is not None:
            return  # (the exception is retrieved: no "never retrieved" warning)
        if closes == self._closes:
            self._protocol = task.result()
        else:
            task.result().fail(RedisConnectionError("the redis client was closed"))

    async def _open(self) -> _RespProtocol:
        address, loop = self.address, asyncio.get_running_loop()
        protocol = opened = None
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                if address.path is not None:
                    _, protocol = await loop.create_unix_connection(_RespProtocol, address.path)
                else:
                    _, protocol = await loop.create_connection(
                        _RespProtocol, address.host, address.port, ssl=self._tls
                    )
                await self._log_in(protocol)
                opened = protocol
                return protocol
        except TimeoutError:
            raise RedisTimeoutError("redis did not accept the connection in time") from None
        except (OSError, EOFError) as error:
            raise RedisConnectionError(f"cannot connect to redis: {error}") from error
        finally:
            if protocol is not None and opened is None:  # failed or cancelled while logging in
                protocol.fail(RedisConnectionError("the connection to redis failed to open"))

    async def _log_in(self, protocol: _RespProtocol) -> None:
        """AUTH and SELECT as the URL asks; an error reply fails the connection."""
        address = self.address
        login: list[list[Arg]] = []
        if address.password is not None:
            user = [address.username] if address.username else []
            login.append(["AUTH", *user, address.password])
        if address.db:
            login.append(["SELECT", address.db])
        if login:
            for reply in await protocol.send(encode_commands(login), len(login)):
                if isinstance(reply, Exception):
                    raise reply

    def close(self) -> None:
        """Drop the connection (pending calls fail with ``ConnectionError``); idempotent."""
        self._closes += 1
        connecting, self._connecting = self._connecting, None
        if connecting is not None:
            connecting.cancel()
        protocol, self._protocol = self._protocol, None
        if protocol is not None and not protocol.closed:
            with contextlib.suppress(RuntimeError):  # the loop may already be closed
                protocol.fail(RedisConnectionError("the redis client was closed"))
