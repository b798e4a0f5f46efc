"""``/metrics``: Prometheus text carrying DESIGN §10's names, counting what really happened."""

from __future__ import annotations

import math
from dataclasses import dataclass

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from sluicegate.config import parse_config
from sluicegate.gateway.app import build_app as build_gateway
from sluicegate.gateway.ops.kv_metrics import OUTCOMES
from tests.gateway.gateway_harness import (
    ADMIN_KEY,
    MODEL,
    http_call,
    stack,
    start_server,
    stop_servers,
    unused_port,
    wait_until,
)

KEY_A = "sk-canary-metrics-a-5d3c"
KEY_R = "sk-canary-metrics-r-9e1f"
BODY = """    max_concurrency: 6
    lanes:
      - {name: interactive, max_concurrency: 4}
      - {name: batch, max_concurrency: 16}
tenants:
  - {name: a, api_key_env: KEY_A}
  - {name: r, api_key_env: KEY_R, requests_per_s: 0.5, burst_requests: 1}
server: {scrape_interval_s: 0.2}
"""
CHAT_TEXT = "Count my tokens, please."
PROMPT = "tokens counted here"
BACKENDS = ("e0", "e1")


@dataclass(frozen=True)
class Scraped:
    """The metrics text after known traffic, and what that traffic was."""

    text: str
    samples: list[Sample]
    prompt_tokens_a: int


def _traffic(base_url: str) -> int:
    """Two completed requests of tenant a (one streamed), one completed and one rate-limited
    of tenant r; returns tenant a's prompt tokens as the engine reported them."""
    exact = {"ignore_eos": True}
    with openai.OpenAI(base_url=base_url + "/v1", api_key=KEY_A, max_retries=0) as sdk:
        chat = sdk.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": CHAT_TEXT}], max_tokens=5,
            extra_body=exact,
        )  # fmt: skip
        stream = sdk.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=6, stream=True,
            stream_options={"include_usage": True}, extra_body=exact,
        )  # fmt: skip
        with stream:
            usage = [chunk.usage for chunk in stream if chunk.usage is not None]
    with openai.OpenAI(base_url=base_url + "/v1", api_key=KEY_R, max_retries=0) as sdk:
        sdk.completions.create(model=MODEL, prompt="r", max_tokens=4, extra_body=exact)
        with pytest.raises(openai.RateLimitError):
            sdk.completions.create(model=MODEL, prompt="r", max_tokens=4, extra_body=exact)
    assert chat.usage is not None
    return chat.usage.prompt_tokens + usage[-1].prompt_tokens


def _metrics(base_url: str) -> str:
    reply = http_call(base_url, "GET", "/metrics")
    assert reply.status == 200
    return reply.body.decode()


def _all_samples(text: str) -> list[Sample]:
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


@pytest.fixture(scope="module")
def scraped() -> Scraped:
    """Run the traffic through a gateway over two engines, wait for a backend scrape, and
    read ``/metrics`` once."""
    with stack(BODY, engines=2, environ={"KEY_A": KEY_A, "KEY_R": KEY_R}) as gateway:
        prompt_a = _traffic(gateway.base_url)

        def scraped_both() -> bool:
            samples = _all_samples(_metrics(gateway.base_url))
            kv = {s.labels["backend"] for s in samples if s.name.endswith("kv_cache_usage")}
            return kv == set(BACKENDS)

        assert wait_until(scraped_both, 3.0, every_s=0.05)
        text = _metrics(gateway.base_url)
    return Scraped(text, _all_samples(text), prompt_a)


