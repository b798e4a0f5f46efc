"""A backend whose metrics stop coming counts as full (``metrics_stale_after_s``): it gets
no new request until a scrape succeeds again, and says so in ``/admin/state``, in
``sluicegate_backend_metrics_age_seconds`` / ``_stale`` and on the dashboard.

The engine is a real emulator; its metrics page is served by a second real server on
loopback (the backend's ``metrics_url``) that the test can break, as a wedged exporter or
a failing scrape would.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sluicegate.config import parse_config
from sluicegate.core.spec import ModelSpec
from sluicegate.emulator import build_app as build_emulator
from sluicegate.engine import preset
from sluicegate.gateway.app import build_app as build_gateway
from tests.gateway.gateway_harness import (
    ADMIN_KEY,
    MODEL,
    backend_state,
    http_call,
    metric,
    start_server,
    stop_servers,
    wait_until,
)

PAGE = b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n"
STALE_S = 0.4


@dataclass
class MetricsPage:
    """A metrics endpoint that answers the page, or 500 once ``broken`` is set."""

    broken: threading.Event

    async def serve(self, request: Request) -> Response:
        """``GET /metrics``."""
        if self.broken.is_set():
            return Response(b"exporter failed", status_code=500)
        return Response(PAGE, media_type="text/plain")


@dataclass(frozen=True)
class Rig:
    """The gateway's URL and the switch that breaks the engine's metrics."""

    base_url: str
    page: MetricsPage


@contextmanager
def rig() -> Iterator[Rig]:
    """An emulator, its breakable metrics page and a gateway scraping every 0.05 s."""
    page = MetricsPage(threading.Event())
    running = [
        start_server(build_emulator(preset("tiny"), model=MODEL)),
        start_server(Starlette(routes=[Route("/metrics", page.serve)])),
    ]
    try:
        engine, exporter = (f"http://127.0.0.1:{one.port}" for one in running)
        config = parse_config(
            "server: {scrape_interval_s: 0.05}\n"
            f"models:\n  - name: {MODEL}\n    metrics_stale_after_s: {STALE_S}\n"
            f"    backends:\n      - {{name: e0, url: '{engine}', engine: emulator,"
            f" metrics_url: '{exporter}/metrics'}}\n"
        )
        app = build_gateway(config, environ={"SLUICEGATE_ADMIN_KEY": ADMIN_KEY})
        running.append(start_server(app))
        yield Rig(f"http://127.0.0.1:{running[-1].port}", page)
    finally:
        stop_servers(running)


def _chat(base_url: str) -> int:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return http_call(base_url, "POST", "/v1/chat/completions", json=body, timeout=10.0).status


def test_stale_metrics_hold_new_requests_until_a_scrape_succeeds() -> None:
    """Fresh metrics: a request is served, age below the bound. Broken: within the bound
    plus a few scrapes the backend shows stale (admin state and metrics) and a request
    waits rather than being sent; mended: the waiting request is served."""
    with rig() as live:
        assert wait_until(
            lambda: backend_state(live.base_url, "e0")["metrics_age_s"] is not None, 5
        )
        assert _chat(live.base_url) == 200
        assert backend_state(live.base_url, "e0")["metrics_stale"] is False
        assert metric(live.base_url, "sluicegate_backend_metrics_stale", backend="e0") == 0.0
        live.page.broken.set()
        assert wait_until(lambda: backend_state(live.base_url, "e0")["metrics_stale"], 5)
        age = metric(live.base_url, "sluicegate_backend_metrics_age_seconds", backend="e0")
        assert age is not None
        assert age > STALE_S
        assert metric(live.base_url, "sluicegate_backend_metrics_stale", backend="e0") == 1.0
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(_chat, live.base_url)
            assert not wait_until(waiting.done, 0.6), "sent to a backend whose metrics are stale"
            live.page.broken.clear()
            assert waiting.result(timeout=10.0) == 200
        assert backend_state(live.base_url, "e0")["metrics_stale"] is False


def test_a_backend_never_scraped_is_not_stale() -> None:
    """An engine without metrics (404: none to go stale) serves as before."""
    running = [start_server(build_emulator(preset("tiny"), model=MODEL))]
    try:
        url = f"http://127.0.0.1:{running[0].port}"
        config = parse_config(
            "server: {scrape_interval_s: 0.05}\n"
            f"models:\n  - name: {MODEL}\n    metrics_stale_after_s: 0.1\n"
            f"    backends:\n      - {{name: e0, url: '{url}', engine: llamacpp}}\n"
        )
        app = build_gateway(config, environ={"SLUICEGATE_ADMIN_KEY": ADMIN_KEY})
        running.append(start_server(app))
        base = f"http://127.0.0.1:{running[-1].port}"
        assert not wait_until(lambda: backend_state(base, "e0")["metrics_stale"], 0.5)
        assert backend_state(base, "e0")["metrics_age_s"] is None
        assert _chat(base) == 200
    finally:
        stop_servers(running)


@pytest.mark.parametrize("value", ["0", "-1"])
def test_the_bound_must_be_positive_or_null(value: str) -> None:
    """``metrics_stale_after_s`` takes a positive number of seconds, or null for never."""
    with pytest.raises(ValueError, match="metrics_stale_after_s"):
        parse_config(
            f"models:\n  - name: m\n    metrics_stale_after_s: {value}\n"
            "    backends: [{name: b, url: 'http://127.0.0.1:1'}]\n"
        )
    spec = ModelSpec.model_validate(
        {"name": "m", "metrics_stale_after_s": None, "backends": [{"name": "b"}]}
    )
    assert spec.metrics_stale_after_s is None
