"""Backlog of a queue that starts empty, as reflected Brownian motion: its tail and quantiles.

This module owns the transient estimate's mathematics for the warm buffer
(:mod:`sluicegate.planner.warm_buffer`): the closed-form tail of ``sup_{u≤T}(θu + σB_u)``
(:func:`backlog_exceed_probability`), its quantile (:func:`backlog_quantile`), and
the bisection both it and the other planners use (:func:`bisect_boundary`). Pure
functions of numbers; nothing here knows about replicas, slots or SLOs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["backlog_exceed_probability", "backlog_quantile", "bisect_boundary"]

_SQRT_2PI = math.sqrt(2.0 * math.pi)


def _normal_sf(z: float) -> float:
    """Standard normal survival function Φ̄(z) = P(Z > z)."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _mills_ratio(b: float) -> float:
    """Φ̄(b)/φ(b) for b ≥ 0; an asymptotic series past 30, where both factors underflow."""
    if b < 30.0:
        return _normal_sf(b) * _SQRT_2PI * math.exp(0.5 * b * b)
    inv = 1.0 / (b * b)
    return (1.0 - inv * (1.0 - 3.0 * inv * (1.0 - 5.0 * inv))) / b


def _check_backlog_args(drift: float, variance_rate: float, horizon_s: float) -> None:
    if not math.isfinite(drift):
        raise ValueError(f"drift must be finite, got {drift!r}")
    for name, value in (("variance_rate", variance_rate), ("horizon_s", horizon_s)):
        if not (math.isfinite(value) and value >= 0.0):
            raise ValueError(f"{name} must be finite and >= 0, got {value!r}")


def backlog_exceed_probability(
    x: float, drift: float, variance_rate: float, horizon_s: float
) -> float:
    """P(Q_T > x) for a backlog that starts empty and moves as reflected Brownian motion.

    ``Q_T ~ sup_{u≤T}(θu + σB_u)``, so with ``s = σ√T``:
    ``P(Q_T > x) = Φ̄((x − θT)/s) + e^{2θx/σ²}·Φ̄((x + θT)/s)``. For θ > 0 the
    second term is evaluated as ``φ((x − θT)/s)·Φ̄(b)/φ(b)``, ``b = (x + θT)/s``
    (the same quantity, since the exponents combine), so nothing overflows.
    With σ = 0 or T = 0 the backlog is the fluid one, ``max(θ, 0)·T``.

    Args:
        x: Backlog level (requests), >= 0.
        drift: θ, net growth of the backlog in requests/s (arrivals minus drain).
        variance_rate: σ², variance of the net input per second, >= 0.
        horizon_s: T, seconds since the backlog was empty, >= 0.
    """
    _check_backlog_args(drift, variance_rate, horizon_s)
    if not (math.isfinite(x) and x >= 0.0):
        raise ValueError(f"backlog x must be finite and >= 0, got {x!r}")
    if variance_rate == 0.0 or horizon_s == 0.0:
        return 1.0 if max(drift, 0.0) * horizon_s > x else 0.0
    s = math.sqrt(variance_rate * horizon_s)
    a = (x - drift * horizon_s) / s
    b = (x + drift * horizon_s) / s
    if drift > 0.0:
        reflected = math.exp(-0.5 * a * a) / _SQRT_2PI * _mills_ratio(b)
    else:
        reflected = math.exp(2.0 * drift * x / variance_rate) * _normal_sf(b)
    return min(1.0, _normal_sf(a) + reflected)


def backlog_quantile(q: float, drift: float, variance_rate: float, horizon_s: float) -> float:
    """The q-quantile of the backlog Q_T of :func:`backlog_exceed_probability`, in requests.

    Found by bisection (the tail falls as x grows) to a relative 1e-12,
    returning the upper end so the answer never understates the quantile.

    Args:
        q: Quantile in (0, 1).
        drift: θ in requests/s.
        variance_rate: σ² per second, >= 0.
        horizon_s: T in seconds, >= 0.
    """
    _check_backlog_args(drift, variance_rate, horizon_s)
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile q must be in (0, 1), got {q!r}")
    fluid = max(drift, 0.0) * horizon_s
    spread = math.sqrt(variance_rate * horizon_s)
    if spread <= 1e-9 * fluid or spread == 0.0:
        # The noise is below the float resolution of θT - x: the backlog is the fluid one.
        return fluid
    tail = 1.0 - q
    step = 3.0 * spread
    hi = fluid + step
    while backlog_exceed_probability(hi, drift, variance_rate, horizon_s) > tail:
        step *= 2.0
        hi = fluid + step
    _, hi = bisect_boundary(
        lambda x: backlog_exceed_probability(x, drift, variance_rate, horizon_s) > tail,
        0.0,
        hi,
        1e-12,
    )
    return hi


def bisect_boundary(
    holds: Callable[[float], bool], lo: float, hi: float, rel_tol: float
) -> tuple[float, float]:
    """Narrow ``[lo, hi]`` (``holds(lo)`` true, ``holds(hi)`` false) by bisection until
    ``hi − lo ≤ rel_tol · hi``; the two ends, ``holds`` still true at one and false at the
    other."""
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        if holds(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi
