"""llama.cpp's own server, ``llama-server`` (run for real in the tests).

Source: tools/server/server.cpp and its README (``--metrics``), checked against the
binary the tests build (tests/realengine). ``llamacpp:requests_processing`` counts busy
slots and ``llamacpp:requests_deferred`` requests waiting for one. There is no KV gauge
since the KV-cache rewrite (0.3.36 has none; older builds had
``llamacpp:kv_cache_usage_ratio``, still read), and a slot holds its context until the
request ends, so the cap that keeps its queue empty is ``max_concurrency`` = ``--parallel``.
``/health`` answers 503 while the model loads. Errors are
``{"error": {"code", "message", "type"}}``; a prompt past the context is
``exceed_context_size_error``, and a few 500s are the request's own fault
(``CLIENT_FAULT_500``). A non-streamed request's departed client is noticed only after a
second without a result for any request, which a busy engine seldom has: non-streamed
requests go to it as streams.
"""

from __future__ import annotations

import re

from sluicegate.engine_profiles.profile import EngineError, EngineProfile, Reading
from sluicegate.engine_profiles.prometheus_text import Samples

RUNNING = "llamacpp:requests_processing"
WAITING = "llamacpp:requests_deferred"
KV_USAGE = "llamacpp:kv_cache_usage_ratio"
CLIENT_FAULT_500 = (
    "image input is not supported",
    "audio input is not supported",
    "Failed to parse messages",
)
"""How llama-server's 500s for the request's own fault begin (a part it was not started
to read, a message it cannot parse): answered as 400s, so no client can open a circuit."""


class LlamaServerProfile(EngineProfile):
    """``llama-server --metrics``."""

    name = "llama-server"
    summary = "busy slots as running, deferred requests as waiting (no KV gauge since 0.3.x)"
    metric_names = frozenset({RUNNING, WAITING, KV_USAGE})
    streams_unary = True

    def read_metrics(self, samples: Samples) -> Reading:
        """Busy and deferred slots; the KV ratio only from builds that still export it."""
        running, waiting = samples.total(RUNNING), samples.total(WAITING)
        return Reading(
            running=None if running is None else int(running),
            waiting=None if waiting is None else int(waiting),
            kv_usage=samples.total(KV_USAGE),
        )

    def error_code(self, status: int, error: EngineError) -> str | None:
        """A prompt past the context is ``context_length_exceeded``."""
        return "context_length_exceeded" if error.kind == "exceed_context_size_error" else None

    def client_fault(self, status: int, error: EngineError) -> bool:
        """The 500s listed in ``CLIENT_FAULT_500``."""
        return status == 500 and (error.message or "").startswith(CLIENT_FAULT_500)


VALIDATION_500 = re.compile(r"\d+ validation errors?\b")
"""How llama-cpp-python's 500 for a body its models refuse begins: its route handler
(llama_cpp/server/errors.py ``RouteErrorHandler``) answers pydantic's validation error as
an ``internal_server_error``."""


class LlamaCppPythonProfile(LlamaServerProfile):
    """llama-cpp-python's server (``python -m llama_cpp.server``; llama_cpp/server/app.py
    and errors.py, recorded from 0.3.36): no ``/metrics``, no ``/health`` (its 404 still
    proves it up; it answers 503 while it has no model), errors in OpenAI's shape with
    ``context_length_exceeded`` named, and connections it drops after some answers
    without saying so, so none is pooled."""

    name = "llamacpp"
    summary = "nothing (no /metrics): in-flight counts and passive health only"
    metrics_path = None
    metric_names = frozenset()
    keeps_alive = False

    def client_fault(self, status: int, error: EngineError) -> bool:
        """A 500 that is pydantic's refusal of the request body."""
        return status == 500 and VALIDATION_500.match(error.message or "") is not None
