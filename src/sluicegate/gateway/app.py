"""The gateway's ASGI application and how to serve it."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import socket
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from sluicegate.config import Config, ConfigError
from sluicegate.gateway.batch_lane.lane import BatchLane, batch_routes_off
from sluicegate.gateway.clock import Clock, OffsetClock
from sluicegate.gateway.edge_protocol import ConnectionLimits, uvicorn_protocol_kwargs
from sluicegate.gateway.http_errors import GatewayError, error_response
from sluicegate.gateway.ops.admin import NO_STORE_PREFIXES, AdminBatches, no_store
from sluicegate.gateway.ops.dashboard import Dashboard
from sluicegate.gateway.ops.kv_subscriber import KvSubscribers
from sluicegate.gateway.ops.ops_endpoints import Ops
from sluicegate.gateway.ops.scrape import poll_forever
from sluicegate.gateway.request.handlers import InferenceHandler
from sluicegate.gateway.state import GatewayState
from sluicegate.gateway.streams.endpoint_kind import PATHS


def metrics_key(config: Config, environ: Mapping[str, str] | None = None) -> str | None:
    """The key ``/metrics`` needs (``server.metrics_key_env``), or None when it is open;
    ``ConfigError`` naming the variable when the config names one that is unset or empty."""
    name = config.server.metrics_key_env
    if name is None:
        return None
    key = (os.environ if environ is None else environ).get(name, "")
    if not key:
        raise ConfigError(f"server.metrics_key_env: environment variable {name} is not set")
    return key


def check_servable(config: Config, environ: Mapping[str, str] | None = None) -> None:
    """``ConfigError`` for what a valid config still lacks to be served: a backend for each
    model, backend URLs, an existing directory for ``batches.path``, and the metrics key
    when ``server.metrics_key_env`` names one (read from ``environ``, default
    ``os.environ``)."""
    metrics_key(config, environ)
    for model in config.models:
        if not model.backends:
            raise ConfigError(f"models[{model.name}].backends: the gateway needs at least one")
        for backend in model.backends:
            if not backend.url or not backend.url.startswith(("http://", "https://")):
                raise ConfigError(
                    f"models[{model.name}].backends[{backend.name}].url: "
                    "must be an http:// or https:// URL"
                )
    if config.batches is not None and config.batches.path is not None:
        directory = Path(config.batches.path).parent
        if not directory.is_dir():
            raise ConfigError(
                f"batches.path: directory {directory} does not exist (the gateway creates the "
                "database file, not its directory)"
            )


async def _gateway_error(request: Request, exc: Exception) -> Response:
    """The boundary of every Starlette endpoint: a ``GatewayError`` raised in one becomes
    its OpenAI-shaped answer here."""
    assert isinstance(exc, GatewayError)
    return error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 (no route) and 405 (no such method), in OpenAI's shape."""
    assert isinstance(exc, HTTPException)
    code = "method_not_allowed" if exc.status_code == 405 else "not_found"
    error = GatewayError(exc.status_code, code, str(exc.detail), headers=dict(exc.headers or {}))
    return error_response(error)


EXCEPTION_HANDLERS = {GatewayError: _gateway_error, HTTPException: _http_error}
"""Where errors become HTTP answers, for every endpoint Starlette serves (the inference
endpoints, plain ASGI, send the same bytes themselves)."""


