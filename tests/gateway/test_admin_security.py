"""Admin actions are not cross-site forgeable, a drain can be undone, and what ``/metrics``
shows is the operator's choice; over real HTTP against a gateway and an emulated engine.

A browser that opened ``/dashboard`` caches the HTTP Basic credentials and sends them with
any form another site makes it post: that once drained the gateway. State-changing admin
endpoints now take the key only as a bearer token (a page cannot set one on a form or, without
CORS, on a cross-site fetch), and refuse what a browser marks as coming from another site.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.config import ConfigError
from sluicegate.gateway.app import build_app
from tests.gateway.gateway_harness import (
    ADMIN_KEY,
    MODEL,
    Reply,
    Stack,
    gateway_config,
    http_call,
    openai_error,
    stack,
)

TENANT_NAME = "tenant-name-canary-3f1e"
TENANT_KEY = "sk-admin-security-tenant"
METRICS_KEY = "metrics-key-canary-77c2"
BODY = f"""    max_concurrency: 2
tenants:
  - {{name: {TENANT_NAME}, api_key_env: KEY_T}}
"""
ENVIRON = {"KEY_T": TENANT_KEY}
SMALL = {"model": MODEL, "prompt": "hi", "max_tokens": 3, "ignore_eos": True}
EVIL = "https://evil.example"


def basic(password: str) -> str:
    """An ``Authorization: Basic`` value with ``password`` (as a browser caches it)."""
    return "Basic " + base64.b64encode(f"admin:{password}".encode()).decode()


@pytest.fixture
def gateway() -> Iterator[Stack]:
    """A fresh gateway with one tenant (the tests drain it)."""
    with stack(BODY, environ=ENVIRON) as live:
        yield live


def _own_origin(gateway: Stack) -> str:
    return f"http://127.0.0.1:{gateway.gateway_port}"


def _post(gateway: Stack, path: str, headers: dict[str, str], body: bytes | None = None) -> Reply:
    return http_call(gateway.base_url, "POST", path, body=body, headers=headers)


def _draining(gateway: Stack) -> bool:
    reply = http_call(gateway.base_url, "GET", "/admin/state", key=ADMIN_KEY)
    return bool(reply.json()["draining"])


def _serves(gateway: Stack) -> bool:
    ready = http_call(gateway.base_url, "GET", "/readyz").status == 200
    reply = http_call(gateway.base_url, "POST", "/v1/completions", json=SMALL, key=TENANT_KEY)
    return ready and reply.status == 200


def test_a_cross_site_form_post_with_cached_basic_credentials_does_not_drain(
    gateway: Stack,
) -> None:
    """The attack as observed: a form on another site posts to ``/admin/drain`` and the
    browser adds the Basic credentials it cached for the dashboard. 403
    ``cross_site_request``; the gateway still serves."""
    reply = _post(
        gateway,
        "/admin/drain",
        {
            "Authorization": basic(ADMIN_KEY),
            "Content-Type": "application/x-www-form-urlencoded",
            "Origin": EVIL,
            "Sec-Fetch-Site": "cross-site",
            "Sec-Fetch-Mode": "navigate",
        },
        b"go=1",
    )
    assert reply.status == 403, reply
    assert openai_error(reply)["code"] == "cross_site_request"
    assert not _draining(gateway)
    assert _serves(gateway)


CROSS_SITE = {
    "sec-fetch-site cross-site": {"Sec-Fetch-Site": "cross-site"},
    "sec-fetch-site same-site": {"Sec-Fetch-Site": "same-site"},
    "foreign origin": {"Origin": EVIL},
    "null origin": {"Origin": "null"},
    "same host, other port": {"Origin": "http://127.0.0.1:1"},
    "other scheme": {"Origin": "ftp://127.0.0.1"},
}


@pytest.mark.parametrize("case", sorted(CROSS_SITE))
@pytest.mark.parametrize("path", ["/admin/drain", "/admin/undrain"])
def test_cross_site_marks_are_refused_even_with_the_bearer_key(
    gateway: Stack, case: str, path: str
) -> None:
    """With the right bearer key, a request a browser marks as another site's (or whose
    ``Origin`` is not this gateway's) is 403 and changes nothing."""
    reply = _post(gateway, path, {"Authorization": f"Bearer {ADMIN_KEY}", **CROSS_SITE[case]})
    assert reply.status == 403, reply
    assert openai_error(reply)["code"] == "cross_site_request"
    assert not _draining(gateway)


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/x-www-form-urlencoded", b"a=1"),
        ("multipart/form-data; boundary=x", b"--x--\r\n"),
        ("text/plain", b"{}"),
        (None, b"{}"),
    ],
    ids=["urlencoded", "multipart", "text-plain", "untyped"],
)
def test_a_body_that_is_not_json_is_415(
    gateway: Stack, content_type: str | None, body: bytes
) -> None:
    """A simple-form body (what a form can send) is refused 415 ``unsupported_media_type``
    even with the bearer key, and the gateway does not drain."""
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    reply = _post(gateway, "/admin/drain", headers, body)
    assert reply.status == 415, reply
    assert openai_error(reply)["code"] == "unsupported_media_type"
    assert not _draining(gateway)


