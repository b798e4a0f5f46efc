"""Synthetic workloads: Poisson, gamma-burst and on/off arrivals with random token lengths.

Every generator is a pure function of its arguments: a ``seed`` builds two
independent numpy streams (``SeedSequence(seed).spawn(2)``), one for arrival
times and one for token lengths, so the same seed gives the same workload, and
changing a length distribution leaves the arrival times unchanged.

Arrivals are the points of a renewal process in ``[0, duration_s)`` (the first
arrival is one inter-arrival time after 0). Each request's ``max_tokens`` comes
from a :data:`~sluicegate.sim.workloads.transform.MaxTokensPolicy`, by default
``"pow2"``: the output length rounded up to a power of two.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal, TypedDict, Unpack

import numpy as np
import numpy.typing as npt

from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.workloads.transform import (
    MaxTokensPolicy,
    check_max_tokens_policy,
    resolve_max_tokens,
)

__all__ = [
    "DEFAULT_OUTPUT",
    "DEFAULT_PROMPT",
    "LengthDist",
    "RequestShape",
    "gamma_bursts",
    "merge",
    "on_off",
    "poisson",
]

_Floats = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class LengthDist:
    """A distribution of token counts, clipped to ``[min_tokens, max_tokens]``.

    Build one with :meth:`lognormal`, :meth:`exponential` or :meth:`constant`.

    Attributes:
        kind: ``"lognormal"``, ``"exponential"`` or ``"constant"``.
        scale: the lognormal's median, the exponential's mean, or the constant.
        sigma: the lognormal's standard deviation of ``ln(length)``; 0 otherwise.
        min_tokens: lower clip, ``>= 1``.
        max_tokens: upper clip, or ``None`` for none.
    """

    kind: Literal["lognormal", "exponential", "constant"]
    scale: float
    sigma: float = 0.0
    min_tokens: int = 1
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("lognormal", "exponential", "constant"):
            raise ValueError(f"kind must be lognormal, exponential or constant, got {self.kind!r}")
        if not (math.isfinite(self.scale) and self.scale >= 1.0):
            raise ValueError(f"scale must be a finite number >= 1, got {self.scale!r}")
        if not (math.isfinite(self.sigma) and 0.0 <= self.sigma <= 5.0):
            raise ValueError(f"sigma must be in [0, 5], got {self.sigma!r}")
        if self.min_tokens < 1:
            raise ValueError(f"min_tokens must be >= 1, got {self.min_tokens}")
        if self.max_tokens is not None and self.max_tokens < self.min_tokens:
            raise ValueError(
                f"max_tokens must be >= min_tokens ({self.min_tokens}), got {self.max_tokens}"
            )

    @classmethod
    def lognormal(
        cls, median: float, sigma: float, *, min_tokens: int = 1, max_tokens: int | None = None
    ) -> LengthDist:
        """``round(median · e^{sigma·Z})``, ``Z ~ N(0, 1)``, clipped (mean ``median·e^{σ²/2}``)."""
        return cls("lognormal", median, sigma, min_tokens, max_tokens)

    @classmethod
    def exponential(
        cls, mean: float, *, min_tokens: int = 1, max_tokens: int | None = None
    ) -> LengthDist:
        """``ceil(X)``, ``X ~ Exp(mean)``, clipped: exponential lengths for M/M/c checks.

        The integer length is geometric: ``P(L > k) = e^{−k/mean}`` exactly at integers
        ``k``, so its mean is ``1/(1 − e^{−1/mean}) ≈ mean + 1/2`` and its coefficient of
        variation ``≈ 1 − 1/(2·mean)``. Use ``mean ≥ 100`` for a check within 1 %.
        """
        return cls("exponential", mean, 0.0, min_tokens, max_tokens)

    @classmethod
    def constant(cls, tokens: int) -> LengthDist:
        """Always ``tokens``."""
        return cls("constant", tokens, 0.0, 1, None)

    def sample(self, rng: np.random.Generator, n: int) -> npt.NDArray[np.int64]:
        """Draw ``n`` token counts from ``rng``."""
        if self.kind == "lognormal":
            raw = np.rint(rng.lognormal(math.log(self.scale), self.sigma, n))
        elif self.kind == "exponential":
            raw = np.ceil(rng.exponential(self.scale, n))
        else:
            raw = np.full(n, round(self.scale), dtype=np.float64)
        high = np.inf if self.max_tokens is None else float(self.max_tokens)
        return np.clip(raw, float(self.min_tokens), high).astype(np.int64)


DEFAULT_PROMPT = LengthDist.lognormal(1024.0, 1.0, max_tokens=8192)
"""Default prompt lengths: median 1024 tokens, heavy right tail, at most 8192 (an assumption
of the same order as the Azure conversation trace's prompts)."""

DEFAULT_OUTPUT = LengthDist.lognormal(128.0, 1.0, max_tokens=2048)
"""Default output lengths: median 128 tokens, at most 2048."""


class RequestShape(TypedDict, total=False):
    """The keyword arguments every generator takes about its requests besides the tenant,
    each optional.

    Attributes:
        prompt: prompt-length distribution (default :data:`DEFAULT_PROMPT`).
        output: output-length distribution (default :data:`DEFAULT_OUTPUT`).
        max_tokens: how each request's cap is derived from its output length (``"pow2"``).
        lane: lane of every request (``"interactive"``).
        priority: priority of every request, 0 … 5 (2).
        deadline_ms: per-request deadline, or ``None`` (the default) for the lane's SLO.
    """

    prompt: LengthDist
    output: LengthDist
    max_tokens: MaxTokensPolicy
    lane: str
    priority: int
    deadline_ms: float | None


@dataclass(frozen=True, slots=True)
class _Shape:
    """Everything about a synthetic request except its arrival time."""

    tenant: str
    prompt: LengthDist = DEFAULT_PROMPT
    output: LengthDist = DEFAULT_OUTPUT
    max_tokens: MaxTokensPolicy = "pow2"
    lane: str = "interactive"
    priority: int = 2
    deadline_ms: float | None = None


def poisson(
    rate_per_s: float,
    duration_s: float,
    *,
    seed: int,
    tenant: str = "default",
    **shape: Unpack[RequestShape],
) -> list[WorkloadRequest]:
    """Poisson arrivals: i.i.d. exponential inter-arrival times with mean ``1/rate_per_s``.

    Args:
        rate_per_s: mean arrivals per second, ``> 0``.
        duration_s: arrivals fall in ``[0, duration_s)``.
        seed: seeds the arrival and length streams.
        tenant: tenant of every request.
        **shape: lengths, cap, lane, priority and deadline (:class:`RequestShape`).
    """
    _check_rate(rate_per_s, duration_s)
    arrival_rng, length_rng = _streams(seed)
    times = _renewal(lambda n: arrival_rng.exponential(1.0 / rate_per_s, n), rate_per_s, duration_s)
    return _requests(times, length_rng, _Shape(tenant, **shape))


def gamma_bursts(
    rate_per_s: float,
    cv: float,
    duration_s: float,
    *,
    seed: int,
    tenant: str = "default",
    **shape: Unpack[RequestShape],
) -> list[WorkloadRequest]:
    """Gamma renewal arrivals with mean rate ``rate_per_s`` and inter-arrival CV ``cv``.

    Inter-arrival times are ``Gamma(k, θ)`` with shape ``k = 1/cv²`` and scale
    ``θ = cv²/rate_per_s``, so the mean is ``kθ = 1/rate_per_s`` and the coefficient
    of variation is ``1/√k = cv``. ``cv > 1`` is burstier than Poisson (many short
    gaps, a few long ones), ``cv = 1`` is Poisson, ``cv < 1`` is more regular.
    Other arguments are as for :func:`poisson`.
    """
    _check_rate(rate_per_s, duration_s)
    if not (math.isfinite(cv) and 0.0 < cv <= 100.0):
        raise ValueError(f"cv must be in (0, 100], got {cv!r}")
    arrival_rng, length_rng = _streams(seed)
    k, theta = 1.0 / cv**2, cv**2 / rate_per_s
    times = _renewal(lambda n: arrival_rng.gamma(k, theta, n), rate_per_s, duration_s)
    return _requests(times, length_rng, _Shape(tenant, **shape))


def on_off(
    rate_on_per_s: float,
    on_s: float,
    off_s: float,
    duration_s: float,
    *,
    seed: int,
    tenant: str,
    **shape: Unpack[RequestShape],
) -> list[WorkloadRequest]:
    """A noisy tenant: Poisson at ``rate_on_per_s`` for ``on_s``, then silent for ``off_s``, …

    The cycle starts "on" at 0: arrivals fall in ``[j·(on_s+off_s), j·(on_s+off_s)+on_s)``
    for ``j = 0, 1, …`` within ``[0, duration_s)``; the long-run mean rate is
    ``rate_on_per_s · on_s/(on_s+off_s)``. A Poisson process in "on-time" is mapped to
    wall time ``t = ⌊u/on_s⌋·(on_s+off_s) + (u mod on_s)``. Other arguments are as for
    :func:`poisson`; ``shift`` the result to start later.
    """
    _check_rate(rate_on_per_s, duration_s)
    if not (math.isfinite(on_s) and on_s > 0.0 and math.isfinite(off_s) and off_s >= 0.0):
        raise ValueError(f"need on_s > 0 and off_s >= 0, got on_s={on_s!r}, off_s={off_s!r}")
    arrival_rng, length_rng = _streams(seed)
    period = on_s + off_s
    cycles, rest = divmod(duration_s, period)
    on_time = cycles * on_s + min(rest, on_s)
    u = _renewal(lambda n: arrival_rng.exponential(1.0 / rate_on_per_s, n), rate_on_per_s, on_time)
    times = np.floor(u / on_s) * period + np.mod(u, on_s)
    return _requests(times[times < duration_s], length_rng, _Shape(tenant, **shape))


def merge(*workloads: Iterable[WorkloadRequest]) -> list[WorkloadRequest]:
    """Merge sorted workloads into one sorted by arrival; ties keep argument order."""
    return list(heapq.merge(*workloads, key=lambda r: r.arrival_s))


def _check_rate(rate_per_s: float, duration_s: float) -> None:
    if not (math.isfinite(rate_per_s) and rate_per_s > 0.0):
        raise ValueError(f"rate_per_s must be a finite number > 0, got {rate_per_s!r}")
    if not (math.isfinite(duration_s) and duration_s > 0.0):
        raise ValueError(f"duration_s must be a finite number > 0, got {duration_s!r}")


def _streams(seed: int) -> tuple[np.random.Generator, np.random.Generator]:
    arrivals, lengths = np.random.SeedSequence(seed).spawn(2)
    return np.random.default_rng(arrivals), np.random.default_rng(lengths)


def _renewal(draw: Callable[[int], _Floats], rate_per_s: float, duration_s: float) -> _Floats:
    """Arrival times in ``[0, duration_s)`` from inter-arrival gaps drawn in chunks.

    Chunk sizes depend only on the arguments, so the result is deterministic.
    """
    expected = rate_per_s * duration_s
    chunk = int(expected + 4.0 * math.sqrt(expected) + 16.0)
    parts: list[_Floats] = []
    start = 0.0
    while True:
        times = start + np.cumsum(draw(chunk))
        parts.append(times[times < duration_s])
        if times[-1] >= duration_s:
            return np.concatenate(parts)
        start = float(times[-1])


def _requests(times: _Floats, rng: np.random.Generator, shape: _Shape) -> list[WorkloadRequest]:
    check_max_tokens_policy(shape.max_tokens)
    if not (shape.tenant and shape.lane):
        raise ValueError(f"tenant and lane must be non-empty, got {shape.tenant!r}, {shape.lane!r}")
    if not 0 <= shape.priority <= 5:
        raise ValueError(f"priority must be in [0, 5], got {shape.priority}")
    if shape.deadline_ms is not None and not shape.deadline_ms > 0.0:
        raise ValueError(f"deadline_ms must be > 0, got {shape.deadline_ms}")
    n = len(times)
    prompts = shape.prompt.sample(rng, n).tolist()
    outputs = shape.output.sample(rng, n).tolist()
    out: list[WorkloadRequest] = []
    for arrival, prompt, raw_output in zip(times.tolist(), prompts, outputs, strict=True):
        output, cap = resolve_max_tokens(raw_output, shape.max_tokens)
        out.append(
            WorkloadRequest(
                arrival, prompt, output, cap,
                tenant=shape.tenant, lane=shape.lane, priority=shape.priority,
                deadline_ms=shape.deadline_ms,
            )
        )  # fmt: skip
    return out
