"""Tests of what we ship for operators under ``deploy/``: Prometheus rules and their promtool
unit tests, the Grafana dashboard, the Kubernetes manifests, and a live Prometheus run.

``tests/deploy/promql.py`` holds the helpers they share: the metric names a PromQL expression
selects, and the series the gateway and the emulator really export.
"""