def test_basic_credentials_do_not_drain_even_from_the_same_origin(gateway: Stack) -> None:
    """HTTP Basic is for the read-only dashboard: a same-origin POST with it is 401 (with no
    ``WWW-Authenticate`` challenge), while ``GET /admin/state`` still takes it."""
    headers = {"Authorization": basic(ADMIN_KEY), "Origin": _own_origin(gateway)}
    reply = _post(gateway, "/admin/drain", {**headers, "Sec-Fetch-Site": "same-origin"})
    assert reply.status == 401, reply
    assert openai_error(reply)["code"] == "invalid_admin_key"
    assert "www-authenticate" not in reply.headers
    state = http_call(gateway.base_url, "GET", "/admin/state", headers=headers)
    assert state.status == 200
    assert state.json()["draining"] is False


def test_a_same_origin_bearer_drain_works_and_undrain_restores_readiness_and_inference(
    gateway: Stack,
) -> None:
    """What a browser on the gateway's own page (or a tool) sends: drain is 200 and takes
    effect (``/readyz`` 503, inference 503 ``draining``); ``/admin/undrain`` is 200
    ``{"draining": false}`` and both serve again."""
    headers = {
        "Authorization": f"Bearer {ADMIN_KEY}",
        "Origin": _own_origin(gateway),
        "Sec-Fetch-Site": "same-origin",
        "Content-Type": "application/json",
    }
    drained = _post(gateway, "/admin/drain", headers, b"{}")
    assert (drained.status, drained.json()) == (200, {"draining": True})
    assert http_call(gateway.base_url, "GET", "/readyz").status == 503
    refused = http_call(gateway.base_url, "POST", "/v1/completions", json=SMALL, key=TENANT_KEY)
    assert refused.status == 503
    assert openai_error(refused)["code"] == "draining"

    undrained = _post(gateway, "/admin/undrain", {"Authorization": f"Bearer {ADMIN_KEY}"})
    assert (undrained.status, undrained.json()) == (200, {"draining": False})
    assert not _draining(gateway)
    assert _serves(gateway)


def test_undrain_needs_the_admin_key(gateway: Stack) -> None:
    """A tenant key (or none) cannot undo a drain: 401, and the gateway stays drained."""
    assert _post(gateway, "/admin/drain", {"Authorization": f"Bearer {ADMIN_KEY}"}).status == 200
    for key in (TENANT_KEY, None):
        headers = {} if key is None else {"Authorization": f"Bearer {key}"}
        assert _post(gateway, "/admin/undrain", headers).status == 401
    assert _draining(gateway)


