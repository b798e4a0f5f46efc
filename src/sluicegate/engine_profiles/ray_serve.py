"""Ray Serve: a Serve application (its own router and replicas) in front of an engine.

Source (Ray 2.60.0, as installed): ray/serve/_private/router.py (the router's gauge
``serve_deployment_queued_queries``: requests waiting to be assigned a replica, tags
``deployment``, ``application``, ``handle``, ``actor_id``), ray/serve/_private/replica.py
(``serve_replica_processing_queries``: requests a replica is processing, tagged by Serve
with ``deployment``, ``replica``, ``application``), ray/serve/_private/http_util.py
(``get_http_response_status``: a ``BackPressureError`` answers 503 with the text
``Request dropped due to backpressure (num_queued_requests=…, max_queued_requests=…).``
and a ``Retry-After`` header when configured; ray/serve/exceptions.py holds the text),
ray/serve/_private/replica.py (an exception in the application answers 500
``Internal Server Error`` as text) and ray/serve/_private/proxy.py (``/-/healthz``: 200
``success`` or 503 with the reason). docs.ray.io "Monitor Your Application" (Serve metrics).

Serve's metrics are exported by Ray's metrics agent on a port of its own
(``ray start --metrics-export-port``), prefixed ``ray_``: the backend must give
``metrics_url`` (``config.py`` refuses it without). The agent exports every deployment
of the cluster; a backend's URL (a route prefix) does not name its deployment, so the
reading sums every deployment's gauges: point one Ray cluster's metrics at one model, or
the counts include the other applications' requests. Running is the replicas' ongoing
requests (at most ``num_replicas × max_ongoing_requests``), waiting the routers' queues.

Errors: Ray's backpressure 503 means the deployment is full (its queue is at
``max_queued_requests``), not broken: it is relayed as an engine 429 (``busy``), which
the adaptive limit reads as a drop and which counts nothing against the circuit. Any
other 5xx (an application's exception, an unavailable deployment) is a 502. The Serve
application forwards the engine's SSE unchanged, so streams read as the engine's own.
"""

from __future__ import annotations

from sluicegate.engine_profiles.profile import EngineProfile, Reading
from sluicegate.engine_profiles.prometheus_text import Samples

RUNNING = "ray_serve_replica_processing_queries"
WAITING = "ray_serve_deployment_queued_queries"
BACKPRESSURE = b"Request dropped due to backpressure"


class RayServeProfile(EngineProfile):
    """A Ray Serve application forwarding the OpenAI API (``serve run``, Serve's proxy)."""

    name = "ray-serve"
    summary = "running (replicas' ongoing), waiting (router queue); metrics_url required"
    health_path = "/-/healthz"
    metrics_path = None
    metric_names = frozenset({RUNNING, WAITING})

    def read_metrics(self, samples: Samples) -> Reading:
        """Sums over every deployment, replica and router the metrics agent exports."""
        running, waiting = samples.total(RUNNING), samples.total(WAITING)
        return Reading(
            running=None if running is None else round(running),
            waiting=None if waiting is None else round(waiting),
        )

    def busy(self, status: int, body: bytes) -> bool:
        """Serve's backpressure answer (503 with its text): the deployment's queue is full."""
        return status == 503 and body.startswith(BACKPRESSURE)
