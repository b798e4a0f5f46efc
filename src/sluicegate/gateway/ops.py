"""Operations endpoints: health, readiness, metrics, models, OpenAPI, admin state and drain."""

from __future__ import annotations

import functools
import importlib.resources
import time

import orjson
import yaml
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import Response

from sluicegate.gateway.auth import request_token
from sluicegate.gateway.errors import GatewayError, error_response
from sluicegate.gateway.state import GatewayState


def _json(data: object, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


@functools.cache
def openapi_document() -> bytes:
    """The gateway's OpenAPI 3.1 document (``openapi.yaml`` beside this module) as JSON."""
    text = importlib.resources.files(__package__).joinpath("openapi.yaml").read_text("utf-8")
    return orjson.dumps(yaml.safe_load(text))


class Ops:
    """Handlers for the non-inference endpoints of one gateway."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state
        self._created = int(time.time())
        openapi_document()  # parsed once, at start-up: a broken document fails here

    async def healthz(self, request: Request) -> Response:
        """The process is up."""
        return _json({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        """Ready: config loaded, not draining, and at least one healthy backend."""
        state = self.state
        if state.scheduler.draining:
            return _json({"status": "draining"}, 503)
        now = state.driver.now()
        healthy = any(
            backend.healthy
            for name in state.scheduler.models()
            for backend in state.scheduler.view(name, now).backends
        )
        return _json(
            {"status": "ready" if healthy else "no_healthy_backend"}, 200 if healthy else 503
        )

    async def metrics(self, request: Request) -> Response:
        """Prometheus text format."""
        return Response(
            generate_latest(self.state.metrics.registry), media_type=CONTENT_TYPE_LATEST
        )

    async def models(self, request: Request) -> Response:
        """The union of configured models, in OpenAI's list shape.

        With tenant keys configured, only a tenant key or the admin key may list them.
        """
        if self.state.auth_required:
            token = request_token(request.headers)
            keys = self.state.keys
            if token is None or (keys.tenant(token) is None and not keys.is_admin(token)):
                return error_response(401, "invalid_api_key", "missing or unknown API key")
        data = [
            {"id": name, "object": "model", "created": self._created, "owned_by": "sluicegate"}
            for name in self.state.models
        ]
        return _json({"object": "list", "data": data})

    async def openapi(self, request: Request) -> Response:
        """This gateway's OpenAPI document, as JSON."""
        return Response(openapi_document(), media_type="application/json")

    def _admin(self, request: Request) -> None:
        token = request_token(request.headers)
        if token is None or not self.state.keys.is_admin(token):
            raise GatewayError(401, "invalid_admin_key", "this endpoint needs the admin key")

    async def admin_state(self, request: Request) -> Response:
        """Queues, running counts, limits and backends of every model."""
        try:
            self._admin(request)
        except GatewayError as exc:
            return exc.response()
        scheduler = self.state.scheduler
        models = []
        for name in scheduler.models():
            view = scheduler.view(name, self.state.driver.now())
            models.append(
                {
                    "name": view.name,
                    "running": view.running,
                    "queued": view.queued,
                    "cap": view.cap,
                    "configured_cap": view.configured_cap,
                    "inflight_tokens": view.inflight_tokens,
                    "max_inflight_tokens": view.max_inflight_tokens,
                    "lanes": [
                        {
                            "name": lane.name,
                            "queued": lane.queued,
                            "running": lane.running,
                            "borrowed": lane.borrowed,
                            "cap": lane.cap,
                            "policy": lane.policy,
                        }
                        for lane in view.lanes
                    ],
                    "backends": [
                        {
                            "name": b.name,
                            "inflight": b.inflight,
                            "healthy": b.healthy,
                            "probe_healthy": b.probe_healthy,
                            "circuit": b.circuit,
                            "kv_cache_usage": b.kv_cache_usage,
                            "num_requests_waiting": b.num_requests_waiting,
                        }
                        for b in view.backends
                    ],
                }
            )
        link = self.state.link
        store = {"kind": "memory"} if link is None else link.status()
        return _json({"draining": scheduler.draining, "store": store, "models": models})

    async def admin_drain(self, request: Request) -> Response:
        """Stop admitting new requests; queued and running ones finish."""
        try:
            self._admin(request)
        except GatewayError as exc:
            return exc.response()
        self.state.scheduler.drain()
        return _json({"draining": True})
