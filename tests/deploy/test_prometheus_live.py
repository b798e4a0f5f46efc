"""A real Prometheus against a live gateway and emulator under load (issue 16).

One stack per module (``live_stack.py``): ``sluicegate emulate``, ``sluicegate serve``
with two lanes, three keyed tenants (one rate-limited) and a ``pressure:`` section
polling this Prometheus, a Kueue exporter, and ``/usr/bin/prometheus`` scraping all
three every second with ``deploy/prometheus/rules.yml`` loaded. A warm-up request of
every kind is scraped before the load starts (so every counter's first sample, which
``rate`` does not count as an increase, precedes it), then ~15 s of open-loop load
(``live_load.py``): ~270 requests, a third streamed, about one in seven refused by a
tenant's rate limit.

The tests run in file order and each leaves the stack serving, except the last, which
stops Prometheus. An alert whose condition is rightly false under this load (a backend
down, KV usage high...) is checked operand by operand: every side of its top-level
comparisons and set operators must return data, so a misspelt metric or a job name
that matches nothing still fails.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.deploy.live_load import (
    Reply,
    default_load,
    open_loop,
    send,
    tally,
    warm_up,
)
from tests.deploy.live_prometheus import SCRAPE_INTERVAL_S
from tests.deploy.live_queries import (
    Shipped,
    alert_rules,
    grafana_shipped,
    keda_expressions,
    operands,
    rules_expressions,
    shipped_config_pressure,
)
from tests.deploy.live_stack import (
    FIRST_LANE,
    LAST_LANE,
    PRESSURE_CLEAR_BELOW,
    PRESSURE_INTERVAL_S,
    PRESSURE_THRESHOLD,
    TENANTS,
    LiveStack,
    live_stack,
)
from tests.deploy.promql import metric_names

pytestmark = pytest.mark.slow

MODEL = "llama-3.1-8b"
"""The model the stack serves: the one the KEDA manifests name, so their queries run as shipped."""
JOBS = {"gateway": "sluicegate", "engine": "vllm", "kueue": "kueue"}
"""Scrape job per target; ``sluicegate`` is the job rules.yml's ``up`` alert selects."""
LOAD_S = 15.0


@dataclass
class Live:
    """The stack and what the load's clients saw."""

    stack: LiveStack
    warm_up: list[Reply]
    load: list[Reply]

    @property
    def replies(self) -> list[Reply]:
        """Every request the test sent before the pressure test: warm-up and load."""
        return self.warm_up + self.load


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll ``condition`` every 0.1 s until it returns something truthy; that value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def live(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Live]:
    """The running stack after the warm-up and the load, Prometheus scraping it (its
    processes' logs are printed if anything in the module fails)."""
    log_dir: Path = tmp_path_factory.mktemp("prometheus-live")
    failed_before = request.session.testsfailed
    with live_stack(log_dir, MODEL, JOBS) as stack:
        try:
            first = asyncio.run(warm_up(stack.gateway.url, MODEL))
            stack.wait_scraped(len(first))
            load = asyncio.run(open_loop(stack.gateway.url, MODEL, default_load(), LOAD_S))
            time.sleep(2 * SCRAPE_INTERVAL_S)  # scraped, and the rules evaluated, after the load
            yield Live(stack, first, load)
        except BaseException:
            print(stack.logs())
            raise
        if request.session.testsfailed > failed_before:
            print(stack.logs())


def returns_data(live: Live, expr: str) -> str | None:
    """Why ``expr`` fails to return data now (None: it returned a sample that is a number)."""
    values = live.stack.prometheus.values(expr)
    if not values:
        return "empty result"
    if all(math.isnan(v) for v in values):
        return f"only NaN ({len(values)} samples)"
    return None


def shipped_failures(live: Live, shipped: list[Shipped]) -> list[str]:
    """What is wrong with each shipped expression: a recording rule, KEDA trigger, Grafana
    target or pressure query must return a non-NaN sample, and a recording rule's series
    must exist. An alert must return data, or, when its condition is false under this
    load, each operand of its top-level comparisons and set operators must."""
    failures = []
    for item in shipped:
        label = f"{item.source} {item.name}: {item.expr}"
        problem = returns_data(live, item.expr)
        parts = operands(item.expr)
        if item.source == "alert" and problem and parts != [item.expr.strip()]:
            failures += [
                f"{label}\n    operand {part!r}: {why}"
                for part in parts
                if (why := returns_data(live, part))
            ]
        elif problem:
            failures.append(f"{label}: {problem}")
        if item.source == "record" and (problem := returns_data(live, item.name)):
            failures.append(f"recorded series {item.name}: {problem}")
    return failures


