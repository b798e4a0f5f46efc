"""What ``/admin/state`` and ``/metrics`` tell an operator (issue 16), checked against what
the clients of a real gateway saw: outcomes by lane, recent queue waits, per-tenant usage,
effective limits and floors, SLOs; and who may read it (Bearer or HTTP Basic admin key)."""

from __future__ import annotations

import asyncio
import base64
import http.client
import time
from collections import Counter
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.clock_harness import clocked_gateway
from tests.gateway.gateway_harness import (
    ADMIN_KEY,
    FAST_PRIORS,
    MODEL,
    Reply,
    Stack,
    admin_state,
    engine_server,
    http_call,
    lane_state,
    metric,
    model_state,
    open_stream,
    openai_error,
    stack,
    wait_until,
)

KEY_A = "sk-state-tenant-a"
KEY_B = "sk-state-tenant-b"
TENANTS = """tenants:
  - {name: a, api_key_env: KEY_A}
  - {name: b, api_key_env: KEY_B, requests_per_s: 0.001, burst_requests: 3}
"""
ENV = {"KEY_A": KEY_A, "KEY_B": KEY_B}
OUTCOMES_BODY = f"""    max_concurrency: 2
    lanes:
      - {{name: interactive, max_concurrency: 1, max_queue: 1, queue_timeout_s: 30,
          borrow: false, lend: false, slo_ms: 1500}}
      - {{name: batch, max_concurrency: 1, max_queue: 4, borrow: false, lend: false,
          slo_ms: 90000}}
{FAST_PRIORS}{TENANTS}"""


def _body(tokens: int, **extra: object) -> dict[str, object]:
    return {"model": MODEL, "prompt": "state of things", "max_tokens": tokens,
            "ignore_eos": True, **extra}  # fmt: skip


async def _post(
    session: aiohttp.ClientSession, url: str, key: str, tokens: int = 3, lane: str | None = None
) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {key}"}
    if lane is not None:
        headers["x-sluicegate-lane"] = lane
    async with session.post(url + "/v1/completions", json=_body(tokens), headers=headers) as r:
        return r.status, await r.json()


def _lane_counts(base_url: str) -> dict[tuple[str, str], float]:
    """``sluicegate_requests_total`` of the model by (lane, outcome), from ``/metrics``."""
    text = http_call(base_url, "GET", "/metrics").body.decode()
    counts: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "sluicegate_requests_total" and sample.labels["model"] == MODEL:
                counts[(sample.labels["lane"], sample.labels["outcome"])] = sample.value
    return counts


async def _until(predicate: Any, within_s: float = 5.0) -> bool:
    return await asyncio.to_thread(wait_until, predicate, within_s)


