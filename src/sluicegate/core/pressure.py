"""Cluster pressure: tighten admission lane by lane while an outside signal is high (DESIGN §5).

The gateway polls queries (e.g. Kueue's pending workloads in Prometheus) and feeds
their values to a :class:`PressureController`, which moves a *stage* at most one
step per poll: up while any signal is above its threshold, down while every signal
is at or below its ``clear_below``, unchanged in between. Stage ``k`` tightens the
last ``k`` tightenable lanes of each model (configuration order is priority order,
so best-effort goes first, then batch) to their ``pressure_floor``; a lane whose
floor is its whole cap — by default a model's first lane — is never tightened. A
poll that fails puts the stage back to 0: without a reading the gateway admits as
configured rather than guess.

Pure computation: the poller lives in ``gateway/ops/pressure_loop.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sluicegate.core.spec import LaneSpec, ModelSpec

__all__ = ["PressureController", "PressureSignal", "lane_ceilings", "lane_floor", "max_stage"]


@dataclass(frozen=True, slots=True)
class PressureSignal:
    """One polled signal: above ``threshold`` it tightens, at or below ``clear_below``
    it loosens (``clear_below`` ≤ ``threshold``; equal means no hysteresis)."""

    name: str
    threshold: float
    clear_below: float


def lane_floor(model: ModelSpec, lane: LaneSpec) -> int:
    """The cap ``lane`` keeps when tightened: its ``pressure_floor``, else 0, except the
    model's first lane, which keeps its whole cap unless a floor is set."""
    if lane.pressure_floor is not None:
        return lane.pressure_floor
    return lane.max_concurrency if lane is model.lanes[0] else 0


def _tightenable(model: ModelSpec) -> list[LaneSpec]:
    """The lanes pressure can tighten, in the order it tightens them (last lane first)."""
    lanes = reversed(model.lanes)
    return [lane for lane in lanes if lane_floor(model, lane) < lane.max_concurrency]


def max_stage(models: Sequence[ModelSpec]) -> int:
    """The stage at which every tightenable lane of every model is at its floor."""
    return max((len(_tightenable(model)) for model in models), default=0)


def lane_ceilings(model: ModelSpec, stage: int) -> dict[str, int]:
    """The tightened lanes of ``model`` at ``stage`` and the cap each keeps."""
    return {lane.name: lane_floor(model, lane) for lane in _tightenable(model)[: max(0, stage)]}


class PressureController:
    """The stage, moved one step per poll by the signals' readings."""

    __slots__ = ("_max", "_signals", "stage")

    def __init__(self, signals: Sequence[PressureSignal], stages: int) -> None:
        names = [signal.name for signal in signals]
        if len(set(names)) != len(names):
            raise ValueError(f"pressure signal names must be unique, got {names}")
        for signal in signals:
            if signal.clear_below > signal.threshold:
                raise ValueError(
                    f"pressure signal {signal.name!r}: clear_below ({signal.clear_below})"
                    f" is above threshold ({signal.threshold})"
                )
        self._signals = tuple(signals)
        self._max = max(0, stages)
        self.stage = 0

    @property
    def max_stage(self) -> int:
        """The stage at which every tightenable lane is at its floor."""
        return self._max

    def observe(self, readings: Mapping[str, float] | None) -> int:
        """Take one poll's readings (``None``: the poll failed) and return the new stage.

        A signal missing from ``readings`` (its query returned no series) reads as 0.
        """
        if readings is None:
            self.stage = 0
            return 0
        values = [(signal, readings.get(signal.name, 0.0)) for signal in self._signals]
        if any(value > signal.threshold for signal, value in values):
            self.stage = min(self._max, self.stage + 1)
        elif all(value <= signal.clear_below for signal, value in values):
            self.stage = max(0, self.stage - 1)
        return self.stage

    def above(self, signal: PressureSignal, value: float) -> bool:
        """Whether ``value`` of ``signal`` asks for tightening."""
        return value > signal.threshold
