"""Fitting ``EngineConfig``'s timing coefficients to measured probes.

Each probe is a ``Sample``: a measured time and its features, the multipliers of
``COEFFICIENTS`` with which the engine model predicts it (``predicted = features ·
coefficients``). ``fit_samples`` solves for the coefficients by non-negative least
squares on the *relative* error (each row divided by its measured time, so a 0.2 ms
decode step counts as much as a 200 ms prefill), with some coefficients optionally held
at measured values, and reports each probe's prediction and each group's median and
largest relative error.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sluicegate.engine.engine_config import COEFFICIENTS
from sluicegate.errors import SluicegateError

Matrix = npt.NDArray[np.float64]


class FitError(SluicegateError, ValueError):
    """Samples that cannot be fitted (none, a non-positive time, features of the wrong
    length)."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One probe: what was measured and how the engine model predicts it.

    Attributes:
        group: the kind of probe (``prefill``, ``first token``, ``decode``).
        label: which one (``prompt 512``, ``batch 3 · context 1040``).
        features: one multiplier per name in ``COEFFICIENTS``.
        measured_s: the measured time (a median over the probe's repeats), seconds.
        spread_s: the smallest and largest of the repeats, seconds.
        count: how many values the median is over.
    """

    group: str
    label: str
    features: tuple[float, ...]
    measured_s: float
    spread_s: tuple[float, float]
    count: int

    def predicted_s(self, coefficients: Mapping[str, float]) -> float:
        """The model's time for this probe with ``coefficients``."""
        return sum(
            f * coefficients[name] for f, name in zip(self.features, COEFFICIENTS, strict=True)
        )


@dataclass(frozen=True, slots=True)
class GroupError:
    """How well a fit predicts one group of probes: relative errors |pred/measured − 1|."""

    group: str
    probes: int
    median: float
    largest: float


@dataclass(frozen=True, slots=True)
class Fit:
    """A fit's coefficients (every name in ``COEFFICIENTS``), its samples and their errors."""

    coefficients: dict[str, float]
    samples: tuple[Sample, ...]
    groups: tuple[GroupError, ...]


def nnls(a: Matrix, b: Matrix, tolerance: float | None = None) -> Matrix:
    """The x ≥ 0 minimising ‖a·x − b‖₂ (Lawson and Hanson's active-set algorithm, 1974).

    Columns enter the passive (free) set one at a time, the one whose gradient most
    reduces the residual first; a least-squares solve over the passive set that turns a
    coefficient negative steps back to the boundary and drops it. Ends when no column
    left out would reduce the residual; exact on a consistent system.
    """
    rows, columns = a.shape
    if tolerance is None:
        tolerance = (
            10.0 * float(np.finfo(float).eps) * float(np.abs(a).sum(0).max()) * max(rows, columns)
        )
    x = np.zeros(columns)
    passive = np.zeros(columns, dtype=bool)
    gradient = a.T @ (b - a @ x)
    for _ in range(3 * columns + 3):
        candidates = np.where(passive, -np.inf, gradient)
        if passive.all() or candidates.max() <= tolerance:
            break
        passive[int(np.argmax(candidates))] = True
        while True:
            trial = np.zeros(columns)
            trial[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (trial[passive] > tolerance).all():
                x = trial
                break
            falling = passive & (trial <= tolerance)
            step = float(np.min(x[falling] / (x[falling] - trial[falling])))
            x = x + step * (trial - x)
            passive &= x > tolerance
            x[~passive] = 0.0
        gradient = a.T @ (b - a @ x)
    return x


def fit_samples(samples: Sequence[Sample], fixed: Mapping[str, float] | None = None) -> Fit:
    """Non-negative least squares on relative error over ``samples``.

    ``fixed`` holds coefficients measured directly (they are subtracted from the
    measured times, not fitted); a coefficient no sample's features touch comes out 0.

    Raises:
        FitError: no samples, a non-positive measured time, wrong feature length, or a
            fixed name not in ``COEFFICIENTS``.
    """
    held = dict(fixed or {})
    if not samples:
        raise FitError("nothing to fit: no samples")
    for name in held:
        if name not in COEFFICIENTS:
            raise FitError(f"fixed coefficient {name!r} is not one of {list(COEFFICIENTS)}")
    for sample in samples:
        if len(sample.features) != len(COEFFICIENTS) or not sample.measured_s > 0.0:
            raise FitError(f"bad sample {sample.group} {sample.label}: {sample}")
    free = [i for i, name in enumerate(COEFFICIENTS) if name not in held]
    features = np.array([s.features for s in samples], dtype=float)
    measured = np.array([s.measured_s for s in samples], dtype=float)
    known = np.array([held.get(name, 0.0) for name in COEFFICIENTS])
    weights = 1.0 / measured
    a = features[:, free] * weights[:, None]
    b = (measured - features @ known) * weights
    # Columns span orders of magnitude (1 step vs 10⁶ attention pairs): solve on unit columns.
    scale = np.linalg.norm(a, axis=0)
    used = scale > 0.0
    solution = np.zeros(len(free))
    solution[used] = nnls(a[:, used] / scale[used], b) / scale[used]
    coefficients = {name: float(held.get(name, 0.0)) for name in COEFFICIENTS}
    for index, value in zip(free, solution, strict=True):
        coefficients[COEFFICIENTS[index]] = float(value)
    return Fit(coefficients, tuple(samples), group_errors(samples, coefficients))


def group_errors(
    samples: Sequence[Sample], coefficients: Mapping[str, float]
) -> tuple[GroupError, ...]:
    """Per group (in first-seen order), the median and largest |predicted/measured − 1|."""
    errors: dict[str, list[float]] = {}
    for sample in samples:
        error = abs(sample.predicted_s(coefficients) / sample.measured_s - 1.0)
        errors.setdefault(sample.group, []).append(error)
    return tuple(
        GroupError(group, len(values), statistics.median(values), max(values))
        for group, values in errors.items()
    )