async def test_lane_outcomes_and_waits_match_what_clients_saw() -> None:
    """Every kind of ending a client can see (200, 429 rate limit, 429 queue full, 503 queue
    timeout, a stream the client closed) is counted once under its lane's ``outcomes`` in
    ``/admin/state`` and equals ``sluicegate_requests_total``; ``queue_wait_s.count`` is the
    number of admitted requests, p50 <= p95 <= p99, p99 the 2 s one request waited, and
    60 s later the window is empty (count 0, quantiles null) while outcomes stay."""
    with (
        engine_server() as engine,
        clocked_gateway([engine.port], OUTCOMES_BODY, environ=ENV) as (gateway, clock),
    ):
        url = gateway.base_url
        seen: Counter[tuple[str, str]] = Counter()
        async with aiohttp.ClientSession() as session:
            for tokens in (3, 5):
                status, _ = await _post(session, url, KEY_A, tokens)
                assert status == 200
                seen["interactive", "completed"] += 1
            for _ in range(3):
                status, _ = await _post(session, url, KEY_B, lane="batch")
                assert status == 200
                seen["batch", "completed"] += 1
            status, answer = await _post(session, url, KEY_B, lane="batch")
            assert (status, answer["error"]["code"]) == (429, "rate_limit_exceeded")
            seen["batch", "rejected_rate_limit"] += 1

            # The interactive slot held; one waits in its queue of 1; the next finds it full.
            hold = await open_stream(session, url, key=KEY_A)
            waiter = asyncio.create_task(_post(session, url, KEY_A))
            assert await _until(lambda: lane_state(url, "interactive")["queued"] == 1)
            status, answer = await _post(session, url, KEY_A)
            assert (status, answer["error"]["code"]) == (429, "queue_full")
            seen["interactive", "rejected_queue_full"] += 1
            clock.advance(31.0)  # past queue_timeout_s
            status, answer = await waiter
            assert (status, answer["error"]["code"]) == (503, "queue_timeout")
            seen["interactive", "expired"] += 1
            hold.close()
            seen["interactive", "cancelled"] += 1
            assert await _until(lambda: lane_state(url, "interactive")["running"] == 0)

            # One request that waits 2 s (on the scheduling clock) before it is admitted.
            hold = await open_stream(session, url, key=KEY_A)
            waiter = asyncio.create_task(_post(session, url, KEY_A))
            assert await _until(lambda: lane_state(url, "interactive")["queued"] == 1)
            clock.advance(2.0)
            hold.close()
            seen["interactive", "cancelled"] += 1
            status, _ = await waiter
            assert status == 200
            seen["interactive", "completed"] += 1
            assert await _until(lambda: lane_state(url, "interactive")["running"] == 0)

        lanes = {lane["name"]: lane for lane in model_state(url)["lanes"]}
        from_state = {
            (name, outcome): count
            for name, lane in lanes.items()
            for outcome, count in lane["outcomes"].items()
        }
        assert from_state == dict(seen)
        assert _lane_counts(url) == {key: float(n) for key, n in seen.items()}

        admitted = {"interactive": 5, "batch": 3}  # completed + cancelled streams
        for name, count in admitted.items():
            waits = lanes[name]["queue_wait_s"]
            assert waits["count"] == count, (name, waits)
            assert 0.0 <= waits["p50"] <= waits["p95"] <= waits["p99"], (name, waits)
        interactive = lanes["interactive"]["queue_wait_s"]
        assert 2.0 <= interactive["p99"] < 3.0, interactive
        assert interactive["p50"] < 0.5, interactive
        assert lanes["batch"]["queue_wait_s"]["p99"] < 0.5

        clock.advance(61.0)
        for lane in model_state(url)["lanes"]:
            assert lane["queue_wait_s"] == {"count": 0, "p50": None, "p95": None, "p99": None}
            assert lane["outcomes"] == {o: n for (ln, o), n in seen.items() if ln == lane["name"]}


async def test_tenant_usage_equals_the_usage_clients_got_back() -> None:
    """Per tenant, ``tenants`` in ``/admin/state`` counts the requests answered and sums
    the ``usage`` each answer carried (unary and streamed, completions and chat), and
    ``sluicegate_tokens_total`` agrees."""
    with stack(f"    max_concurrency: 4\n{FAST_PRIORS}{TENANTS}", environ=ENV) as gateway:
        url = gateway.base_url
        expected: dict[str, list[int]] = {"a": [0, 0, 0], "b": [0, 0, 0]}

        def add(tenant: str, usage: dict[str, int]) -> None:
            totals = expected[tenant]
            totals[0] += 1
            totals[1] += usage["prompt_tokens"]
            totals[2] += usage["completion_tokens"]

        async with aiohttp.ClientSession() as session:
            for key, tenant, tokens in ((KEY_A, "a", 3), (KEY_A, "a", 7), (KEY_B, "b", 11)):
                status, answer = await _post(session, url, key, tokens)
                assert status == 200
                add(tenant, answer["usage"])
            message = {"role": "user", "content": "a longer prompt for chat"}
            chat = {"model": MODEL, "max_tokens": 4, "ignore_eos": True, "messages": [message]}
            headers = {"Authorization": f"Bearer {KEY_B}"}
            async with session.post(url + "/v1/chat/completions", json=chat, headers=headers) as r:
                assert r.status == 200
                add("b", (await r.json())["usage"])
            streamed = _body(6, stream=True, stream_options={"include_usage": True})
            headers = {"Authorization": f"Bearer {KEY_A}"}
            async with session.post(url + "/v1/completions", json=streamed, headers=headers) as r:
                assert r.status == 200
                usage = None
                async for line in r.content:
                    if line.startswith(b"data: {") and b'"usage":{' in line:
                        usage = orjson.loads(line[6:])["usage"]
                assert usage is not None
                add("a", usage)

        tenants = model_state(url)["tenants"]
        assert tenants == [
            {"tenant": name, "requests": n, "prompt_tokens": p, "completion_tokens": c}
            for name, (n, p, c) in sorted(expected.items())
        ]
        for name, (_, prompt, completion) in expected.items():
            assert metric(url, "sluicegate_tokens_total", tenant=name, kind="prompt") == prompt
            done = metric(url, "sluicegate_tokens_total", tenant=name, kind="completion")
            assert done == completion


