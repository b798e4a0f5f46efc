"""Operations endpoints: health, readiness, metrics, models, OpenAPI, admin state, drain
and undrain.

Under ``serve --workers N`` (N > 1) ``/metrics``, ``/admin/state``, ``/admin/drain`` and
``/admin/undrain`` answer for the whole gateway: the worker that receives one asks its siblings
(``gateway/distributed/siblings.py``) and merges their answers. ``/healthz`` and ``/readyz``
answer for the worker that receives them.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import os
import time

import orjson
import yaml
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import Response

from sluicegate.gateway.batch_lane.batch_metrics import BatchProgress
from sluicegate.gateway.distributed.link_view import tenant_rows
from sluicegate.gateway.distributed.siblings import (
    SiblingAnswer,
    ask_siblings,
    merge_metrics,
    topology_from_environ,
    worker_up_family,
)
from sluicegate.gateway.http_errors import GatewayError
from sluicegate.gateway.ops.admin import check_admin_read, check_admin_write
from sluicegate.gateway.request.auth import request_token, same_digest
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

    def __init__(self, state: GatewayState, metrics_key: str | None = None) -> None:
        self.state = state
        # server.metrics_key_env: without a key /metrics is open, as before.
        self._metrics_key = hashlib.sha256(metrics_key.encode()).digest() if metrics_key else None
        self._created = int(time.time())
        openapi_document()  # parsed once, at start-up: a broken document fails here
        self.topology = topology_from_environ()
        self.batch_progress: BatchProgress | None = None  # set when the batch lane is on
        if self.topology is not None and self.topology.drain_mark.exists():
            state.scheduler.drain()  # restarted after the gateway was drained

    def _fans_out(self, request: Request) -> bool:
        """Whether this request asks for the whole gateway (``serve --workers`` only)."""
        return self.topology is not None and request.query_params.get("worker") != "local"

    async def healthz(self, request: Request) -> Response:
        """The process is up."""
        return _json({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        """Ready: config loaded, not draining, and at least one healthy backend (or a model
        that waits for its backends)."""
        state = self.state
        if state.scheduler.draining:
            return _json({"status": "draining"}, 503)
        now = state.driver.now()
        healthy = any(
            backend.healthy
            for name in state.scheduler.models()
            for backend in state.scheduler.view(name, now).backends
        )
        # A model that waits for its backends (scaling from zero) holds requests: the
        # gateway is its waiting room, and must stay reachable for them.
        waiting_room = any(model.wait_for_backends for model in state.models.values())
        if healthy or waiting_room:
            return _json({"status": "ready" if healthy else "waiting_for_backends"})
        return _json({"status": "no_healthy_backend"}, 503)

    async def metrics(self, request: Request) -> Response:
        """Prometheus text format (every worker's samples, labelled ``worker``, under
        ``serve --workers``); with ``server.metrics_key_env``, only for that key (or the
        admin key) as a bearer token."""
        token = request_token(request.headers)
        if self._metrics_key is not None and (
            token is None
            or not (same_digest(token, self._metrics_key) or self.state.keys.is_admin(token))
        ):
            raise GatewayError(
                401, "invalid_metrics_key", "/metrics needs the metrics key as a bearer token"
            )
        await self._read_store()
        local = generate_latest(self.state.metrics.registry)
        topology = self.topology
        if topology is None or not self._fans_out(request):
            return Response(local, media_type=CONTENT_TYPE_LATEST)
        authorization = None if token is None else f"Bearer {token}"
        answers = await ask_siblings(topology, "GET", "/metrics", authorization)
        texts = [(topology.index, local.decode())]
        texts += [(a.index, a.body.decode()) for a in answers if a.status == 200]
        up = {topology.index: True} | {a.index: a.status == 200 for a in answers}
        merged = merge_metrics(sorted(texts)) + worker_up_family(up)
        return Response(merged, media_type=CONTENT_TYPE_LATEST)

    async def models(self, request: Request) -> Response:
        """The union of configured models, in OpenAI's list shape.

        With tenant keys configured, only a tenant key or the admin key may list them.
        """
        if self.state.auth_required:
            token = request_token(request.headers)
            keys = self.state.keys
            if token is None or (keys.tenant(token) is None and not keys.is_admin(token)):
                raise GatewayError(401, "invalid_api_key", "missing or unknown API key")
        data = [
            {"id": name, "object": "model", "created": self._created, "owned_by": "sluicegate"}
            for name in self.state.models
        ]
        return _json({"object": "list", "data": data})

    async def openapi(self, request: Request) -> Response:
        """This gateway's OpenAPI document, as JSON."""
        return Response(openapi_document(), media_type="application/json")

    async def admin_state(self, request: Request) -> Response:
        """Queues, running counts, limits and backends of every model (of every worker,
        as ``{"workers": [...]}``, under ``serve --workers``)."""
        token = check_admin_read(request, self.state)
        await self._read_store()
        local = self._local_state()
        topology = self.topology
        if topology is None or not self._fans_out(request):
            return _json(local)
        answers = await ask_siblings(topology, "GET", "/admin/state", f"Bearer {token}")
        return _json({"workers": _merged(local, topology.index, answers)})

    async def _read_store(self) -> None:
        """In distributed mode, refresh the store's running counts per tenant (at most
        once a second: ``LinkView.read_tenants``)."""
        if self.state.link is not None:
            await self.state.link.read_global_tenants()

    def _local_state(self) -> dict[str, object]:
        scheduler = self.state.scheduler
        metrics = self.state.metrics
        outcomes = metrics.outcome_counts()
        configured = self.state.configured_tenants
        models = []
        for name in scheduler.models():
            view = scheduler.view(name, self.state.driver.now())
            lanes = []
            for lane in view.lanes:
                seen = metrics.lane(name, lane.name)
                lanes.append(
                    {
                        "name": lane.name,
                        "queued": lane.queued,
                        "running": lane.running,
                        "borrowed": lane.borrowed,
                        "cap": lane.cap,
                        "limit": min(lane.cap, view.cap),
                        "policy": lane.policy,
                        "pressure_tightened": lane.tightened,
                        "outcomes": outcomes.get((name, lane.name), {}),
                        "queue_wait_s": seen.recent_waits(),
                    }
                )
            tenants = [
                {
                    "tenant": tenant,
                    "requests": u[0],
                    "prompt_tokens": u[1],
                    "completion_tokens": u[2],
                }
                for (model, tenant), u in sorted(metrics.usage.items())
                if model == name
            ]
            models.append(
                {
                    "name": view.name,
                    "running": view.running,
                    "queued": view.queued,
                    "cap": view.cap,
                    "configured_cap": view.configured_cap,
                    "floor": view.floor,
                    "inflight_tokens": view.inflight_tokens,
                    "max_inflight_tokens": view.max_inflight_tokens,
                    "lanes": lanes,
                    "tenants": tenants,
                    "tenants_running": tenant_rows(scheduler.tenants_running(name), configured),
                    "backends": [
                        {
                            "name": b.name,
                            "inflight": b.inflight,
                            "healthy": b.healthy,
                            "probe_healthy": b.probe_healthy,
                            "circuit": b.circuit,
                            "kv_cache_usage": b.kv_cache_usage,
                            "num_requests_waiting": b.num_requests_waiting,
                            "num_requests_running": b.num_requests_running,
                            "engine": self.state.profile(name, b.name).name,
                            "metrics_age_s": b.metrics_age_s,
                            "metrics_stale": b.metrics_stale,
                            "kv_index_blocks": b.kv_index_blocks,
                        }
                        for b in view.backends
                    ],
                }
            )
        link = self.state.link
        store = {"kind": "memory"} if link is None else link.status()
        pressure = self.state.pressure
        answer: dict[str, object] = {
            "time": time.time(),
            "draining": scheduler.draining,
            "store": store,
            "pressure": None if pressure is None else pressure.status(),
            "models": models,
            "batches": None if self.batch_progress is None else self.batch_progress.state(),
        }
        if self.topology is not None:
            answer = {"worker": self.topology.index, "pid": os.getpid(), **answer}
        return answer

    async def admin_drain(self, request: Request) -> Response:
        """Stop admitting new requests; queued and running ones finish (in every worker,
        and in any worker restarted later, under ``serve --workers``)."""
        return await self._set_draining(request, draining=True)

    async def admin_undrain(self, request: Request) -> Response:
        """Admit new requests again after a drain (in every worker, and the drain mark goes,
        so a worker restarted later admits too, under ``serve --workers``)."""
        return await self._set_draining(request, draining=False)

    async def _set_draining(self, request: Request, *, draining: bool) -> Response:
        token = check_admin_write(request, self.state)
        scheduler = self.state.scheduler
        if draining:
            scheduler.drain()
        else:
            scheduler.undrain()
        topology = self.topology
        if topology is None or not self._fans_out(request):
            return _json({"draining": draining})
        if draining:
            topology.drain_mark.touch()
        else:
            topology.drain_mark.unlink(missing_ok=True)
        path = "/admin/drain" if draining else "/admin/undrain"
        answers = await ask_siblings(topology, "POST", path, f"Bearer {token}")
        workers = _merged({"draining": draining, "worker": topology.index}, topology.index, answers)
        # "draining" says the gateway as a whole is in the state asked for: every worker
        # answered (a silent one may still be in the other state).
        complete = all("error" not in w for w in workers)
        return _json({"draining": draining if complete else not draining, "workers": workers})


def _merged(
    local: dict[str, object], index: int, answers: list[SiblingAnswer]
) -> list[dict[str, object]]:
    """This worker's answer and its siblings', in worker order; a sibling that did not
    answer 200 appears as ``{"worker": i, "error": ...}``."""
    merged: list[tuple[int, dict[str, object]]] = [(index, local)]
    for answer in answers:
        entry: dict[str, object]
        if answer.status == 200:
            entry = {"worker": answer.index, **orjson.loads(answer.body)}
        else:
            error = answer.error or f"HTTP {answer.status}"
            entry = {"worker": answer.index, "error": error}
        merged.append((answer.index, entry))
    return [entry for _, entry in sorted(merged, key=lambda pair: pair[0])]
