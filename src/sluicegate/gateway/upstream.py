"""The pooled upstream HTTP client (aiohttp), with errors mapped once to gateway errors.

Only the connect timeout is aiohttp's; first-byte and idle timeouts are the
handler's deadlines (``timer.LazyTimer``), because aiohttp's read timeout
cannot tell waiting for a long answer's headers from silence mid-stream.
"""

from __future__ import annotations

import aiohttp

from sluicegate.gateway.errors import GatewayError

IDLE_CONNECTION_S = 4.0
FORWARD_HEADERS = {"Content-Type": "application/json", "Accept-Encoding": "identity"}


class Upstream:
    """One ``aiohttp.ClientSession`` shared by every backend, opened in the app's lifespan."""

    def __init__(self, *, connect_timeout_s: float) -> None:
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout_s, sock_connect=connect_timeout_s
        )
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        """Open the connection pool."""
        # Engines served by uvicorn (vLLM, llama-cpp-python) close idle connections after 5 s;
        # a pool that keeps them longer hands out connections the engine is closing (502s).
        connector = aiohttp.TCPConnector(
            limit=0, ttl_dns_cache=300, keepalive_timeout=IDLE_CONNECTION_S
        )
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self._timeout, auto_decompress=False
        )

    async def close(self) -> None:
        """Close the pool."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The open session; only valid between ``start`` and ``close``."""
        if self._session is None:
            raise RuntimeError("upstream session is not open")
        return self._session

    async def post(
        self, url: str, body: bytes, request_id: str, *, reuse: bool = True
    ) -> aiohttp.ClientResponse:
        """POST ``body`` to ``url``; connection failures become 502, timeouts 504.

        A pooled connection the engine closed just before it was reused fails with
        ``ServerDisconnectedError`` before any answer: that is retried once, on a new
        connection. ``reuse=False`` asks for a connection of its own (llama-cpp-python
        closes connections after some answers, e.g. an empty stream, without saying so).
        """
        headers = {**FORWARD_HEADERS, "X-Request-Id": request_id}
        if not reuse:
            headers["Connection"] = "close"
        try:
            try:
                return await self.session.post(url, data=body, headers=headers)
            except aiohttp.ServerDisconnectedError:
                return await self.session.post(url, data=body, headers=headers)
        except TimeoutError as exc:
            raise GatewayError(
                504, "upstream_timeout", "the engine did not answer in time"
            ) from exc
        except aiohttp.ClientError as exc:
            raise GatewayError(502, "upstream_unavailable", "the engine is unreachable") from exc

    async def read(self, response: aiohttp.ClientResponse) -> bytes:
        """The whole response body, with the same error mapping."""
        try:
            return await response.read()
        except TimeoutError as exc:
            raise GatewayError(504, "upstream_timeout", "the engine stopped answering") from exc
        except aiohttp.ClientError as exc:
            raise GatewayError(502, "upstream_error", "the engine's answer was cut off") from exc