def test_open_gateway_counts_usage_under_other() -> None:
    """With no tenant keys (an open gateway) usage is listed under the bounded label
    ``other``, as in ``sluicegate_tokens_total``."""
    with stack(f"    max_concurrency: 4\n{FAST_PRIORS}") as gateway:
        reply = http_call(gateway.base_url, "POST", "/v1/completions", json=_body(4))
        assert reply.status == 200
        usage = reply.json()["usage"]
        assert model_state(gateway.base_url)["tenants"] == [
            {"tenant": "other", "requests": 1, "prompt_tokens": usage["prompt_tokens"],
             "completion_tokens": usage["completion_tokens"]}
        ]  # fmt: skip


LIMITS_BODY = f"""    max_concurrency: 6
    lanes:
      - {{name: interactive, max_concurrency: 8, slo_ms: 1500}}
      - {{name: batch, max_concurrency: 3, slo_ms: 90000}}
      - {{name: best_effort, max_concurrency: 2, slo_ms: 250}}
{FAST_PRIORS}"""
ADAPTIVE_BODY = LIMITS_BODY.replace(
    "    lanes:", "    adaptive: {mode: aimd, floor: 2}\n    lanes:", 1
)


@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed", "adaptive"])
def test_limits_floor_and_slo_in_state_and_metrics(adaptive: bool) -> None:
    """Idle gateway: ``time`` is now (unix seconds); ``pressure`` is null without config
    (and ``sluicegate_pressure_up`` is not exported);
    a lane's ``limit`` is min(its cap, the model's cap) and is what
    ``sluicegate_concurrency_limit`` says; no lane is tightened. The model's ``floor`` and
    ``sluicegate_model_concurrency_floor`` are the adaptive floor (2), else max_concurrency
    (6); ``sluicegate_model_concurrency_limit`` is the model's effective cap, and
    ``sluicegate_adaptive_limit_enabled`` says which; ``sluicegate_lane_slo_seconds`` is
    slo_ms / 1000 per lane."""
    with stack(ADAPTIVE_BODY if adaptive else LIMITS_BODY) as gateway:
        url = gateway.base_url
        before = time.time()
        state = admin_state(url)
        after = time.time()
        assert before <= state["time"] <= after
        assert state["pressure"] is None
        assert metric(url, "sluicegate_pressure_up") is None
        (model,) = state["models"]
        floor = 2 if adaptive else 6
        assert model["floor"] == floor
        assert model["configured_cap"] == 6
        assert floor <= model["cap"] <= 6
        if not adaptive:
            assert model["cap"] == 6
        assert metric(url, "sluicegate_model_concurrency_limit", model=MODEL) == model["cap"]
        assert metric(url, "sluicegate_model_concurrency_floor", model=MODEL) == floor
        enabled = metric(url, "sluicegate_adaptive_limit_enabled", model=MODEL)
        assert enabled == (1.0 if adaptive else 0.0)
        slo = {"interactive": 1.5, "batch": 90.0, "best_effort": 0.25}
        caps = {"interactive": 8, "batch": 3, "best_effort": 2}
        for lane in model["lanes"]:
            name = lane["name"]
            assert lane["cap"] == caps[name]
            assert lane["limit"] == min(caps[name], model["cap"])
            assert lane["pressure_tightened"] is False
            assert lane["outcomes"] == {}
            assert metric(url, "sluicegate_concurrency_limit", lane=name) == lane["limit"]
            assert metric(url, "sluicegate_lane_slo_seconds", model=MODEL, lane=name) == slo[name]
        assert model["tenants"] == []


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _raw(gateway: Stack, method: str, path: str, authorizations: list[str]) -> Reply:
    """A request carrying each of ``authorizations`` as its own ``Authorization`` header."""
    connection = http.client.HTTPConnection("127.0.0.1", gateway.gateway_port, timeout=10)
    try:
        connection.putrequest(method, path)
        for value in authorizations:
            connection.putheader("Authorization", value)
        connection.putheader("Content-Length", "0")
        connection.endheaders()
        response = connection.getresponse()
        names = {name.lower(): value for name, value in response.getheaders()}
        return Reply(response.status, names, response.read())
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("authorizations", "status"),
    [
        ([_basic("admin", ADMIN_KEY)], 200),
        ([_basic("", ADMIN_KEY)], 200),
        ([_basic("anyone", ADMIN_KEY)], 200),
        ([_basic("admin", KEY_A)], 401),
        ([_basic(ADMIN_KEY, "")], 401),
        ([_basic(ADMIN_KEY, "wrong")], 401),
        (["Basic " + base64.b64encode(ADMIN_KEY.encode()).decode()], 401),
        (["Basic not-base64!"], 401),
        ([f"Bearer {ADMIN_KEY}", f"Bearer {ADMIN_KEY}"], 401),
        ([f"Bearer {ADMIN_KEY}", _basic("admin", ADMIN_KEY)], 401),
        ([f"Digest {ADMIN_KEY}"], 401),
    ],
    ids=[
        "basic", "basic-no-user", "basic-any-user", "basic-tenant-key", "key-as-user",
        "wrong-password", "no-colon", "not-base64", "two-bearers", "bearer-and-basic", "digest",
    ],
)  # fmt: skip
def test_admin_state_takes_the_admin_key_as_basic_password_only(
    authorizations: list[str], status: int
) -> None:
    """``/admin/state`` opens with the admin key as the HTTP Basic password (any user
    name), not with a tenant key, not with the key as user name, not with two
    ``Authorization`` headers (even both valid) or another scheme; refusals are 401 in
    OpenAI's shape."""
    with stack(f"    max_concurrency: 2\n{TENANTS}", environ=ENV) as gateway:
        reply = _raw(gateway, "GET", "/admin/state", authorizations)
        assert reply.status == status, reply
        if status == 401:
            assert openai_error(reply)["code"] == "invalid_admin_key"
        else:
            assert reply.json()["models"][0]["name"] == MODEL


