"""``/dashboard`` in a real browser: headless Debian Chromium, driven over the DevTools
protocol (``tests/gateway/browser.py``), loads the page from a gateway in front of an
emulated engine while a background load runs through it, and the tests read the DOM.

``SLUICEGATE_WRITE_SCREENSHOT=1`` saves the screenshot to ``docs/img/dashboard.png`` (after
letting the charts fill for longer); otherwise it goes to the test's temporary directory.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import random
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.gateway.browser import Browser, BrowserError, Page, chromium, chromium_path
from tests.gateway.gateway_harness import ADMIN_KEY, MODEL, Stack, stack

KEYS = {"acme": "sk-dashboard-acme", "globex": "sk-dashboard-globex"}
BODY = """    max_concurrency: 5
    lanes:
      - {name: interactive, max_concurrency: 3, max_queue: 64}
      - {name: batch, max_concurrency: 2, max_queue: 64}
tenants:
  - {name: acme, api_key_env: KEY_ACME, default_lane: interactive}
  - {name: globex, api_key_env: KEY_GLOBEX, default_lane: batch, allowed_lanes: [batch]}
"""
# Clients per tenant: more than each lane admits, so both lanes queue.
CLIENTS = {"acme": 6, "globex": 4}
REPO = Path(__file__).resolve().parents[2]
SCREENSHOT = REPO / "docs" / "img" / "dashboard.png"

# Everything a test compares, read in one evaluation so the DOM and the state it shows
# come from the same render.
SNAPSHOT_JS = """(() => {
  const fields = (root) => {
    const found = {};
    for (const e of root.querySelectorAll('[data-field]')) {
      found[e.dataset.field] = {text: e.textContent, value: e.dataset.value ?? null};
    }
    return found;
  };
  const rows = (section, key) => Object.fromEntries(
    [...section.querySelectorAll(`tr[data-${key}]`)].map((row) => [row.dataset[key], fields(row)]));
  const models = {};
  for (const section of document.querySelectorAll('section.model')) {
    models[section.dataset.model] = {
      header: fields(section.querySelector('header')),
      lanes: rows(section, 'lane'),
      tenants: rows(section, 'tenant'),
      backends: rows(section, 'backend'),
      charts: section.querySelectorAll('svg.chart').length,
      lines: section.querySelectorAll('svg.chart polyline').length,
    };
  }
  const message = document.getElementById('message');
  return {
    renders: window.sluicegateRenders, state: window.sluicegateLastState, models,
    message: message.hidden ? null : message.textContent,
    status: document.querySelector('[data-field="status"]').textContent,
  };
})()"""


def basic_header(password: str) -> dict[str, str]:
    """An ``Authorization: Basic`` header with ``password`` (user name ``admin``)."""
    return {"Authorization": "Basic " + base64.b64encode(f"admin:{password}".encode()).decode()}


@pytest.fixture(scope="module")
def gateway() -> Iterator[Stack]:
    """A gateway with two lanes and two tenants in front of one emulated engine."""
    chromium_path()  # fail at once, naming the package, if Chromium is missing
    environ = {"KEY_ACME": KEYS["acme"], "KEY_GLOBEX": KEYS["globex"]}
    with stack(BODY, environ=environ) as live:
        yield live


@contextlib.asynccontextmanager
async def load(gateway: Stack) -> AsyncIterator[list[int]]:
    """Clients sending completions of varied length through the gateway until the block
    ends; yields the list of statuses received so far."""
    statuses: list[int] = []
    stop = asyncio.Event()

    async def client(session: aiohttp.ClientSession, tenant: str, seed: int) -> None:
        rng = random.Random(seed)
        headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
        while not stop.is_set():
            body = {
                "model": MODEL, "prompt": "tell me a story " * rng.randint(5, 60),
                "max_tokens": rng.randint(40, 400), "ignore_eos": True,
            }  # fmt: skip
            async with session.post(
                gateway.base_url + "/v1/completions", json=body, headers=headers
            ) as response:
                await response.read()
                statuses.append(response.status)
            await asyncio.sleep(rng.random() * 0.3)

    async with aiohttp.ClientSession() as session:
        tasks = [
            asyncio.create_task(client(session, tenant, seed=i * 100 + n))
            for i, (tenant, count) in enumerate(CLIENTS.items())
            for n in range(count)
        ]
        try:
            yield statuses
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def browser(tmp_path: Path) -> AsyncIterator[Browser]:
    """Chromium for one test; a clear failure if it is missing."""
    try:
        async with chromium(tmp_path) as running:
            yield running
    except BrowserError as exc:
        pytest.fail(str(exc))


async def fetch_state(session: aiohttp.ClientSession, gateway: Stack) -> dict[str, Any]:
    """``/admin/state`` as the test sees it."""
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with session.get(gateway.base_url + "/admin/state", headers=headers) as response:
        assert response.status == 200
        data: dict[str, Any] = await response.json()
        return data


async def open_dashboard(browser: Browser, gateway: Stack, renders: int = 1) -> Page:
    """A tab showing the dashboard, opened with the admin key as the Basic password,
    once it has rendered ``renders`` times."""
    page = await browser.new_page(1400, 1000)
    await page.set_headers(basic_header(ADMIN_KEY))
    await page.navigate(gateway.base_url + "/dashboard")
    await page.wait_for(f"window.sluicegateRenders >= {renders}", within_s=10 + 2 * renders)
    return page


async def snapshot_after(page: Page, renders: int) -> dict[str, Any]:
    """The page's snapshot once its render count has reached ``renders``."""
    await page.wait_for(f"window.sluicegateRenders >= {renders}", within_s=10)
    snapshot: dict[str, Any] = await page.evaluate(SNAPSHOT_JS)
    return snapshot


