"""The gateway's ASGI application and how to serve it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sluicegate.config import Config, ConfigError
from sluicegate.gateway.errors import error_response
from sluicegate.gateway.handlers import InferenceHandler
from sluicegate.gateway.ops import Ops
from sluicegate.gateway.scrape import poll_forever
from sluicegate.gateway.state import GatewayState


def _check_servable(config: Config) -> None:
    for model in config.models:
        if not model.backends:
            raise ConfigError(f"models[{model.name}].backends: the gateway needs at least one")
        for backend in model.backends:
            if not backend.url or not backend.url.startswith(("http://", "https://")):
                raise ConfigError(
                    f"models[{model.name}].backends[{backend.name}].url: "
                    "must be an http:// or https:// URL"
                )


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = "method_not_allowed" if exc.status_code == 405 else "not_found"
    return error_response(exc.status_code, code, str(exc.detail))


def build_app(
    config: Config, *, environ: Mapping[str, str] | None = None, scrape: bool = True
) -> Starlette:
    """The gateway for ``config`` (API keys read from ``environ``, default ``os.environ``)."""
    _check_servable(config)
    state = GatewayState(config, environ)
    ops = Ops(state)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await state.upstream.start()
        poller = asyncio.create_task(poll_forever(state)) if scrape else None
        try:
            yield
        finally:
            if poller is not None:
                poller.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await poller
            state.driver.close()
            await state.upstream.close()

    routes = [
        Route("/v1/chat/completions", InferenceHandler(state, "chat").handle, methods=["POST"]),
        Route("/v1/completions", InferenceHandler(state, "completions").handle, methods=["POST"]),
        Route("/v1/embeddings", InferenceHandler(state, "embeddings").handle, methods=["POST"]),
        Route("/v1/models", ops.models, methods=["GET"]),
        Route("/healthz", ops.healthz, methods=["GET"]),
        Route("/readyz", ops.readyz, methods=["GET"]),
        Route("/metrics", ops.metrics, methods=["GET"]),
        Route("/admin/state", ops.admin_state, methods=["GET"]),
        Route("/admin/drain", ops.admin_drain, methods=["POST"]),
    ]
    app = Starlette(
        routes=routes, lifespan=lifespan, exception_handlers={HTTPException: _http_error}
    )
    app.state.gateway = state
    return app


def serve(config: Config, *, host: str | None = None, port: int | None = None) -> None:
    """Run the gateway with uvicorn (uvloop, httptools) until interrupted."""
    app = build_app(config)
    uvicorn.run(
        app,
        host=host or config.server.host,
        port=port if port is not None else config.server.port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
        timeout_keep_alive=30,
    )
