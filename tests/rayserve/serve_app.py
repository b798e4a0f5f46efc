"""A Ray Serve application forwarding the OpenAI API to one engine, run as its own process.

``python tests/rayserve/serve_app.py UPSTREAM HTTP_PORT METRICS_PORT TEMP_DIR REPLICAS
MAX_ONGOING`` starts a
local Ray cluster (metrics agent on ``METRICS_PORT``, state under ``TEMP_DIR``), Serve's
proxy on 127.0.0.1:``HTTP_PORT`` and the deployment ``LLMForwarder`` (``num_replicas=2,
max_ongoing_requests``
as given: the tests use 2 and 2; route prefix ``/``), prints ``READY`` and serves until
SIGTERM. Each replica relays a request to ``UPSTREAM`` unchanged (path, body) and its
answer unchanged: a stream's SSE bytes as the engine sent them, an error's status and body.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import AsyncIterator

import aiohttp
import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse


@serve.deployment
class LLMForwarder:
    """Relays each request to the engine at ``upstream``."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, request: Request) -> Response:
        """The engine's answer to the same path and body."""
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
        body = await request.body()
        headers = {"content-type": request.headers.get("content-type", "application/json")}
        upstream = await self.session.request(
            request.method, self.upstream + request.url.path, data=body, headers=headers
        )
        kind = upstream.headers.get("content-type", "application/json")
        if kind.startswith("text/event-stream"):
            return StreamingResponse(_relay(upstream), status_code=upstream.status, media_type=kind)
        async with upstream:
            return Response(await upstream.read(), status_code=upstream.status, media_type=kind)


async def _relay(upstream: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    async with upstream:
        async for chunk in upstream.content.iter_any():
            yield chunk


def main(
    upstream: str, http_port: int, metrics_port: int, temp_dir: str, replicas: int, ongoing: int
) -> None:
    """Start Ray and Serve, deploy, and serve until SIGTERM."""
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        _metrics_export_port=metrics_port,
        _temp_dir=temp_dir,
        log_to_driver=False,
        _system_config={"metrics_report_interval_ms": 500},
    )
    serve.start(http_options={"host": "127.0.0.1", "port": http_port})
    # serve.deployment turns the class into a Deployment, which mypy cannot see.
    deployment = LLMForwarder.options(  # type: ignore[attr-defined]
        num_replicas=replicas, max_ongoing_requests=ongoing
    )
    serve.run(deployment.bind(upstream), name="llm", route_prefix="/")
    print("READY", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()  # type: ignore[no-untyped-call]
    ray.shutdown()


if __name__ == "__main__":
    upstream, http_port, metrics_port, temp_dir, replicas, ongoing = sys.argv[1:7]
    main(upstream, int(http_port), int(metrics_port), temp_dir, int(replicas), int(ongoing))