def all_shipped(live: Live) -> list[Shipped]:
    """Every expression we ship, and the test config's pressure queries."""
    shipped = rules_expressions() + keda_expressions(MODEL) + grafana_shipped()
    shipped += shipped_config_pressure()
    return shipped + [Shipped("pressure", "test config", q) for q in live.stack.pressure_queries]


def test_every_shipped_expression_returns_data(live: Live) -> None:
    """Every rule, KEDA trigger, Grafana target and pressure query returns data from a real
    Prometheus scraping the stack under load (alerts false under this load: operand by
    operand), and every metric any of them names has series."""
    shipped = all_shipped(live)
    sources = Counter(item.source for item in shipped)
    for source in ("record", "alert", "keda", "grafana", "pressure"):
        assert sources[source] > 0, f"no {source} expressions found: {sources}"
    failures = shipped_failures(live, shipped)
    names = sorted({name for item in shipped for name in metric_names(item.expr)})
    failures += [f"metric {n}: {p}" for n in names if (p := returns_data(live, n))]
    assert not failures, (
        f"{len(failures)} of {len(shipped)} expressions, {len(names)} metrics "
        "return no data:\n" + "\n".join(failures)
    )


def test_alerts_are_evaluated(live: Live) -> None:
    """Prometheus evaluates the shipped alerts: the rate limit's refusals (about a quarter of
    the batch lane, over 5%) make ``SluicegateRejectionRatioHigh`` pending for that lane,
    and no alert is active for the interactive lane, which refused nothing."""
    active = live.stack.prometheus.alerts()
    by_lane = {(a["labels"]["alertname"], a["labels"].get("lane")): a["state"] for a in active}
    assert by_lane.get(("SluicegateRejectionRatioHigh", LAST_LANE)) == "pending", by_lane
    assert not [key for key in by_lane if key[1] == FIRST_LANE], by_lane


def prometheus_by(
    live: Live, expr: str, labels: tuple[str, ...], *, zeros: bool = False
) -> dict[tuple[str, ...], float]:
    """``expr``'s samples keyed by ``labels`` (zeros left out unless ``zeros``)."""
    return {
        tuple(sample["metric"].get(name, "") for name in labels): float(sample["value"][1])
        for sample in live.stack.prometheus.query(expr)
        if zeros or float(sample["value"][1]) != 0
    }


def gateway_by(live: Live, name: str, labels: tuple[str, ...]) -> dict[tuple[str, ...], float]:
    """The gateway's own ``/metrics`` samples of ``name`` summed by ``labels``, zeros left out."""
    found: defaultdict[tuple[str, ...], float] = defaultdict(float)
    for sample_labels, value in live.stack.gateway_samples(name):
        found[tuple(sample_labels.get(label, "") for label in labels)] += value
    return {key: value for key, value in found.items() if value != 0}


def test_counts_agree_with_gateway_and_clients(live: Live) -> None:
    """Once the load is over and Prometheus has scraped twice more: its request count equals
    the gateway's /metrics and the number the clients sent, split by lane and outcome as
    the clients saw the replies; completion tokens per tenant match; the idle gauges match
    /admin/state."""
    sent = len(live.replies)
    by_outcome = ("lane", "outcome")
    clients = {key: float(n) for key, n in tally(live.replies).items()}
    assert not [k for k in clients if k[1].startswith("unexpected")], clients
    assert {o for _, o in clients} >= {"completed", "rejected_rate_limit"}, clients
    gateway = gateway_by(live, "sluicegate_requests_total", by_outcome)
    assert gateway == clients, f"gateway /metrics {gateway} != clients {clients}"

    total = live.stack.prometheus.values("sum(sluicegate_requests_total)")
    assert total == [sent], f"Prometheus {total} != {sent} sent"
    split = prometheus_by(live, "sum by (lane, outcome) (sluicegate_requests_total)", by_outcome)
    assert split == clients, f"Prometheus {split} != clients {clients}"

    tokens: Counter[tuple[str]] = Counter()
    for reply in live.replies:
        tokens[(reply.tenant,)] += reply.completion_tokens
    tokens_query = 'sum by (tenant) (sluicegate_tokens_total{kind="completion"})'
    assert prometheus_by(live, tokens_query, ("tenant",)) == {
        k: float(v) for k, v in tokens.items()
    }

    state = live.stack.admin_state()
    (model,) = state["models"]
    assert {(t["tenant"],): t["completion_tokens"] for t in model["tenants"]} == tokens
    assert (model["queued"], model["running"]) == (0, 0), "the gateway is idle"
    for lane in model["lanes"]:
        for metric, field in (
            ("sluicegate_queue_depth", "queued"),
            ("sluicegate_inflight_requests", "running"),
            ("sluicegate_concurrency_limit", "limit"),
        ):
            expr = f'{metric}{{model="{MODEL}", lane="{lane["name"]}"}}'
            assert live.stack.prometheus.value(expr) == lane[field], (expr, lane)
        assert lane["outcomes"] == {
            o: n for (name, o), n in clients.items() if name == lane["name"]
        }, lane