def shown(cell: dict[str, Any]) -> int:
    """The integer a cell shows (thousands separators removed)."""
    return int(cell["text"].replace(",", ""))


def assert_dom_shows(snapshot: dict[str, Any]) -> None:
    """Every number the page shows for the model equals ``window.sluicegateLastState``,
    the state it rendered last."""
    state = snapshot["state"]
    (model,) = state["models"]
    dom = snapshot["models"][model["name"]]
    for field in ("running", "cap", "queued"):
        assert shown(dom["header"][field]) == model[field], field
    assert set(dom["lanes"]) == {lane["name"] for lane in model["lanes"]}
    for lane in model["lanes"]:
        row = dom["lanes"][lane["name"]]
        for field in ("queued", "running", "limit"):
            assert shown(row[field]) == lane[field], (lane["name"], field)
        assert shown(row["finished"]) == sum(lane["outcomes"].values())
        for quantile in ("p50", "p95", "p99"):
            value = lane["queue_wait_s"][quantile]
            cell = row[f"wait-{quantile}"]
            if value is None:
                assert cell["value"] == "", (lane["name"], quantile, cell)
            else:
                assert float(cell["value"]) == pytest.approx(value), (lane["name"], quantile)
    running = {row["tenant"]: row["running"] for row in model["tenants_running"]}
    assert set(dom["tenants"]) == {tenant["tenant"] for tenant in model["tenants"]} | set(running)
    for tenant in model["tenants"]:
        row = dom["tenants"][tenant["tenant"]]
        for field in ("requests", "prompt_tokens", "completion_tokens"):
            assert shown(row[field]) == tenant[field], (tenant["tenant"], field)
    for name, row in dom["tenants"].items():  # in memory mode, "running" is this gateway's
        assert shown(row["running"]) == running.get(name, 0), name
        assert "running-here" not in row
    for backend in model["backends"]:
        row = dom["backends"][backend["name"]]
        assert shown(row["inflight"]) == backend["inflight"]
        assert row["healthy"]["text"] == ("healthy" if backend["healthy"] else "down")
        assert float(row["kv"]["value"]) == pytest.approx(backend["kv_cache_usage"])