def _value(scraped: Scraped, name: str, **labels: str) -> float:
    """The one sample called ``name`` whose labels include ``labels``."""
    found = [
        s.value
        for s in scraped.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, (name, labels, found)
    return float(found[0])


@pytest.mark.parametrize(
    ("family", "kind"),
    [
        ("sluicegate_queue_wait_seconds", "histogram"),
        ("sluicegate_queue_depth", "gauge"),
        ("sluicegate_inflight_requests", "gauge"),
        ("sluicegate_inflight_tokens", "gauge"),
        ("sluicegate_requests", "counter"),
        ("sluicegate_time_to_first_token_seconds", "histogram"),
        ("sluicegate_request_duration_seconds", "histogram"),
        ("sluicegate_tokens", "counter"),
        ("sluicegate_concurrency_limit", "gauge"),
        ("sluicegate_backend_kv_cache_usage", "gauge"),
        ("sluicegate_backend_healthy", "gauge"),
        ("sluicegate_backend_metrics_age_seconds", "gauge"),
        ("sluicegate_backend_metrics_stale", "gauge"),
        ("sluicegate_model_concurrency_limit", "gauge"),
        ("sluicegate_model_concurrency_floor", "gauge"),
        ("sluicegate_adaptive_limit_enabled", "gauge"),
        ("sluicegate_lane_slo_seconds", "gauge"),
        ("sluicegate_tenant_inflight_requests", "gauge"),
    ],
)
def test_every_spec_metric_is_exposed_with_its_type(
    scraped: Scraped, family: str, kind: str
) -> None:
    """Each DESIGN §10 metric parses as a family of its type (counters as ``<name>_total``)."""
    families = {f.name: f for f in text_string_to_metric_families(scraped.text)}
    assert family in families
    assert families[family].type == kind
    suffix = {"counter": "_total", "histogram": "_count", "gauge": ""}[kind]
    assert any(s.name == family + suffix for s in families[family].samples)


def test_requests_total_counts_completed_and_rejected_by_outcome(scraped: Scraped) -> None:
    """``sluicegate_requests_total`` counts the three served requests as ``completed`` and
    the rate-limited one as ``rejected_rate_limit``, in the lane they were classified to."""
    labels = {"model": MODEL, "lane": "interactive"}
    assert _value(scraped, "sluicegate_requests_total", outcome="completed", **labels) == 3
    assert (
        _value(scraped, "sluicegate_requests_total", outcome="rejected_rate_limit", **labels) == 1
    )


def test_tokens_total_counts_real_usage_per_tenant(scraped: Scraped) -> None:
    """``sluicegate_tokens_total`` holds the engine-reported usage per tenant and kind."""
    name = "sluicegate_tokens_total"
    assert _value(scraped, name, tenant="a", kind="completion") == 5 + 6
    assert _value(scraped, name, tenant="a", kind="prompt") == scraped.prompt_tokens_a
    assert _value(scraped, name, tenant="r", kind="completion") == 4
    assert _value(scraped, name, tenant="r", kind="prompt") == math.ceil(len("r") / 4)


def test_latency_histograms_count_every_served_request(scraped: Scraped) -> None:
    """Queue wait, time to first token and duration each observed the three served requests
    (a refused request is admitted never, so it adds to none of them)."""
    labels = {"model": MODEL, "lane": "interactive"}
    for family in (
        "sluicegate_queue_wait_seconds",
        "sluicegate_time_to_first_token_seconds",
        "sluicegate_request_duration_seconds",
    ):
        assert _value(scraped, family + "_count", **labels) == 3, family


def test_gauges_are_zero_once_every_request_has_ended(scraped: Scraped) -> None:
    """With no client left, queue depth, running requests and in-flight tokens are all 0."""
    for lane in ("interactive", "batch"):
        assert _value(scraped, "sluicegate_queue_depth", model=MODEL, lane=lane) == 0
        assert _value(scraped, "sluicegate_inflight_requests", model=MODEL, lane=lane) == 0
    assert _value(scraped, "sluicegate_inflight_tokens", model=MODEL) == 0
    for tenant in ("a", "r"):  # every configured tenant has its series, 0 when idle
        assert (
            _value(scraped, "sluicegate_tenant_inflight_requests", model=MODEL, tenant=tenant) == 0
        )


def test_concurrency_limit_is_the_lane_cap_within_the_model_cap(scraped: Scraped) -> None:
    """The effective limit per lane is min(lane cap, model cap): 4 and min(16, 6) = 6."""
    name = "sluicegate_concurrency_limit"
    assert _value(scraped, name, model=MODEL, lane="interactive") == 4
    assert _value(scraped, name, model=MODEL, lane="batch") == 6


def test_backend_gauges_come_from_the_scrape(scraped: Scraped) -> None:
    """After a scrape each backend has a KV-cache usage in [0, 1] and is healthy (1)."""
    for backend in BACKENDS:
        usage = _value(scraped, "sluicegate_backend_kv_cache_usage", model=MODEL, backend=backend)
        assert 0.0 <= usage <= 1.0
        assert _value(scraped, "sluicegate_backend_healthy", model=MODEL, backend=backend) == 1


def test_tenant_labels_are_configured_tenant_names(scraped: Scraped) -> None:
    """Tenant label values are tenant names from the config, never anything a client sent."""
    tenants = {s.labels["tenant"] for s in scraped.samples if "tenant" in s.labels}
    assert tenants == {"a", "r"}


def test_no_key_appears_in_the_metrics_text(scraped: Scraped) -> None:
    """Neither tenant API key nor the admin key appears anywhere in ``/metrics``."""
    for secret in (KEY_A, KEY_R, ADMIN_KEY):
        assert secret not in scraped.text


def test_stream_without_usage_counts_only_generated_tokens() -> None:
    """A stream that carries no usage chunk is accounted by the tokens it streamed: with
    ignore_eos, completion tokens in ``sluicegate_tokens_total`` equal max_tokens, summed
    over a chat and a completions stream."""
    with stack() as gateway:
        for path, prompt in (
            ("/v1/completions", {"prompt": "count me"}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "count me"}]}),
        ):
            body = {"model": MODEL, "max_tokens": 7, "ignore_eos": True, "stream": True, **prompt}
            assert http_call(gateway.base_url, "POST", path, json=body).status == 200
        text = _metrics(gateway.base_url)
    completion = [
        s.value
        for s in _all_samples(text)
        if s.name == "sluicegate_tokens_total" and s.labels["kind"] == "completion"
    ]
    assert completion == [7 + 7]


@pytest.mark.parametrize(
    ("family", "kind"),
    [("sluicegate_kv_events", "counter"), ("sluicegate_kv_index_blocks", "gauge")],
)
def test_kv_event_metrics_are_exposed_with_their_types(family: str, kind: str) -> None:
    """With a backend subscribed to KV events (DESIGN §10), both families parse as their
    type, every outcome and the index size at 0 before any event; a backend without
    ``kv_events`` has neither."""
    config = parse_config(
        f"models:\n  - name: {MODEL}\n    backends:\n"
        f"      - {{name: e0, url: 'http://127.0.0.1:{unused_port()}',"
        f" kv_events: {{endpoint: 'tcp://127.0.0.1:{unused_port()}'}}}}\n"
        f"      - {{name: e1, url: 'http://127.0.0.1:{unused_port()}'}}\n"
    )
    running = start_server(build_gateway(config, scrape=False))
    try:
        text = _metrics(f"http://127.0.0.1:{running.port}")
    finally:
        stop_servers([running])
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families[family].type == kind
    suffix = {"counter": "_total", "gauge": ""}[kind]
    samples = {
        (s.labels["backend"], s.labels.get("outcome")): s.value for s in families[family].samples
    }
    if kind == "counter":
        assert set(samples) == {("e0", o) for o in OUTCOMES}
    else:
        assert set(samples) == {("e0", None)}
    assert set(samples.values()) == {0.0}
    assert all(s.name == family + suffix for s in families[family].samples)
