"""A prometheus-client registry whose metrics all carry the same labels with the same values
(an engine's ``model_name`` and the like): what the personalities' metrics share."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Reading = tuple[str, str, Callable[[], float]]
"""A gauge: its name, its help text, and what it reads at scrape time."""


class LabelledRegistry:
    """Metrics in a registry of their own, each labelled ``labels`` = ``values``.

    Args:
        labels: the label names every metric carries.
        values: their values.
    """

    content_type = CONTENT_TYPE

    def __init__(self, labels: tuple[str, ...], values: tuple[str, ...]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.labels = labels
        self.values = values

    def gauges(self, readings: Iterable[Reading]) -> None:
        """A gauge per reading, computed when scraped."""
        for name, doc, read in readings:
            gauge = Gauge(name, doc, self.labels, registry=self.registry)
            gauge.labels(*self.values).set_function(read)

    def counter(self, name: str, doc: str) -> Counter:
        """A counter (exported as ``name_total``)."""
        counter = Counter(name, doc, self.labels, registry=self.registry)
        child: Counter = counter.labels(*self.values)
        return child

    def counters_by(
        self, name: str, doc: str, label: str, keys: Iterable[str]
    ) -> dict[str, Counter]:
        """A counter with one more label, its child per key."""
        family = Counter(name, doc, [*self.labels, label], registry=self.registry)
        return {key: family.labels(*self.values, key) for key in keys}

    def histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        """A histogram with ``buckets``."""
        histogram = Histogram(name, doc, self.labels, buckets=buckets, registry=self.registry)
        child: Histogram = histogram.labels(*self.values)
        return child

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
