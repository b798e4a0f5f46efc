"""Prometheus gauges of the pressure loop (DESIGN §10), read at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from sluicegate.core.scheduler import Scheduler
from sluicegate.gateway.ops.pressure_loop import PressureLoop

__all__ = ["PressureGauges"]


class PressureGauges(Collector):
    """``sluicegate_pressure_stage``, ``_up``, ``_poller``, ``_signal{signal}``,
    ``_threshold{signal}`` and ``_tightened{model,lane}`` of one pressure loop."""

    def __init__(self, loop: PressureLoop, scheduler: Scheduler) -> None:
        self._loop = loop
        self._scheduler = scheduler

    def collect(self) -> Iterator[GaugeMetricFamily]:
        loop = self._loop
        yield GaugeMetricFamily(
            "sluicegate_pressure_stage",
            "Lanes tightened by cluster pressure per model (0: admission as configured).",
            value=loop.stage,
        )
        yield GaugeMetricFamily(
            "sluicegate_pressure_up",
            "1 if every pressure query answered at the last poll.",
            value=1.0 if loop.up else 0.0,
        )
        yield GaugeMetricFamily(
            "sluicegate_pressure_poller",
            "1 if this process polls Prometheus (the fleet's poller, or polling on its own).",
            value=1.0 if loop.polls else 0.0,
        )
        signal = GaugeMetricFamily(
            "sluicegate_pressure_signal", "Last value of a pressure query.", labels=["signal"]
        )
        threshold = GaugeMetricFamily(
            "sluicegate_pressure_threshold",
            "Value of a pressure query above which a lane is tightened.",
            labels=["signal"],
        )
        for spec in loop.signals:
            value = loop.readings[spec.name]
            if value is not None:
                signal.add_metric([spec.name], value)
            threshold.add_metric([spec.name], spec.threshold)
        tightened = GaugeMetricFamily(
            "sluicegate_pressure_tightened",
            "1 while cluster pressure holds the lane at its pressure floor.",
            labels=["model", "lane"],
        )
        for name in self._scheduler.models():
            for lane in self._scheduler.view(name).lanes:
                tightened.add_metric([name, lane.name], 1.0 if lane.tightened else 0.0)
        yield from (signal, threshold, tightened)