@pytest.mark.parametrize(
    ("method", "path", "key"),
    [
        ("GET", "/admin/state", ADMIN_KEY),
        ("GET", "/admin/state", None),
        ("POST", "/admin/drain", None),
        ("POST", "/admin/undrain", TENANT_KEY),
        ("GET", "/admin/batches", ADMIN_KEY),
        ("GET", "/admin/no-such-path", ADMIN_KEY),
        ("GET", "/dashboard", None),
        ("GET", "/dashboard/app.js", ADMIN_KEY),
    ],
)
def test_every_answer_under_admin_and_dashboard_is_no_store(
    gateway: Stack, method: str, path: str, key: str | None
) -> None:
    """``Cache-Control: no-store`` on every answer under ``/admin`` and ``/dashboard``:
    served, refused or unknown; a proxy or the browser keeps none of them."""
    reply = http_call(gateway.base_url, method, path, key=key)
    assert reply.headers.get("cache-control") == "no-store", (reply.status, reply.headers)


def _metrics(gateway: Stack, key: str | None = None) -> Reply:
    return http_call(gateway.base_url, "GET", "/metrics", key=key)


def test_with_a_metrics_key_metrics_needs_it() -> None:
    """``server.metrics_key_env``: ``/metrics`` without a key or with a wrong one (a tenant's)
    is 401 ``invalid_metrics_key`` in OpenAI's shape, without the key in the body; with the
    metrics key (or the admin key) it is the Prometheus text."""
    body = BODY + "server: {metrics_key_env: TEST_METRICS_KEY}\n"
    with stack(body, environ={**ENVIRON, "TEST_METRICS_KEY": METRICS_KEY}) as gateway:
        for key in (None, TENANT_KEY, "wrong"):
            refused = _metrics(gateway, key)
            assert refused.status == 401, refused
            assert openai_error(refused)["code"] == "invalid_metrics_key"
            assert METRICS_KEY not in refused.body.decode()
        for key in (METRICS_KEY, ADMIN_KEY):
            served = _metrics(gateway, key)
            assert served.status == 200
            assert "sluicegate_requests_total" in served.body.decode()


def test_without_a_metrics_key_metrics_stays_open() -> None:
    """The default: no ``metrics_key_env``, ``/metrics`` answers anyone (as before)."""
    with stack(BODY, environ=ENVIRON) as gateway:
        assert _metrics(gateway).status == 200


def test_a_metrics_key_variable_that_is_unset_refuses_to_start() -> None:
    """A ``metrics_key_env`` naming an unset variable is a config error naming it, never a
    ``/metrics`` that is silently open."""
    config = gateway_config([1], BODY + "server: {metrics_key_env: UNSET_METRICS_KEY}\n")
    with pytest.raises(ConfigError, match="UNSET_METRICS_KEY"):
        build_app(config, environ=ENVIRON, scrape=False)


def _tenant_values(text: str) -> set[str]:
    return {
        sample.labels["tenant"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if "tenant" in sample.labels
    }


@pytest.mark.parametrize("mode", ["name", "hash", "none"])
def test_the_tenant_label_mode_decides_what_metrics_show(mode: str) -> None:
    """After one request of the tenant: ``name`` shows its name; ``hash`` the first 12 hex
    digits of its SHA-256 and never the name; ``none`` no tenant label at all (tokens summed
    per model). ``/admin/state`` keeps the name in every mode (the admin is trusted)."""
    body = BODY + f"server: {{metrics_tenant_label: {mode}}}\n"
    with stack(body, environ=ENVIRON) as gateway:
        served = http_call(gateway.base_url, "POST", "/v1/completions", json=SMALL, key=TENANT_KEY)
        assert served.status == 200
        text = _metrics(gateway).body.decode()
        state = http_call(gateway.base_url, "GET", "/admin/state", key=ADMIN_KEY).json()
    digest = hashlib.sha256(TENANT_NAME.encode()).hexdigest()[:12]
    expected = {"name": {TENANT_NAME}, "hash": {digest}, "none": set()}[mode]
    assert _tenant_values(text) == expected, text
    if mode != "name":
        assert TENANT_NAME not in text
    assert "sluicegate_tokens_total" in text
    assert [t["tenant"] for t in state["models"][0]["tenants"]] == [TENANT_NAME]
