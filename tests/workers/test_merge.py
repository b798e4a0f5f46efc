"""Merging the workers' Prometheus texts into one exposition (``distributed/siblings.py``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.gateway.distributed.siblings import merge_metrics, worker_up_family


def worker_text(requests: float, depth: float) -> str:
    """One worker's exposition: a labelled counter, an unlabelled gauge, a histogram."""
    registry = CollectorRegistry()
    Counter("t_requests", "Requests.", ["model"], registry=registry).labels("m").inc(requests)
    Gauge("t_depth", "Depth.", registry=registry).set(depth)
    Histogram("t_wait_seconds", "Wait.", ["lane"], registry=registry).labels("a").observe(0.2)
    return generate_latest(registry).decode()


def test_every_sample_gets_its_worker_and_every_family_one_header() -> None:
    """Two workers' texts become one that the Prometheus parser reads, with each family
    once, each sample labelled by its worker, labels and values kept."""
    merged = merge_metrics([(0, worker_text(3, 1)), (1, worker_text(5, 2))])
    merged += worker_up_family({0: True, 1: False})
    families = {f.name: f for f in text_string_to_metric_families(merged)}
    types = [line for line in merged.splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types)), merged
    assert {"t_requests", "t_depth", "t_wait_seconds", "sluicegate_worker_up"} <= set(families)
    requests = {
        s.labels["worker"]: (s.labels["model"], s.value)
        for s in families["t_requests"].samples
        if s.name == "t_requests_total"
    }
    assert requests == {"0": ("m", 3.0), "1": ("m", 5.0)}
    depth = {s.labels["worker"]: s.value for s in families["t_depth"].samples}
    assert depth == {"0": 1.0, "1": 2.0}
    buckets = [s for s in families["t_wait_seconds"].samples if s.name.endswith("_bucket")]
    assert {s.labels["worker"] for s in buckets} == {"0", "1"}
    assert all(set(s.labels) == {"worker", "lane", "le"} for s in buckets)
    up = {s.labels["worker"]: s.value for s in families["sluicegate_worker_up"].samples}
    assert up == {"0": 1.0, "1": 0.0}


def test_a_family_only_one_worker_has_is_kept() -> None:
    """A family that exists in the second worker only (created on its first request)
    still appears, with its header."""
    registry = CollectorRegistry()
    Counter("t_only", "Only here.", registry=registry).inc()
    merged = merge_metrics([(0, worker_text(1, 0)), (1, generate_latest(registry).decode())])
    families = {f.name: f for f in text_string_to_metric_families(merged)}
    totals = [s for s in families["t_only"].samples if s.name == "t_only_total"]
    assert [(s.labels, s.value) for s in totals] == [({"worker": "1"}, 1.0)]
