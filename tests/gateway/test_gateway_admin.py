"""Operations endpoints: admin state and drain behind the admin key, health and readiness."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
import pytest

from tests.gateway.gateway_harness import (
    ADMIN_KEY,
    MODEL,
    Stack,
    assert_retry_headers,
    http_call,
    openai_error,
    stack,
)
from tests.gateway.small_requests import SMALL, post_small, queue_behind_stream

KEY = "sk-admin-tests-tenant"
BODY = """    max_concurrency: 1
    lanes:
      - {name: interactive, max_concurrency: 1, max_queue: 8}
      - {name: batch, max_concurrency: 1}
tenants:
  - {name: a, api_key_env: KEY_A}
"""


@pytest.fixture(scope="module")
def shared() -> Iterator[Stack]:
    """A gateway with one slot and one tenant, for tests that never drain it."""
    with stack(BODY, environ={"KEY_A": KEY}) as live:
        yield live


@pytest.fixture
def gateway() -> Iterator[Stack]:
    """A fresh gateway like ``shared``, for tests that drain it (a drain cannot be undone)."""
    with stack(BODY, environ={"KEY_A": KEY}) as live:
        yield live


def _drain(gateway: Stack) -> None:
    reply = http_call(gateway.base_url, "POST", "/admin/drain", key=ADMIN_KEY)
    assert reply.status == 200
    assert reply.json() == {"draining": True}


def _draining(gateway: Stack) -> bool:
    reply = http_call(gateway.base_url, "GET", "/admin/state", key=ADMIN_KEY)
    return bool(reply.json()["draining"])


def _small(gateway: Stack) -> int:
    return post_small(gateway, KEY)[1].status


@pytest.mark.parametrize("key", [None, "wrong-admin-key", KEY], ids=["none", "wrong", "tenant"])
@pytest.mark.parametrize(("method", "path"), [("GET", "/admin/state"), ("POST", "/admin/drain")])
def test_admin_endpoints_refuse_anything_but_the_admin_key(
    shared: Stack, key: str | None, method: str, path: str
) -> None:
    """Without the admin key (none, a wrong one, or a tenant's API key) the admin endpoints
    answer 401 in OpenAI's shape."""
    reply = http_call(shared.base_url, method, path, key=key)
    assert reply.status == 401
    assert openai_error(reply)["type"] == "authentication_error"


def test_without_a_configured_admin_key_admin_endpoints_are_closed() -> None:
    """With the admin key's variable empty, no token opens ``/admin/state``: not the usual
    admin key, not an empty bearer token."""
    with stack(BODY, environ={"KEY_A": KEY, "SLUICEGATE_ADMIN_KEY": ""}) as gateway:
        statuses = {
            http_call(gateway.base_url, "GET", "/admin/state", headers=headers).status
            for headers in (
                {"Authorization": f"Bearer {ADMIN_KEY}"},
                {"Authorization": "Bearer "},
                {},
            )
        }
    assert statuses == {401}


def test_refused_drain_does_not_drain(gateway: Stack) -> None:
    """A drain refused for lack of the admin key changes nothing: requests are still served."""
    assert http_call(gateway.base_url, "POST", "/admin/drain", key=KEY).status == 401
    assert _small(gateway) == 200
    assert http_call(gateway.base_url, "GET", "/readyz").status == 200


def test_admin_state_describes_models_lanes_and_backends(shared: Stack) -> None:
    """With the admin key, ``/admin/state`` is JSON naming each model's caps, lanes and
    backends, with nothing running or queued at rest."""
    reply = http_call(shared.base_url, "GET", "/admin/state", key=ADMIN_KEY)
    assert reply.status == 200
    state = reply.json()
    assert state["draining"] is False
    (model,) = state["models"]
    assert (model["name"], model["cap"], model["running"], model["queued"]) == (MODEL, 1, 0, 0)
    assert [lane["name"] for lane in model["lanes"]] == ["interactive", "batch"]
    assert [backend["name"] for backend in model["backends"]] == ["e0"]
    assert model["backends"][0]["healthy"] is True


def test_drain_refuses_new_requests_with_503_draining(gateway: Stack) -> None:
    """After a drain every new request gets 503 ``draining`` with retry headers."""
    _drain(gateway)
    reply = http_call(gateway.base_url, "POST", "/v1/completions", json=SMALL, key=KEY)
    assert reply.status == 503
    error = openai_error(reply)
    assert (error["type"], error["code"]) == ("service_unavailable_error", "draining")
    assert_retry_headers(reply)


def test_readyz_is_200_when_serving_and_503_once_draining(gateway: Stack) -> None:
    """``/readyz`` is 200 with a healthy backend and 503 after a drain."""
    assert http_call(gateway.base_url, "GET", "/readyz").status == 200
    _drain(gateway)
    assert http_call(gateway.base_url, "GET", "/readyz").status == 503
    assert _draining(gateway)


def test_healthz_is_200_even_while_draining(gateway: Stack) -> None:
    """``/healthz`` says only that the process is up: 200 before and after a drain."""
    assert http_call(gateway.base_url, "GET", "/healthz").status == 200
    _drain(gateway)
    assert http_call(gateway.base_url, "GET", "/healthz").status == 200


async def test_drain_lets_running_and_queued_requests_finish(gateway: Stack) -> None:
    """A drain stops admitting new requests but finishes those already in: the running
    stream runs to ``[DONE]`` and the queued request is still admitted and served."""
    async with aiohttp.ClientSession() as session:
        running, queued, seen = await queue_behind_stream(
            session, gateway, _small, max_tokens=100, key=KEY
        )
        assert seen
        await asyncio.to_thread(_drain, gateway)
        rest = await running.read()
        running.close()
        queued_status = await queued
        refused = await asyncio.to_thread(_small, gateway)
    assert rest.rstrip().endswith(b"data: [DONE]")
    assert rest.count(b"data: {") == 99 + 1  # the other 99 tokens, then the finish chunk
    assert queued_status == 200
    assert refused == 503
