"""``/dashboard`` of one replica of three on a real Redis, in headless Chromium
(``tests/gateway/browser.py``): the tenants' running requests on every replica (from the
store) beside those on this one, and this replica's store link (mode, last sync, fallbacks)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.browser import chromium_path
from tests.gateway.gateway_harness import ADMIN_KEY, MODEL
from tests.gateway.replica_trio import HOLDS, Trio, expected_rows, holding, running_trio
from tests.gateway.test_dashboard_browser import basic_header, browser, shown

# The page as the test compares it, read in one evaluation: the state it rendered last,
# the tenant rows' running cells and the store-link rows.
PAGE_JS = """(() => {
  const fields = (row) => Object.fromEntries([...row.querySelectorAll('[data-field]')]
    .map((e) => [e.dataset.field, {text: e.textContent, value: e.dataset.value ?? null,
      title: e.getAttribute('title')}]));
  const section = document.querySelector(`section.model[data-model="${MODEL}"]`);
  const links = document.getElementById('links');
  return {
    renders: window.sluicegateRenders, state: window.sluicegateLastState,
    headers: section ? [...section.querySelectorAll('table.tenants thead th')]
      .map((e) => e.textContent) : [],
    tenants: section ? Object.fromEntries([...section.querySelectorAll('tr[data-tenant]')]
      .map((row) => [row.dataset.tenant, fields(row)])) : {},
    links: Object.fromEntries([...links.querySelectorAll('tr[data-link]')]
      .map((row) => [row.dataset.link, fields(row)])),
    linksHidden: links.hidden,
  };
})()""".replace("${MODEL}", MODEL)


@pytest.fixture(scope="module")
def trio() -> Iterator[Trio]:
    """The three replicas (``tests/gateway/replica_trio.py``)."""
    chromium_path()  # fail at once, naming the package, if Chromium is missing
    with running_trio() as running:
        yield running


def global_rows(state: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The store's running requests per tenant in a state the page rendered."""
    read = state["store"].get("global_tenants")
    return None if read is None else read["models"].get(MODEL)


async def test_the_page_shows_every_replicas_running_requests_per_tenant_and_the_link(
    trio: Trio, tmp_path: Path
) -> None:
    """While six requests of four tenants run over three replicas, gw0's page shows per
    tenant the requests running on all replicas (from the store: ``a`` 3, ``b``, ``c`` 1,
    and ``other`` 1 for ``d``, whom gw0 does not configure) beside those running on gw0
    (``a`` 2, the rest 0), each with its per-lane breakdown, exactly as the state it
    rendered; and its store link in global mode with a fresh sync and no fallback. When
    the requests end, the page's running counts go to 0 (and only tenants with usage
    counters here keep a row)."""
    async with browser(tmp_path) as chrome:
        page = await chrome.new_page()
        await page.set_headers(basic_header(ADMIN_KEY))
        async with holding(trio):
            await page.navigate(trio.url(0) + "/dashboard")
            expected = expected_rows(0)
            await page.wait_for(shows_rows(expected), within_s=15)
            shows: dict[str, Any] = await page.evaluate(PAGE_JS)
            assert global_rows(shows["state"]) == expected
            here = [hold for hold in HOLDS if hold[0] == 0]
            assert shows["state"]["models"][0]["tenants_running"] == expected_rows(0, here)
            assert shows["headers"][:3] == ["tenant", "running (all replicas)", "running here"]
            assert set(shows["tenants"]) == {"a", "b", "c", "other"}
            own = {row["tenant"]: row["running"] for row in expected_rows(0, here)}
            for row in expected:
                cells = shows["tenants"][row["tenant"]]
                assert shown(cells["running"]) == row["running"], row
                lanes = "\n".join(f"{lane}: {n}" for lane, n in row["lanes"].items())
                assert cells["running"]["title"] == lanes
                assert shown(cells["running-here"]) == own.get(row["tenant"], 0), row
            assert shows["linksHidden"] is False
            (session,) = shows["links"]
            assert session == "gw0.1"
            link = shows["links"][session]
            store = shows["state"]["store"]
            assert link["mode"]["text"] == "global"
            assert shown(link["fallbacks"]) == 0
            assert float(link["sync-age"]["value"]) == pytest.approx(store["last_sync"]["age_s"])
            assert float(link["sync-rtt"]["value"]) == store["last_sync"]["round_trip_s"]
            in_mode = shows["state"]["time"] - store["mode_since"]
            assert float(link["in-mode"]["value"]) == pytest.approx(in_mode)
            assert shown(link["replicas"]) == 3
        await page.wait_for(shows_rows([]), within_s=15)
        after: dict[str, Any] = await page.evaluate(PAGE_JS)
        # Nothing runs: a row is left only for a tenant with usage counters here.
        usage = {tenant["tenant"] for tenant in after["state"]["models"][0]["tenants"]}
        assert set(after["tenants"]) == usage
        for tenant, cells in after["tenants"].items():
            assert (shown(cells["running"]), shown(cells["running-here"])) == (0, 0), tenant
        assert page.errors == []


def shows_rows(rows: list[dict[str, Any]]) -> str:
    """A page expression: the state it rendered last has ``rows`` as the store's running
    requests per tenant of the model."""
    literal = json.dumps(json.dumps(rows, separators=(",", ":")))
    return (
        "(() => { const s = window.sluicegateLastState; const r = s && s.store.global_tenants;"
        f" return Boolean(r) && JSON.stringify(r.models['{MODEL}']) === {literal}; }})()"
    )