def test_recorded_rejection_ratio_matches_clients(live: Live) -> None:
    """The recorded rejection ratio per lane and per model equals the share of the load's
    requests the clients saw refused (within 0.01: ``rate`` extrapolates each series to
    the window's edges a little differently)."""
    lanes = {lane for lane, _ in tally(live.load)}
    expected = {}
    for lane in lanes:
        replies = [r for r in live.load if r.lane == lane]
        expected[lane] = sum(r.outcome != "completed" for r in replies) / len(replies)
    assert expected[LAST_LANE] > 0.1, expected  # the rate limit refused some
    recorded = prometheus_by(
        live, "model_lane:sluicegate_requests_rejected:ratio_rate5m", ("lane",), zeros=True
    )
    assert set(recorded) == {(lane,) for lane in lanes}, recorded
    for lane, ratio in expected.items():
        assert abs(recorded[(lane,)] - ratio) <= 0.01, (lane, recorded, expected)
    model_ratio = sum(r.outcome != "completed" for r in live.load) / len(live.load)
    recorded_model = live.stack.prometheus.value("model:sluicegate_requests_rejected:ratio_rate5m")
    assert abs(recorded_model - model_ratio) <= 0.01, (recorded_model, model_ratio)


def send_one(live: Live, tenant_name: str) -> Reply:
    """One request of ``tenant_name`` in its own lane."""
    tenant = next(t for t in TENANTS if t.name == tenant_name)

    async def one() -> Reply:
        async with aiohttp.ClientSession() as session:
            return await send(session, live.stack.gateway.url, MODEL, tenant)

    return asyncio.run(one())


def pressure(live: Live) -> dict[str, Any]:
    """``/admin/state``'s ``pressure`` object."""
    state: dict[str, Any] = live.stack.admin_state()["pressure"]
    return state


def lanes(live: Live) -> dict[str, dict[str, Any]]:
    """``/admin/state``'s lanes of the model, by name."""
    (model,) = live.stack.admin_state()["models"]
    return {lane["name"]: lane for lane in model["lanes"]}


