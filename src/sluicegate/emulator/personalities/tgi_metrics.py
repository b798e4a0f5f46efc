"""TGI-named metrics for the emulator, rendered as TGI's exporter renders them.

TGI's router records with the ``metrics`` crate and renders with
``metrics-exporter-prometheus`` (router/src/server.rs): bare names (no ``_total``
suffix on counters, no ``_created`` samples), integral values without a decimal point,
and ``# HELP`` lines only for names it describes. Gauges follow backends/v3:
``tgi_queue_size`` (queue.rs), ``tgi_batch_current_size`` and
``tgi_batch_current_max_tokens`` (backend.rs: the running batch's reserved KV slots,
here the engine's held blocks × block size) and ``tgi_batch_max_total_tokens`` (lib.rs:
the KV capacity; not for a ``batch_independent`` engine, which shares no KV cache).
Counters: ``tgi_request_count``, ``tgi_request_success`` and
``tgi_request_failure{err="dropped"}`` (a request whose client left, backend.rs). TGI's
histograms (durations, token counts) are left out.
"""

from __future__ import annotations

from collections.abc import Callable

from sluicegate.engine import Engine

CONTENT_TYPE = "text/plain; version=0.0.4"

_HELP = {
    "tgi_queue_size": "Current queue size",
    "tgi_batch_current_size": "Current batch size",
    "tgi_batch_current_max_tokens": "Maximum tokens for the current batch",
    "tgi_request_count": "Total number of requests",
    "tgi_request_success": "Number of successful requests",
}


class TGIMetrics:
    """The emulator's metrics in TGI's names, gauges read from ``engine`` at each render.

    ``tgi_request_count`` counts requests as they end (TGI counts them as they arrive;
    the emulator's runner reports no arrival), ``tgi_request_success`` those that ended
    by ``stop`` or ``length``, ``tgi_request_failure{err="dropped"}`` the aborted.

    Args:
        model: the served model name (TGI's metrics carry no model label; unused).
        engine: the engine whose state the gauges report.
    """

    content_type = CONTENT_TYPE

    def __init__(self, model: str, engine: Engine) -> None:
        config = engine.config
        capacity = config.num_blocks * config.block_size
        self._gauges: list[tuple[str, Callable[[], float]]] = [
            ("tgi_queue_size", lambda: engine.num_requests_waiting),
            ("tgi_batch_current_size", lambda: engine.num_requests_running),
            ("tgi_batch_current_max_tokens", lambda: round(engine.kv_cache_usage * capacity)),
        ]
        if not config.batch_independent:
            self._gauges.append(("tgi_batch_max_total_tokens", lambda: capacity))
        self._requests = self._success = self._dropped = 0

    def render(self) -> bytes:
        """The exposition, gauges then counters, each family after its ``# TYPE`` line."""
        families = [(name, "gauge", read()) for name, read in self._gauges]
        families += [
            ("tgi_request_count", "counter", self._requests),
            ("tgi_request_success", "counter", self._success),
        ]
        lines: list[str] = []
        for name, kind, value in families:
            lines.append(f"# TYPE {name} {kind}")
            if name in _HELP:
                lines.append(f"# HELP {name} {_HELP[name]}")
            lines += [f"{name} {_number(value)}", ""]
        lines += [
            "# TYPE tgi_request_failure counter",
            f'tgi_request_failure{{err="dropped"}} {self._dropped}',
            "",
        ]
        return "\n".join(lines).encode()

    def first_token(self, prompt_tokens: int, ttft_s: float) -> None:
        """Nothing: TGI's token counts are histograms this emulation leaves out."""

    def next_token(self, gap_s: float) -> None:
        """Nothing, as ``first_token``."""

    def finished(self, reason: str, e2e_s: float | None) -> None:
        """A request ended: counted, as a success or as dropped (``abort``)."""
        self._requests += 1
        if reason == "abort":
            self._dropped += 1
        else:
            self._success += 1

    def preempted(self, count: int) -> None:
        """Nothing: TGI's v3 backend does not preempt (it reserves a request's KV up front)."""


def _number(value: float) -> str:
    """``12`` for a whole number, as the exporter writes it; else the float's repr."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))