def counters(state: dict[str, Any]) -> dict[str, int]:
    """The cumulative counters of the model: finished requests per lane, requests and
    tokens per tenant."""
    (model,) = state["models"]
    found = {f"lane {lane['name']}": sum(lane["outcomes"].values()) for lane in model["lanes"]}
    for tenant in model["tenants"]:
        for field in ("requests", "prompt_tokens", "completion_tokens"):
            found[f"{tenant['tenant']} {field}"] = tenant[field]
    return found


def dom_counters(snapshot: dict[str, Any]) -> dict[str, int]:
    """The same counters as ``counters``, read from the page's text."""
    dom = snapshot["models"][MODEL]
    found = {f"lane {name}": shown(row["finished"]) for name, row in dom["lanes"].items()}
    for tenant, row in dom["tenants"].items():
        if row["requests"]["value"] == "":
            continue  # running, no usage yet: no counters to compare
        for field in ("requests", "prompt_tokens", "completion_tokens"):
            found[f"{tenant} {field}"] = shown(row[field])
    return found


async def test_under_load_the_page_shows_changing_numbers_that_match_admin_state(
    gateway: Stack, tmp_path: Path
) -> None:
    """Under a load through two lanes from two tenants, the page re-renders every poll;
    each render shows exactly the state it keeps in ``window.sluicegateLastState``; its
    counters lie between ``/admin/state`` fetched just before and just after it (a render
    whose poll started after the first fetch); they grow between renders; the rates of
    completed requests and tokens are positive while it runs; the charts draw lines; the
    page logs no error and no CSP violation; each tenant's running requests are shown (a
    tenant running its first requests has a row before it has usage). A screenshot is saved."""
    async with (
        load(gateway) as statuses,
        browser(tmp_path) as chrome,
        aiohttp.ClientSession() as session,
    ):
        page = await open_dashboard(chrome, gateway, renders=3)
        snapshots = []
        for _ in range(3):
            before = counters(await fetch_state(session, gateway))
            renders = await page.evaluate("window.sluicegateRenders")
            # renders + 1 may come from a poll sent before `before`; renders + 2 cannot.
            snapshot = await snapshot_after(page, renders + 2)
            after = counters(await fetch_state(session, gateway))
            assert_dom_shows(snapshot)
            shows = dom_counters(snapshot)
            assert set(shows) == set(before) == set(after)
            for name, value in shows.items():
                assert before[name] <= value <= after[name], (name, before, shows, after)
            snapshots.append(snapshot)
        first, last = dom_counters(snapshots[0]), dom_counters(snapshots[-1])
        assert all(last[name] > first[name] for name in first), (first, last)
        shown_models = [snapshot["models"][MODEL] for snapshot in snapshots]
        for lane in ("interactive", "batch"):
            rates = [float(m["lanes"][lane]["rate-completed"]["value"]) for m in shown_models]
            assert max(rates) > 0, (lane, rates)
        for tenant in KEYS:
            rates = [float(m["tenants"][tenant]["rate-completion"]["value"]) for m in shown_models]
            assert max(rates) > 0, (tenant, rates)
        latest = shown_models[-1]
        assert latest["charts"] == 3
        assert latest["lines"] >= 2 * 3  # one line per lane in every chart
        assert snapshots[-1]["message"] is None
        assert snapshots[-1]["status"] == "live"
        write = os.environ.get("SLUICEGATE_WRITE_SCREENSHOT") == "1"
        if write:  # let the charts fill before the picture for the README
            now = await page.evaluate("window.sluicegateRenders")
            await page.wait_for(f"window.sluicegateRenders >= {now + 25}", within_s=60)
        height = await page.evaluate("Math.ceil(document.body.getBoundingClientRect().bottom)")
        target = SCREENSHOT if write else tmp_path / "dashboard.png"
        await page.screenshot(target, height=min(1000, height))
        assert target.stat().st_size > 10_000
        assert page.errors == []
    assert statuses.count(200) > 20, statuses


