"""A non-streamed request goes upstream as it came unless it could ever be preempted.

A request that may be preempted with ``abort`` is sent to the engine as a stream and
its answer rebuilt, so that its text so far survives a preemption; that costs CPU per
request (docs/BENCHMARKS.md, issue 33). Whether it could be preempted is decided per
request (``GatewayState.streams_to_keep_text``): by its lane's rule, its priority, and
whether any tenant may ask for a more important one. Under priority tiers only 4–5
qualify: 0–1 are never preempted, and a non-streamed 2–3 finishes (its rule waits for
80% of its answer). A real gateway in front of a real engine on loopback that records
whether each request asked for a stream.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from sluicegate.bench.loadgen import PRIORITY_HEADER
from tests.gateway.gateway_harness import MODEL, gateway_at, http_call
from tests.hardening.faulty_engine import FaultyEngine, faulty_engine

LANE = """    lanes:
      - {name: interactive, preemptible: priority, preempt_action: abort}
"""
ASK = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
ENV = {"KEY_A": "sk-a", "KEY_B": "sk-b"}


def _tenants(max_a: int, max_b: int) -> str:
    """Tenants ``a`` and ``b``, who may ask for priorities ``max_a`` and ``max_b`` at most."""
    return (
        "tenants:\n"
        f"  - {{name: a, api_key_env: KEY_A, max_priority: {max_a}}}\n"
        f"  - {{name: b, api_key_env: KEY_B, max_priority: {max_b}}}\n"
    )


@contextmanager
def _gateway(tenants: str) -> Iterator[tuple[str, FaultyEngine]]:
    with faulty_engine() as engine, gateway_at([engine.port], LANE + tenants, environ=ENV) as gw:
        yield gw.base_url, engine


def _asked_stream(
    base_url: str, engine: FaultyEngine, priority: int | None, key: str = "sk-a"
) -> bool:
    """Send a non-streamed request with ``key`` (tenant ``a``'s by default; ``""``: none) at
    ``priority``, or the tenant's default 2; whether the engine was asked for a stream.
    The client gets the whole answer either way."""
    headers = {} if priority is None else {PRIORITY_HEADER: str(priority)}
    reply = http_call(base_url, "POST", "/v1/chat/completions", json=ASK, key=key or None,
                      headers=headers)  # fmt: skip
    assert reply.status == 200, reply
    assert reply.json()["choices"][0]["message"]["content"] == "tok" * engine.chunks
    return engine.received[-1].stream


@pytest.mark.parametrize(
    ("max_a", "max_b", "priority", "streamed"),
    [
        pytest.param(4, 4, 4, False, id="no-tenant-may-outrank-priority-4"),
        pytest.param(4, 0, 4, True, id="a-tenant-may-ask-for-priority-0"),
        pytest.param(4, 3, 4, True, id="a-tenant-may-ask-for-priority-3"),
        pytest.param(0, 0, 5, True, id="priority-5"),
        pytest.param(2, 0, None, False, id="tier-2-finishes"),
        pytest.param(0, 0, 3, False, id="tier-3-finishes"),
        pytest.param(0, 0, 1, False, id="tier-1-is-never-preempted"),
    ],
)
def test_sent_as_a_stream_only_when_it_could_be_preempted(
    max_a: int, max_b: int, priority: int | None, streamed: bool
) -> None:
    """Under priority tiers tenant ``a``'s request (at ``priority``, or its default 2) is
    streamed upstream exactly when it could be preempted: its tier is 4–5 and a tenant may
    ask for a more important priority (``max_a``, ``max_b``)."""
    with _gateway(_tenants(max_a, max_b)) as (base_url, engine):
        assert _asked_stream(base_url, engine, priority) is streamed


@pytest.mark.parametrize(("priority", "streamed"), [(4, True), (2, False)])
def test_an_open_gateway_streams_what_the_anonymous_tenant_could_outrank(
    priority: int, streamed: bool
) -> None:
    """With no keys the anonymous tenant may ask for any priority: a priority-4 request
    could be preempted, so it is streamed upstream; a priority-2 one finishes."""
    with faulty_engine() as engine, gateway_at([engine.port], LANE) as gw:
        assert _asked_stream(gw.base_url, engine, priority, key="") is streamed


def test_a_tenant_limited_to_other_models_lanes_does_not_count() -> None:
    """A tenant whose ``allowed_lanes`` name none of this model's lanes cannot send to it,
    so its ``max_priority`` of 0 outranks nobody here: priority 4 is sent as it came."""
    other = (
        "  - name: other\n"
        "    backends: [{name: o0, url: 'http://127.0.0.1:9', engine: emulator}]\n"
        "    lanes: [{name: elsewhere}]\n"
    )
    tenants = _tenants(4, 4) + "  - {name: c, api_key_env: KEY_C, allowed_lanes: [elsewhere]}\n"
    env = {**ENV, "KEY_C": "sk-c"}
    with (
        faulty_engine() as engine,
        gateway_at([engine.port], LANE + other + tenants, environ=env) as gw,
    ):
        assert _asked_stream(gw.base_url, engine, 4) is False
