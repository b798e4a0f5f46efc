"""The seam of the emulator's personalities: how it looks to a client as each engine.

The engine model underneath is the same for every personality; what changes is what a
scraper, a prober or an error-reading client sees: the metric names and pages
(``EngineMetrics``), the health path, extra documents (TGI's ``/info``, SGLang's
``/get_server_info``), the native error body, and stream quirks such as keep-alive
comments. Each personality is one module in this package, written from the engine's
own documentation and source, and registered by name in ``__init__.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from sluicegate.engine import Engine

JsonDocument = Callable[[], dict[str, object]]
"""A document built afresh at each request (it may read the engine's live state)."""


class EngineMetrics(Protocol):
    """What the runner feeds as requests progress, and the page ``/metrics`` serves."""

    content_type: str

    def render(self) -> bytes:
        """The metrics page, in the engine's names."""
        ...

    def first_token(self, prompt_tokens: int, ttft_s: float) -> None:
        """A request's prompt was processed and its first token delivered after ``ttft_s``."""
        ...

    def next_token(self, gap_s: float) -> None:
        """A later token was delivered ``gap_s`` after the request's previous one."""
        ...

    def finished(self, reason: str, e2e_s: float | None) -> None:
        """A request ended (``stop``, ``length`` or ``abort``); aborts carry no latency."""
        ...

    def preempted(self, count: int) -> None:
        """The engine preempted ``count`` requests in a step."""
        ...


class Personality:
    """One engine as the emulator plays it. Subclasses set the attributes and override
    the builders their engine needs; the defaults are vLLM's.
    """

    name: str = ""
    """The ``--personality`` value, the same as the engine's profile name."""
    health_path: str = "/health"
    metrics_path: str = "/metrics"
    gzip_metrics: bool = True
    """Whether its metrics page is gzipped for a client that accepts gzip, as
    prometheus-client's exporters (vLLM's, SGLang's, trtllm-serve's, Ray's) do."""
    keepalive_s: float | None = None
    """Seconds of silence after which a stream sends an SSE comment (``:``), as engines
    served by axum or sse-starlette do; None: never."""
    priority_field: str | None = "priority"
    """The request field its priority scheduler reads; None: it has none (the field is
    then ignored, as such an engine ignores fields it does not know)."""

    def metrics(self, model: str, engine: Engine) -> EngineMetrics:
        """The metrics of an engine serving ``model``."""
        raise NotImplementedError

    def documents(self, model: str, engine: Engine) -> dict[str, JsonDocument]:
        """Extra JSON documents by path (GET), e.g. ``/info``."""
        return {}

    def health_body(self) -> dict[str, object] | None:
        """The JSON a health answer carries; None: an empty 200."""
        return None

    def error_status(self, status: int, code: str) -> int:
        """The HTTP status the engine answers a refusal of ``status`` with (TGI: 422)."""
        return status

    def error_body(
        self, status: int, message: str, code: str, param: str | None
    ) -> dict[str, object]:
        """The engine's own error body for a refused request."""
        return {
            "error": {
                "message": message,
                "type": "invalid_request_error" if status < 500 else "internal_server_error",
                "code": code,
                "param": param,
            }
        }
