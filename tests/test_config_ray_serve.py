"""The config refuses a Ray Serve backend that does not say where its metrics are."""

from __future__ import annotations

import pytest

from sluicegate.config import ConfigError, parse_config

LANES = "    lanes:\n      - {name: interactive}\n"


def _config(backend: str) -> str:
    return f"models:\n  - name: m\n    backends:\n      - {backend}\n{LANES}"


def test_ray_serve_without_metrics_url_is_refused_naming_the_backend() -> None:
    """Serve's metrics live on Ray's metrics-agent port, not on the proxy: without
    ``metrics_url`` the gateway would read nothing, so the config is refused."""
    backend = "{name: serve-a, url: 'http://127.0.0.1:8000', engine: ray-serve}"
    with pytest.raises(ConfigError) as info:
        parse_config(_config(backend))
    message = str(info.value)
    assert "backends[serve-a].metrics_url" in message
    assert "metrics_url" in message
    assert "ray-serve" in message


def test_ray_serve_with_metrics_url_is_accepted() -> None:
    """With ``metrics_url`` the backend validates and keeps it."""
    backend = (
        "{name: serve-a, url: 'http://127.0.0.1:8000', engine: ray-serve,"
        " metrics_url: 'http://127.0.0.1:8080/metrics'}"
    )
    config = parse_config(_config(backend))
    (spec,) = config.models[0].backends
    assert (spec.engine, spec.metrics_url) == ("ray-serve", "http://127.0.0.1:8080/metrics")


def test_other_engines_need_no_metrics_url() -> None:
    """The check is Ray Serve's alone: a vLLM backend scrapes its own ``/metrics``."""
    backend = "{name: v, url: 'http://127.0.0.1:8000', engine: vllm}"
    assert parse_config(_config(backend)).models[0].backends[0].metrics_url is None