def test_pressure_loop_tightens_the_last_lane_and_lets_go(live: Live) -> None:
    """Kueue's backlog above the threshold: within a few polls the stage is 1 in /admin/state
    and in Prometheus, the last lane refuses with 503 ``overloaded`` while the first serves.
    Between clear_below and the threshold the stage holds; at 0 it returns to 0 and the last
    lane serves again."""
    stack = live.stack
    polls = 4 * PRESSURE_INTERVAL_S + 2 * SCRAPE_INTERVAL_S
    assert pressure(live)["stage"] == 0
    stack.exporter.set(PRESSURE_THRESHOLD * 5)
    state = wait_for(
        lambda: (p := pressure(live))["stage"] > 0 and p, polls, "the stage to rise above 0"
    )
    assert state["up"] is True, state
    assert state["status"] == "ok", state
    (signal,) = state["signals"]
    assert signal["value"] == PRESSURE_THRESHOLD * 5, signal
    assert signal["above"] is True, signal
    by_name = lanes(live)
    assert by_name[LAST_LANE]["pressure_tightened"] is True, by_name
    assert by_name[LAST_LANE]["limit"] == 0, by_name
    assert by_name[FIRST_LANE]["pressure_tightened"] is False, by_name
    wait_for(
        lambda: stack.prometheus.values("sluicegate_pressure_stage") == [1.0],
        3 * SCRAPE_INTERVAL_S,
        "sluicegate_pressure_stage 1 in Prometheus",
    )
    tightened = f'sluicegate_pressure_tightened{{lane="{LAST_LANE}"}}'
    assert stack.prometheus.values(tightened) == [1.0]
    signal_value = 'sluicegate_pressure_signal{signal="kueue_backlog"}'
    assert stack.prometheus.values(signal_value) == [PRESSURE_THRESHOLD * 5]

    refused = send_one(live, "analytics")  # the batch lane
    assert (refused.status, refused.code) == (503, "overloaded"), refused
    served = send_one(live, "chat")  # the interactive lane
    assert served.status == 200, served

    stack.exporter.set((PRESSURE_THRESHOLD + PRESSURE_CLEAR_BELOW) / 2)
    time.sleep(SCRAPE_INTERVAL_S + 2 * PRESSURE_INTERVAL_S)
    assert pressure(live)["stage"] == 1, "between clear_below and threshold the stage holds"
    stack.exporter.set(0)
    wait_for(lambda: pressure(live)["stage"] == 0, polls, "the stage to return to 0")
    assert lanes(live)[LAST_LANE]["pressure_tightened"] is False
    assert send_one(live, "analytics").status == 200
    wait_for(
        lambda: stack.prometheus.values("sluicegate_pressure_stage") == [0.0],
        3 * SCRAPE_INTERVAL_S,
        "sluicegate_pressure_stage 0 in Prometheus",
    )


def active_alerts(live: Live) -> dict[str, str]:
    """Alert name → state (pending/firing) of the alerts active in Prometheus now."""
    return {a["labels"]["alertname"]: a["state"] for a in live.stack.prometheus.alerts()}


def test_backend_down_alerts_go_pending_when_the_engine_dies(live: Live) -> None:
    """Kill the engine: ``up`` of its job drops to 0, the gateway marks its backend unhealthy,
    and the backend-down alerts (``for`` of minutes) go pending; neither was active before.
    The engine is started again afterwards."""
    stack = live.stack
    down_alerts = {"SluicegateBackendDown", "SluicegateAllBackendsDown"}
    assert down_alerts <= set(alert_rules()), "rules.yml lost its backend-down alerts"
    assert not down_alerts & set(active_alerts(live)), active_alerts(live)
    stack.kill_engine()
    try:
        wait_for(
            lambda: down_alerts <= {n for n, s in active_alerts(live).items() if s == "pending"},
            6 * SCRAPE_INTERVAL_S,
            f"{sorted(down_alerts)} pending (active now: {active_alerts(live)})",
        )
        engine_up = f'up{{job="{JOBS["engine"]}"}}'
        assert stack.prometheus.values(engine_up) == [0.0]
        assert stack.prometheus.values("sluicegate_backend_healthy") == [0.0]
    finally:
        stack.restart_engine()


def test_prometheus_outage_puts_admission_back_as_configured(live: Live) -> None:
    """With the last lane tightened, stop Prometheus: within a few polls /admin/state says
    ``prometheus_unavailable``, ``up`` false, stage 0, and the last lane serves again at
    its configured limit."""
    stack = live.stack
    polls = 4 * PRESSURE_INTERVAL_S + 2 * SCRAPE_INTERVAL_S
    stack.exporter.set(PRESSURE_THRESHOLD * 5)
    wait_for(lambda: pressure(live)["stage"] > 0, polls, "the stage to rise above 0")
    stack.prometheus.stop()
    state = wait_for(
        lambda: (p := pressure(live))["status"] == "prometheus_unavailable" and p,
        polls,
        "pressure.status prometheus_unavailable",
    )
    assert state["up"] is False, state
    assert state["stage"] == 0, state
    assert state["error"], state
    by_name = lanes(live)
    assert by_name[LAST_LANE]["pressure_tightened"] is False, by_name
    assert by_name[LAST_LANE]["limit"] == by_name[LAST_LANE]["cap"], by_name
    assert send_one(live, "analytics").status == 200
    up = {s[0].get("signal", ""): s[1] for s in stack.gateway_samples("sluicegate_pressure_up")}
    assert up == {"": 0.0}, up
