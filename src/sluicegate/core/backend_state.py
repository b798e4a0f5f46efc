"""Runtime state of one backend as the scheduler and the routers see it, and questions about
a model's backends as a whole (any healthy, how long until one may be)."""

from __future__ import annotations

from collections.abc import Sequence

from sluicegate.core.circuit import CircuitBreaker, CircuitState
from sluicegate.core.component_specs import BackendSpec
from sluicegate.core.kv_index import BlockIndex
from sluicegate.core.ticket import Ticket

PREFILL_RATE_SMOOTHING = 0.2
"""Weight of the newest sample in a backend's learned prefill rate (an EWMA)."""


class BackendState:
    """One backend's live numbers: own in-flight work plus what its engine reports.

    Attributes:
        spec: the configured backend.
        inflight: units (engine sequences) this scheduler has running on it.
        predicted_work_s: sum of predicted remaining service time of those requests.
        kv_cache_usage: the engine's KV-cache usage in [0, 1], if scraped.
        num_requests_waiting: the engine's own waiting queue, if scraped.
        num_requests_running: the engine's running batch, if scraped.
        probe_healthy: the last active health probe's verdict.
        circuit: passive health from request outcomes.
        metrics_at: when the engine's metrics were last scraped well (None: never).
        kv_index: the blocks its engine holds, as its KV events say (None: no events).
        prefill_backlog_tokens: uncached prompt tokens of the tickets running on it that
            have no first token yet (what its engine must still prefill, as charged at
            dispatch by ``uncached_tokens``).
        prefill_tokens_per_s: its learned prefill rate (``learn_prefill_rate``; None: no
            sample yet).
        stale_after_s: how old they may get before the backend counts as full.
    """

    __slots__ = (
        "circuit",
        "inflight",
        "kv_cache_usage",
        "kv_index",
        "metrics_at",
        "num_requests_running",
        "num_requests_waiting",
        "predicted_work_s",
        "prefill_backlog_tokens",
        "prefill_tokens_per_s",
        "probe_healthy",
        "spec",
        "stale_after_s",
    )

    def __init__(
        self, spec: BackendSpec, circuit: CircuitBreaker, stale_after_s: float | None = None
    ) -> None:
        self.spec = spec
        self.circuit = circuit
        self.inflight = 0
        self.predicted_work_s = 0.0
        self.kv_cache_usage: float | None = None
        self.num_requests_waiting: int | None = None
        self.num_requests_running: int | None = None
        self.probe_healthy = True
        self.metrics_at: float | None = None
        self.kv_index: BlockIndex | None = None
        self.prefill_backlog_tokens = 0
        self.prefill_tokens_per_s: float | None = None
        self.stale_after_s = stale_after_s

    @property
    def name(self) -> str:
        """The backend's configured name."""
        return self.spec.name

    def healthy(self, now: float) -> bool:
        """Whether the backend takes traffic at ``now``: the last probe said up and its
        circuit is not open within a cool-down (closed, half-open, or open past it).

        The one definition of "healthy" for routing, readiness and metrics; reading
        it changes nothing.
        """
        return self.probe_healthy and self.circuit.state_at(now) is not CircuitState.OPEN

    def metrics_stale(self, now: float) -> bool:
        """Whether the engine's metrics, once scraped, have gone unrefreshed for longer
        than ``stale_after_s``: a failing scrape or a wedged engine, whose last numbers
        no longer say anything. An engine never scraped is not stale, only unknown."""
        at, bound = self.metrics_at, self.stale_after_s
        return at is not None and bound is not None and now - at > bound

    def available(self, now: float, units: int = 1) -> bool:
        """Healthy, with room under its own cap for ``units`` more (an idle backend
        always has room), metrics not stale (a stale backend counts as full), and not
        holding a half-open circuit's probe: a router may send it a request of ``units``
        now."""
        cap = self.spec.max_concurrency
        inflight = self.inflight
        if (cap is not None and inflight and inflight + units > cap) or not self.probe_healthy:
            return False
        if self.metrics_at is not None and self.metrics_stale(now):
            return False
        return self.circuit.allows(now)

    def uncached_tokens(self, ticket: Ticket, block_tokens: int) -> int:
        """The prompt tokens its engine must compute for ``ticket``: all but those of the
        leading blocks of ``ticket.block_hashes`` (of ``block_tokens``) its ``kv_index`` holds."""
        index, hashes = self.kv_index, ticket.block_hashes
        if index is None or not hashes:
            return ticket.prompt_tokens
        return max(0, ticket.prompt_tokens - block_tokens * index.match(hashes))

    def learn_prefill_rate(self, tokens: int, ttft_s: float) -> None:
        """A ticket's first token came ``ttft_s`` after its dispatch with ``tokens`` to
        prefill ahead of it and its own: one sample of the prefill rate, ``tokens / ttft_s``,
        folded into ``prefill_tokens_per_s`` (the first sample is taken as it is).
        A sample of no tokens or no time says nothing and is ignored."""
        if tokens <= 0 or ttft_s <= 0.0:
            return
        sample = tokens / ttft_s
        rate = self.prefill_tokens_per_s
        self.prefill_tokens_per_s = (
            sample if rate is None else rate + PREFILL_RATE_SMOOTHING * (sample - rate)
        )


UNAVAILABLE_RETRY_S = 5.0
"""The retry hint while no backend is healthy and no circuit is due to reopen."""


def any_healthy(backends: Sequence[BackendState], now: float) -> bool:
    """Whether at least one of ``backends`` may take traffic at ``now``."""
    return any(backend.healthy(now) for backend in backends)


def unavailable_wait_s(backends: Sequence[BackendState], now: float) -> float:
    """How long until one of ``backends`` may take traffic again, when none can now: the
    soonest open circuit's reopening, else ``UNAVAILABLE_RETRY_S`` (a probe must find one up)."""
    reopen = [backend.circuit.reopen_at() for backend in backends]
    soonest = min((t for t in reopen if t is not None), default=now + UNAVAILABLE_RETRY_S)
    return soonest - now