class GatewayApp:
    """The gateway's ASGI app: inference POSTs go straight to their handlers, the rest to
    Starlette (routing and response objects cost ~15% of a request on the hot path)."""

    def __init__(
        self, state: GatewayState, fallback: Starlette, inference: dict[str, InferenceHandler]
    ) -> None:
        self.gateway = state
        self.state = fallback.state
        self._fallback = fallback
        self._inference = inference

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Dispatch one ASGI event."""
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self._inference.get(scope["path"])
            if handler is not None:
                await handler(scope, receive, send)
                return
        if scope["type"] == "http" and scope["path"].startswith(NO_STORE_PREFIXES):
            send = no_store(send)
        await self._fallback(scope, receive, send)


def connection_limits(config: Config) -> ConnectionLimits:
    """The per-connection limits of ``config.server``."""
    server = config.server
    return ConnectionLimits(
        header_timeout_s=server.client_header_timeout_s,
        body_timeout_s=server.client_body_timeout_s,
        max_header_bytes=server.max_header_bytes,
        max_headers=server.max_headers,
        write_buffer_bytes=server.client_write_buffer_bytes,
    )


def build_app(
    config: Config,
    *,
    environ: Mapping[str, str] | None = None,
    scrape: bool = True,
    clock: Clock = time.monotonic,
) -> GatewayApp:
    """The gateway for ``config`` (API keys read from ``environ``, default ``os.environ``).

    ``clock`` is the scheduling clock (``gateway/clock.py``); a test may pass an
    ``OffsetClock`` and advance it. Serve the app with
    ``uvicorn_protocol_kwargs(connection_limits(config))`` so the header, body and
    write-buffer limits hold (``serve`` does).
    """
    check_servable(config, environ)
    state = GatewayState(config, environ, clock=clock)
    ops = Ops(state, metrics_key(config, environ))
    inference = {
        PATHS[endpoint]: InferenceHandler(state, endpoint)
        for endpoint in ("chat", "completions", "embeddings")
    }
    batches = BatchLane.of(state, inference, ops.topology)
    kv_events = KvSubscribers.of(state)
    if batches is not None:
        ops.batch_progress = batches.progress

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await state.upstream.start()
        if state.link is not None:
            await state.link.start(state.driver)
        poller = asyncio.create_task(poll_forever(state)) if scrape else None
        if kv_events is not None:
            kv_events.start()
        pressure = None
        if state.pressure is not None:
            apply = state.driver.set_pressure
            pressure = asyncio.create_task(state.pressure.run(state.upstream.session, apply))
        if isinstance(clock, OffsetClock):
            clock.watch(asyncio.get_running_loop(), state.driver.clock_jumped)
        if batches is not None:
            await batches.start()
        try:
            yield
        finally:
            if batches is not None:
                await batches.stop()
            if isinstance(clock, OffsetClock):
                clock.unwatch(state.driver.clock_jumped)
            for task in (poller, pressure):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            if kv_events is not None:
                await kv_events.stop()
            state.driver.close()
            if state.link is not None:
                await state.link.close()
            await state.upstream.close()

    # Other methods on the inference paths reach Starlette, which answers 405.
    inference_routes = [Route(path, _not_allowed, methods=["POST"]) for path in PATHS.values()]
    routes = [
        *inference_routes,
        Route("/v1/models", ops.models, methods=["GET"]),
        Route("/openapi.json", ops.openapi, methods=["GET"]),
        Route("/healthz", ops.healthz, methods=["GET"]),
        Route("/readyz", ops.readyz, methods=["GET"]),
        Route("/metrics", ops.metrics, methods=["GET"]),
        Route("/admin/state", ops.admin_state, methods=["GET"]),
        Route("/admin/drain", ops.admin_drain, methods=["POST"]),
        Route("/admin/undrain", ops.admin_undrain, methods=["POST"]),
        *AdminBatches(state, None if batches is None else batches.backend).routes(),
        *Dashboard(state).routes(),
        *(batch_routes_off() if batches is None else batches.routes()),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=EXCEPTION_HANDLERS)
    app.state.gateway = state
    app.state.batches = batches
    app.state.kv_events = kv_events
    return GatewayApp(state, app, inference)


async def _not_allowed(request: Request) -> Response:
    raise HTTPException(405)


def serve(
    config: Config,
    *,
    host: str | None = None,
    port: int | None = None,
    sockets: list[socket.socket] | None = None,
    graceful_s: float | None = None,
) -> None:
    """Run the gateway with uvicorn (uvloop, httptools) until interrupted.

    ``sockets``: already bound sockets to serve instead of ``host``/``port`` (a worker
    of ``serve --workers`` serves its ``SO_REUSEPORT`` socket on the shared port and a
    private unix socket). ``graceful_s``: at most this long for requests to finish
    once told to stop (uvicorn's default: no bound).
    """
    app = build_app(config)
    settings = uvicorn.Config(
        app,
        host=host or config.server.host,
        port=port if port is not None else config.server.port,
        loop="uvloop",
        log_level="warning",
        access_log=False,
        # The gateway reads no client address; uvicorn's X-Forwarded-* middleware would
        # wrap every request for nothing.
        proxy_headers=False,
        timeout_keep_alive=30,
        timeout_graceful_shutdown=None if graceful_s is None else max(1, round(graceful_s)),
        **uvicorn_protocol_kwargs(connection_limits(config)),
    )
    settings.load()
    # What start-up built (modules, config, the app) lives as long as the process: moved
    # out of the collector's sight, it no longer makes every full collection walk it.
    # Under load at 300 req/s a full collection paused the loop ~0.1 s every ~30 s;
    # frozen, none ran in 30 s and the time in GC fell to a third.
    gc.collect()
    gc.freeze()
    uvicorn.Server(settings).run(sockets=sockets)
