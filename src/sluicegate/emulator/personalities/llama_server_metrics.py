"""llama-server-named Prometheus metrics for the emulator (``llamacpp:`` names).

Names, types and HELP text as llama-server 0.3.36 (llama-cpp-python's vendored llama.cpp,
tools/server) exports them with ``--metrics``, checked against the page recorded from the
real binary (tests/engines/fixtures/llama-server/metrics.prom). No labels. The gauges
``requests_processing`` and ``requests_deferred`` read the engine model at scrape time
(its running and waiting requests); the counters are fed by the runner. Left out: the
speculative-decoding counters (always 0 without a draft model), ``n_decode_total``,
``n_tokens_max`` and ``n_busy_slots_per_decode``, which need a per-step hook the runner
does not give.
"""

from __future__ import annotations

from sluicegate.engine import Engine

CONTENT_TYPE = "text/plain; version=0.0.4"


class LlamaServerMetrics:
    """The counters and gauges of llama-server's ``/metrics``, fed by the runner."""

    content_type = CONTENT_TYPE

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.prompt_tokens = 0
        self.prompt_seconds = 0.0
        self.tokens_predicted = 0
        self.predicted_seconds = 0.0

    def render(self) -> bytes:
        """The page, in llama-server's order: counters, then gauges."""
        prompt_rate = self.prompt_tokens / self.prompt_seconds if self.prompt_seconds else 0.0
        predicted_rate = (
            self.tokens_predicted / self.predicted_seconds if self.predicted_seconds else 0.0
        )
        rows = (
            ("prompt_tokens_total", "counter",
             "Number of prompt tokens processed, excluding cached tokens", self.prompt_tokens),
            ("prompt_seconds_total", "counter",
             "Total time spent processing prompts", self.prompt_seconds),
            ("tokens_predicted_total", "counter",
             "Number of generation tokens processed", self.tokens_predicted),
            ("tokens_predicted_seconds_total", "counter",
             "Total time spent generating tokens", self.predicted_seconds),
            ("prompt_tokens_seconds", "gauge",
             "Average prompt throughput in tokens/s", prompt_rate),
            ("predicted_tokens_seconds", "gauge",
             "Average generation throughput in tokens/s", predicted_rate),
            ("requests_processing", "gauge",
             "Number of requests processing", self._engine.num_requests_running),
            ("requests_deferred", "gauge",
             "Number of requests deferred", self._engine.num_requests_waiting),
        )  # fmt: skip
        lines = []
        for name, kind, help_text, value in rows:
            lines += [
                f"# HELP llamacpp:{name} {help_text}",
                f"# TYPE llamacpp:{name} {kind}",
                f"llamacpp:{name} {value:g}",
            ]
        return ("\n".join(lines) + "\n").encode()

    def first_token(self, prompt_tokens: int, ttft_s: float) -> None:
        """A prompt was processed (its time counts as prompt time) and a token made."""
        self.prompt_tokens += prompt_tokens
        self.prompt_seconds += ttft_s
        self.tokens_predicted += 1

    def next_token(self, gap_s: float) -> None:
        """A later token was made ``gap_s`` after the previous one."""
        self.tokens_predicted += 1
        self.predicted_seconds += gap_s

    def finished(self, reason: str, e2e_s: float | None) -> None:
        """llama-server counts no finished requests."""

    def preempted(self, count: int) -> None:
        """llama-server never preempts: a slot holds its context to the end."""
