"""Running requests per tenant and each replica's view of the store (issue 29, "Visibility"),
in ``/admin/state`` and ``/metrics``: three replicas on a real Redis with tenants running on
different replicas, and one gateway in memory mode."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import orjson
import pytest
from jsonschema import Draft202012Validator
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.gateway.ops.ops_endpoints import openapi_document
from tests.gateway.gateway_harness import (
    MODEL,
    admin_state,
    http_call,
    model_state,
    open_stream,
    stack,
    wait_until,
)
from tests.gateway.replica_trio import HOLDS, REPLICA_TENANTS, Trio, expected_rows, holding
from tests.gateway.replica_trio import running_trio as trio_of_replicas

MODES = ("global", "rejoining", "fail_open", "fail_closed")
STATE_SCHEMA = Draft202012Validator(
    {
        "$ref": "#/components/schemas/AdminState",
        "components": orjson.loads(openapi_document())["components"],
    }
)
"""``/admin/state``'s schema in the OpenAPI document."""


@pytest.fixture(scope="module")
def trio() -> Iterator[Trio]:
    """The three replicas (``tests/gateway/replica_trio.py``); the last test pauses Redis."""
    with trio_of_replicas() as running:
        yield running


def samples(base_url: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample ``name`` of the gateway's ``/metrics``: sorted labels → value."""
    text = http_call(base_url, "GET", "/metrics").body.decode()
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def per_tenant(base_url: str, name: str) -> dict[str, float]:
    """A ``{model, tenant}`` gauge of the model: tenant → value."""
    return {
        dict(labels)["tenant"]: value
        for labels, value in samples(base_url, name).items()
        if dict(labels)["model"] == MODEL
    }


def global_rows(base_url: str) -> Any:
    """The store's running requests per tenant as ``/admin/state`` last read them."""
    read = admin_state(base_url)["store"]["global_tenants"]
    return None if read is None else read["models"].get(MODEL)


def totals(rows: list[dict[str, Any]], configured: str) -> dict[str, float]:
    """What a per-tenant gauge shows for ``rows``: every configured tenant (0 when idle) and
    any other bucket that runs something."""
    found = dict.fromkeys(configured, 0.0)
    found.update({row["tenant"]: float(row["running"]) for row in rows})
    return found


async def test_every_replica_shows_the_global_running_requests_per_tenant(trio: Trio) -> None:
    """Six long requests of four tenants over three replicas: every replica's
    ``/admin/state`` shows the same running requests per tenant and lane (summed over the
    replicas: a tenant on two replicas counts both; ``d``, configured on gw2 only, is
    ``other`` on gw0 and gw1), its own ``tenants_running`` only what runs on it (the three
    summing to the global figures), and ``sluicegate_store_global_tenant_running`` and
    ``sluicegate_tenant_inflight_requests`` the same numbers. When the requests end, every
    count returns to zero."""
    async with holding(trio):
        for replica in range(3):
            url = trio.url(replica)
            shows = wait_until(lambda u=url, r=replica: global_rows(u) == expected_rows(r), 5.0)
            assert shows, (replica, global_rows(url))
        assert global_rows(trio.url(0)) == global_rows(trio.url(1))
        assert [r["tenant"] for r in global_rows(trio.url(2))] == ["a", "b", "c", "d"]
        summed: dict[str, int] = {}
        for replica in range(3):
            url = trio.url(replica)
            own = [hold for hold in HOLDS if hold[0] == replica]
            local = model_state(url)["tenants_running"]
            assert local == expected_rows(replica, own), (replica, local)
            for row in expected_rows(2, own):  # named as gw2 names them: every tenant
                summed[row["tenant"]] = summed.get(row["tenant"], 0) + row["running"]
            configured = REPLICA_TENANTS[replica]
            gauge = per_tenant(url, "sluicegate_store_global_tenant_running")
            assert gauge == totals(expected_rows(replica), configured), (replica, gauge)
            gauge = per_tenant(url, "sluicegate_tenant_inflight_requests")
            assert gauge == totals(expected_rows(replica, own), configured), (replica, gauge)
        assert summed == {row["tenant"]: row["running"] for row in expected_rows(2)}
        for replica in range(3):
            STATE_SCHEMA.validate(admin_state(trio.url(replica)))
        store = admin_state(trio.url(0))["store"]
        assert store["global_tenants"]["error"] is None
        assert 0.0 <= store["global_tenants"]["age_s"] < 5.0
    for replica in range(3):
        url = trio.url(replica)
        assert wait_until(lambda u=url: global_rows(u) == [], 5.0), global_rows(url)
        assert model_state(url)["tenants_running"] == []
        idle = per_tenant(url, "sluicegate_store_global_tenant_running")
        assert idle == dict.fromkeys(REPLICA_TENANTS[replica], 0.0)
        assert admin_state(url)["store"]["fallbacks"] == 0


def view(base_url: str) -> dict[str, Any]:
    """The replica's ``store`` in ``/admin/state`` and its state's ``time`` (the state checked
    against the OpenAPI document)."""
    state = admin_state(base_url)
    STATE_SCHEMA.validate(state)
    return {**state["store"], "time": state["time"]}


def modes(base_url: str) -> dict[str, float]:
    """``sluicegate_store_mode``: mode → value."""
    found = samples(base_url, "sluicegate_store_mode")
    return {dict(labels)["mode"]: value for labels, value in found.items()}


def every_replica_in(trio: Trio, mode: str, within_s: float) -> None:
    """Wait until every replica's link is in ``mode``; fail naming the first that is not."""
    for replica in range(3):
        url = trio.url(replica)
        assert wait_until(lambda u=url: view(u)["mode"] == mode, within_s), view(url)


def test_each_replica_reports_its_mode_since_when_its_last_sync_and_its_fallbacks(
    trio: Trio,
) -> None:
    """In global mode each replica reports when it entered it, no fallback, and a last sync
    a fraction of a second old (the heartbeat fills every 0.25 s) with its round trip; the
    metrics agree. With Redis paused every replica falls back once (``fail_open`` since
    then, its last sync ageing, no global per-tenant gauge); resumed, each is global again
    from a later moment, with one fallback counted and a fresh sync."""
    url = trio.url(1)
    before = view(url)
    assert (before["mode"], before["fallbacks"]) == ("global", 0)
    assert before["mode_since"] <= before["time"]
    assert 0.0 <= before["last_sync"]["age_s"] < 1.0, before
    assert 0.0 < before["last_sync"]["round_trip_s"] < 0.25, before
    assert modes(url) == {mode: float(mode == "global") for mode in MODES}
    (age,) = samples(url, "sluicegate_store_last_sync_age_seconds").values()
    assert 0.0 <= age < 1.0
    (round_trip,) = samples(url, "sluicegate_store_last_sync_round_trip_seconds").values()
    assert 0.0 < round_trip < 0.25

    trio.redis.pause()
    try:
        every_replica_in(trio, "fail_open", 5.0)
        during = view(url)
        assert during["fallbacks"] == 1
        assert during["mode_since"] > before["mode_since"]
        assert modes(url) == {mode: float(mode == "fail_open") for mode in MODES}
        assert per_tenant(url, "sluicegate_store_global_tenant_running") == {}
        time.sleep(0.3)
        later = view(url)
        assert later["last_sync"]["age_s"] >= during["last_sync"]["age_s"] + 0.25
    finally:
        trio.redis.resume()
    every_replica_in(trio, "global", 10.0)
    after = view(url)
    assert after["fallbacks"] == 1
    assert after["mode_since"] > during["mode_since"]
    assert wait_until(lambda: view(url)["last_sync"]["age_s"] < 1.0, 2.0)
    assert modes(url) == {mode: float(mode == "global") for mode in MODES}
    assert [view(trio.url(r))["fallbacks"] for r in range(3)] == [1, 1, 1]


async def test_in_memory_mode_the_gateway_counts_its_own_running_requests_per_tenant() -> None:
    """One gateway, no store: ``tenants_running`` lists each tenant's running requests per
    lane, a request with ``n: 2`` counting once (the lane's ``running`` counts its two
    sequences), and ``sluicegate_tenant_inflight_requests`` agrees; idle, both are zero."""
    body = (
        "    max_concurrency: 8\n"
        "    lanes:\n"
        "      - {name: interactive, max_concurrency: 4}\n"
        "      - {name: batch, max_concurrency: 4}\n"
        "tenants:\n"
        "  - {name: a, api_key_env: KEY_A, default_lane: interactive}\n"
        "  - {name: b, api_key_env: KEY_B, default_lane: batch}\n"
    )
    with stack(body, environ={"KEY_A": "sk-mem-a", "KEY_B": "sk-mem-b"}) as gateway:
        url = gateway.base_url
        async with aiohttp.ClientSession() as session:
            held = [await open_stream(session, url, key="sk-mem-a") for _ in range(2)]
            two = {"model": MODEL, "prompt": "twice", "max_tokens": 5000, "n": 2,
                   "ignore_eos": True, "stream": True}  # fmt: skip
            headers = {"Authorization": "Bearer sk-mem-b"}
            held.append(await session.post(url + "/v1/completions", json=two, headers=headers))
            assert held[-1].status == 200
            await held[-1].content.readline()
            try:
                state = model_state(url)
                assert state["tenants_running"] == [
                    {"tenant": "a", "running": 2, "lanes": {"interactive": 2}},
                    {"tenant": "b", "running": 1, "lanes": {"batch": 1}},
                ]
                batch = next(lane for lane in state["lanes"] if lane["name"] == "batch")
                assert batch["running"] == 2
                gauge = per_tenant(url, "sluicegate_tenant_inflight_requests")
                assert gauge == {"a": 2.0, "b": 1.0}
                assert admin_state(url)["store"] == {"kind": "memory"}
                STATE_SCHEMA.validate(admin_state(url))
                assert per_tenant(url, "sluicegate_store_global_tenant_running") == {}
            finally:
                for response in held:
                    response.close()
        assert wait_until(lambda: model_state(url)["tenants_running"] == [], 5.0)
        assert per_tenant(url, "sluicegate_tenant_inflight_requests") == {"a": 0.0, "b": 0.0}
