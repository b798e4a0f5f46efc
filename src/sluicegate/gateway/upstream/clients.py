"""The upstream clients, with errors mapped once to gateway errors.

Inference requests go through ``http1.Http1Pool`` (the hot path); health probes and
metric scrapes, a few per backend per second, through one ``aiohttp.ClientSession``.
Only the connect timeout is the client's; first-byte and idle timeouts are the
handler's deadlines (``timer.LazyTimer``), because a read timeout cannot tell
waiting for a long answer's headers from silence mid-stream.
"""

from __future__ import annotations

import aiohttp

from sluicegate.config import ServerSpec
from sluicegate.gateway.http_errors import GatewayError
from sluicegate.gateway.timer import LazyTimer
from sluicegate.gateway.upstream.http1 import (
    ConnectRefusedError,
    Http1Pool,
    Http1Response,
    UpstreamError,
    UpstreamLimits,
    UpstreamProtocolError,
)

# Engines served by uvicorn (vLLM, llama-cpp-python) close idle connections after 5 s;
# a pool that keeps them longer hands out connections the engine is closing (502s).
IDLE_CONNECTION_S = 4.0
_HEAD = b"Content-Type: application/json\r\nAccept-Encoding: identity\r\nX-Request-Id: "


class NotReachedError(GatewayError):
    """The engine refused the connection: nothing was sent, so the request may be routed
    to another backend; answered 502 ``upstream_unavailable`` where it is not."""

    def __init__(self) -> None:
        super().__init__(502, "upstream_unavailable", "the engine is unreachable")


class Upstream:
    """The connection pools every backend shares, opened in the app's lifespan."""

    def __init__(self, *, connect_timeout_s: float, limits: UpstreamLimits | None = None) -> None:
        self._connect_timeout_s = connect_timeout_s
        self.limits = limits or UpstreamLimits()
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout_s, sock_connect=connect_timeout_s
        )
        self._session: aiohttp.ClientSession | None = None
        self._pool: Http1Pool | None = None

    async def start(self) -> None:
        """Open the connection pools."""
        connector = aiohttp.TCPConnector(
            limit=0, ttl_dns_cache=300, keepalive_timeout=IDLE_CONNECTION_S
        )
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self._timeout, auto_decompress=False
        )
        self._pool = Http1Pool(
            connect_timeout_s=self._connect_timeout_s, idle_s=IDLE_CONNECTION_S, limits=self.limits
        )

    async def close(self) -> None:
        """Close the pools."""
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The probes' and scrapes' session; only valid between ``start`` and ``close``."""
        if self._session is None:
            raise RuntimeError("upstream session is not open")
        return self._session

    async def post(
        self, url: str, body: bytes, request_id: str, *, reuse: bool = True
    ) -> Http1Response:
        """POST ``body`` to ``url``; connection failures become 502 (``NotReachedError``
        when nothing was sent), timeouts 504.

        A pooled connection the engine closed just before it was reused is retried
        once, on a new connection. ``reuse=False`` asks for a connection of its own
        (llama-cpp-python closes connections after some answers, e.g. an empty stream,
        without saying so).
        """
        if self._pool is None:
            raise RuntimeError("upstream pool is not open")
        head = b"%s%s\r\nContent-Length: %d\r\n%s\r\n" % (
            _HEAD,
            request_id.encode("latin-1"),
            len(body),
            b"" if reuse else b"Connection: close\r\n",
        )
        try:
            return await self._pool.post(url, head, body, reuse=reuse, request_id=request_id)
        except TimeoutError as exc:
            raise GatewayError(
                504, "upstream_timeout", "the engine did not answer in time"
            ) from exc
        except ConnectRefusedError as exc:
            raise NotReachedError from exc
        except UpstreamProtocolError as exc:
            raise protocol_error(exc) from exc
        except UpstreamError as exc:
            raise GatewayError(502, "upstream_unavailable", "the engine is unreachable") from exc

    async def read(
        self, response: Http1Response, idle: LazyTimer | None = None, idle_s: float = 0.0
    ) -> bytes:
        """The whole response body, at most ``max_upstream_body_bytes``, with the same error
        mapping; ``idle`` (a deadline) is moved ``idle_s`` on with every read."""
        response.limit_body(self.limits.body_bytes)
        parts: list[bytes] = []

        def piece(data: bytes) -> bool:
            parts.append(data)
            if idle is not None:
                idle.after(idle_s)
            return False

        try:
            await response.consume(piece)
        except UpstreamError as exc:
            raise answer_error(exc) from exc
        return parts[0] if len(parts) == 1 else b"".join(parts)


def upstream_limits(server: ServerSpec) -> UpstreamLimits:
    """The caps on engine answers that ``server`` sets."""
    return UpstreamLimits(
        head_bytes=server.max_upstream_head_bytes,
        headers=server.max_upstream_headers,
        body_bytes=server.max_upstream_body_bytes,
    )


def protocol_error(exc: UpstreamProtocolError) -> GatewayError:
    """The 502 for an answer over a cap or not HTTP: its code names which."""
    return GatewayError(502, exc.code, str(exc))


def answer_error(exc: UpstreamError) -> GatewayError:
    """The 502 for an answer that failed while its body was read."""
    if isinstance(exc, UpstreamProtocolError):
        return protocol_error(exc)
    return GatewayError(502, "upstream_error", "the engine's answer was cut off")
