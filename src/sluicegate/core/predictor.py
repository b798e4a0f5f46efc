"""Online prediction of output length and service time, per model.

Output length is an exponentially weighted mean per (lane, max_tokens bucket),
falling back to the lane, then the model, then a configured prior, and never
above ``max_tokens``. Buckets are powers of two of ``max_tokens``: clients
that ask for 64 tokens and clients that ask for 4096 are different
populations. Relative order matters more than accuracy (Fu et al. 2024).

Service time is ``prefill_s + output_tokens · decode_s_per_token`` where
``prefill_s = base + prompt_tokens · per_prompt_token`` is fitted by
exponentially forgetting least squares on observed time to first token, and
``decode_s_per_token`` is an exponentially weighted mean of observed decode
time per token.
"""

from __future__ import annotations

from sluicegate.core.spec import ModelSpec

_ALPHA = 0.05  # ~ the last 20–40 completions dominate
_MIN_SAMPLES = 5
_FORGET = 0.99  # least-squares forgetting: ~100 samples of memory
_WARMUP = round(1 / _ALPHA)  # plain average until the EWMA has enough samples


class _Mean:
    __slots__ = ("count", "mean")

    def __init__(self) -> None:
        self.count = 0
        self.mean = 0.0

    def add(self, value: float) -> None:
        count = self.count = self.count + 1
        alpha = 1.0 / count if count < _WARMUP else _ALPHA
        self.mean += alpha * (value - self.mean)


class _LineFit:
    """y ≈ a + b·x by exponentially forgetting least squares."""

    __slots__ = ("n", "sx", "sxx", "sxy", "sy")

    def __init__(self) -> None:
        self.n = self.sx = self.sy = self.sxx = self.sxy = 0.0

    def add(self, x: float, y: float) -> None:
        f = _FORGET
        self.n = self.n * f + 1.0
        self.sx = self.sx * f + x
        self.sy = self.sy * f + y
        self.sxx = self.sxx * f + x * x
        self.sxy = self.sxy * f + x * y

    def solve(self) -> tuple[float, float] | None:
        det = self.n * self.sxx - self.sx * self.sx
        if self.n < _MIN_SAMPLES or det <= 1e-9 * max(1.0, self.n * self.sxx):
            return None
        b = (self.n * self.sxy - self.sx * self.sy) / det
        a = (self.sy - b * self.sx) / self.n
        return max(0.0, a), max(0.0, b)


class Predictor:
    """Predicts output tokens and service time for one model; learns from completions."""

    __slots__ = (
        "_buckets",
        "_decode",
        "_fit_dirty",
        "_global",
        "_lanes",
        "_prefill",
        "_prefill_fit",
        "_prior_decode",
        "_prior_output",
        "_prior_prefill_per_token",
        "_service",
    )

    def __init__(self, spec: ModelSpec) -> None:
        self._prior_output = spec.prior_output_tokens
        self._prior_prefill_per_token = 1.0 / spec.prior_prefill_tokens_per_s
        self._prior_decode = 1.0 / spec.prior_decode_tokens_per_s
        self._buckets: dict[tuple[str, int], _Mean] = {}
        self._lanes: dict[str, _Mean] = {}
        self._global = _Mean()
        self._decode = _Mean()
        self._prefill_fit = _LineFit()
        self._prefill: tuple[float, float] = (0.0, self._prior_prefill_per_token)
        self._fit_dirty = False
        self._service: dict[str, _Mean] = {}

    def predict_output(self, lane: str, max_tokens: int) -> int:
        """Predicted output tokens for a request with this lane and ``max_tokens``."""
        stats = self._buckets.get((lane, max_tokens.bit_length()))
        if stats is None or stats.count < _MIN_SAMPLES:
            stats = self._lanes.get(lane)
            if stats is None or stats.count < _MIN_SAMPLES:
                stats = self._global
        guess = stats.mean if stats.count >= _MIN_SAMPLES else self._prior_output
        return max(1, min(max_tokens, round(guess)))

    def prefill_s(self, prompt_tokens: int) -> float:
        """Predicted time from admission to first token."""
        if self._fit_dirty:
            self._fit_dirty = False
            fit = self._prefill_fit.solve()
            if fit is not None:
                self._prefill = fit
        base, per_token = self._prefill
        return base + prompt_tokens * per_token

    def decode_s_per_token(self) -> float:
        """Predicted time per generated token."""
        return self._decode.mean if self._decode.count >= _MIN_SAMPLES else self._prior_decode

    def mean_service_s(self, lane: str) -> float:
        """Mean observed service time in ``lane`` (a prior before any completion)."""
        stats = self._service.get(lane)
        if stats is not None and stats.count > 0:
            return stats.mean
        return self.prefill_s(0) + self._prior_output * self.decode_s_per_token()

    def observe(
        self,
        *,
        lane: str,
        max_tokens: int,
        prompt_tokens: int,
        completion_tokens: int,
        ttft_s: float | None,
        duration_s: float,
    ) -> None:
        """Learn from one finished request."""
        key = (lane, max_tokens.bit_length())
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Mean()
        bucket.add(completion_tokens)
        by_lane = self._lanes.get(lane)
        if by_lane is None:
            by_lane = self._lanes[lane] = _Mean()
        by_lane.add(completion_tokens)
        self._global.add(completion_tokens)
        service = self._service.get(lane)
        if service is None:
            service = self._service[lane] = _Mean()
        service.add(duration_s)
        if ttft_s is None or ttft_s < 0:
            return
        self._prefill_fit.add(prompt_tokens, ttft_s)
        self._fit_dirty = True
        if completion_tokens > 1 and duration_s > ttft_s:
            self._decode.add((duration_s - ttft_s) / (completion_tokens - 1))