async def test_the_browser_asks_for_the_key_once_and_the_page_polls_with_it(
    gateway: Stack, tmp_path: Path
) -> None:
    """As a person would: the first load gets 401 with the Basic challenge, the key typed
    into the prompt (answered over the protocol) opens the page, and the assets and every
    poll of ``/admin/state`` reuse those credentials without another challenge."""
    async with browser(tmp_path) as chrome:
        page = await chrome.new_page()
        challenged = await page.answer_auth("operator", ADMIN_KEY)
        await page.navigate(gateway.base_url + "/dashboard")
        snapshot = await snapshot_after(page, 3)
        assert challenged == [gateway.base_url + "/dashboard"]
        assert snapshot["message"] is None
        assert snapshot["state"]["models"][0]["name"] == MODEL
        assert page.errors == []


async def test_a_refused_key_shows_a_message_and_the_page_recovers(
    gateway: Stack, tmp_path: Path
) -> None:
    """When ``/admin/state`` answers 401 (here: the key sent changes to a wrong one), the
    page says so, marks itself stale and stops rendering; with the right key again it
    clears the message and renders again."""
    async with browser(tmp_path) as chrome:
        page = await open_dashboard(chrome, gateway, renders=1)
        await page.set_headers(basic_header("wrong-admin-key"))
        message = await page.wait_for(
            "document.getElementById('message').hidden ? null : "
            "document.getElementById('message').textContent"
        )
        assert "HTTP 401" in message
        assert "admin key" in message
        stale = await page.evaluate(
            "[window.sluicegateRenders, document.body.classList.contains('stale'),"
            " document.querySelector('[data-field=status]').textContent]"
        )
        assert stale[1:] == [True, "stale"]
        await asyncio.sleep(2)  # more than one poll period
        assert await page.evaluate("window.sluicegateRenders") == stale[0]
        await page.set_headers(basic_header(ADMIN_KEY))
        snapshot = await snapshot_after(page, stale[0] + 1)
        assert snapshot["message"] is None
        assert snapshot["status"] == "live"
        assert [e for e in page.errors if "/admin/state" not in e] == []


async def test_a_state_without_the_optional_fields_still_renders(
    gateway: Stack, tmp_path: Path
) -> None:
    """The page tolerates an ``/admin/state`` without the fields older gateways lack (time,
    outcomes, wait quantiles, limit, floor, tenants, running per tenant, pressure): it
    renders what there is, shows dashes for the rest, and throws nothing."""
    async with aiohttp.ClientSession() as session:
        state = await fetch_state(session, gateway)
    for key in ("time", "pressure"):
        state.pop(key)
    model = state["models"][0]
    for key in ("floor", "tenants", "tenants_running"):
        model.pop(key)
    for lane in model["lanes"]:
        for key in ("outcomes", "queue_wait_s", "limit", "pressure_tightened"):
            lane.pop(key)
    async with browser(tmp_path) as chrome:
        page = await chrome.new_page()
        await page.set_headers(basic_header(ADMIN_KEY))
        await page.fulfill("*/admin/state", orjson.dumps(state))
        await page.navigate(gateway.base_url + "/dashboard")
        snapshot = await snapshot_after(page, 3)
        assert snapshot["state"] == state
        lanes = snapshot["models"][MODEL]["lanes"]
        assert set(lanes) == {"interactive", "batch"}
        for lane in model["lanes"]:
            row = lanes[lane["name"]]
            assert shown(row["limit"]) == lane["cap"]  # no effective limit: the lane's cap
            assert shown(row["queued"]) == lane["queued"]
            assert [row[f]["text"] for f in ("wait-p95", "finished", "rate-completed")] == ["–"] * 3
        assert snapshot["models"][MODEL]["tenants"] == {}
        assert snapshot["message"] is None
        assert page.errors == []
