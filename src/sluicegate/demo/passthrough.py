"""A minimal round-robin pass-through proxy: what most teams put in front of engines.

No queue, no admission control, no priorities: each request goes to the next
backend and the engine's own FCFS queue does the rest. The demo uses it as the
baseline; the overhead benchmark uses it as the floor for a Python proxy.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "host"}


def build_passthrough(backends: Sequence[str]) -> web.Application:
    """An aiohttp app relaying ``/v1/*`` POSTs round-robin to ``backends`` (base URLs)."""
    if not backends:
        raise ValueError("the pass-through needs at least one backend")
    cycle = itertools.cycle([url.rstrip("/") for url in backends])
    app = web.Application(client_max_size=64 * 1024 * 1024)
    session_key = web.AppKey("session", ClientSession)

    async def open_session(app: web.Application) -> None:
        app[session_key] = ClientSession(
            connector=TCPConnector(limit=0), timeout=ClientTimeout(total=None)
        )

    async def close_session(app: web.Application) -> None:
        await app[session_key].close()

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        upstream = await app[session_key].post(
            next(cycle) + request.path, data=body, headers={"Content-Type": "application/json"}
        )
        response = web.StreamResponse(
            status=upstream.status,
            headers={k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS},
        )
        await response.prepare(request)
        try:
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
        finally:
            upstream.close()
        await response.write_eof()
        return response

    app.on_startup.append(open_session)
    app.on_cleanup.append(close_session)

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.router.add_post("/v1/{tail:.*}", relay)
    app.router.add_get("/health", health)
    return app


def serve_passthrough(backends: Sequence[str], host: str, port: int) -> None:
    """Run the pass-through until interrupted."""
    web.run_app(build_passthrough(backends), host=host, port=port, print=None, access_log=None)