def test_admin_drain_takes_bearer_only_and_not_two_headers() -> None:
    """``POST /admin/drain`` refuses two ``Authorization`` headers, a tenant key, and the
    admin key itself as the Basic password (a browser caches Basic for the dashboard and
    would send it with a forged form: issue 27); it drains with the admin key as Bearer."""
    with stack(f"    max_concurrency: 2\n{TENANTS}", environ=ENV) as gateway:
        both = [f"Bearer {ADMIN_KEY}", _basic("admin", ADMIN_KEY)]
        assert _raw(gateway, "POST", "/admin/drain", both).status == 401
        assert _raw(gateway, "POST", "/admin/drain", [_basic("admin", KEY_A)]).status == 401
        assert _raw(gateway, "POST", "/admin/drain", [_basic("ops", ADMIN_KEY)]).status == 401
        assert admin_state(gateway.base_url)["draining"] is False
        reply = _raw(gateway, "POST", "/admin/drain", [f"Bearer {ADMIN_KEY}"])
        assert (reply.status, reply.json()) == (200, {"draining": True})
        assert admin_state(gateway.base_url)["draining"] is True


def test_a_tenant_cannot_use_basic_on_the_api() -> None:
    """HTTP Basic is for the admin pages only: a tenant key sent as a Basic password on
    ``/v1/completions`` is refused 401 (the API takes Bearer keys)."""
    with stack(f"    max_concurrency: 2\n{TENANTS}", environ=ENV) as gateway:
        headers = {"Authorization": _basic("a", KEY_A)}
        reply = http_call(gateway.base_url, "POST", "/v1/completions", json=_body(2),
                          headers=headers)  # fmt: skip
        assert reply.status == 401
        assert openai_error(reply)["code"] == "invalid_api_key"
