"""``/dashboard`` in a real browser against a real ``sluicegate serve --workers 2``: the
page sums the workers' answers and shows a worker that failed to answer."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from tests.gateway.test_dashboard_browser import basic_header, browser, shown, snapshot_after

FLEET_MODEL = "m"
"""The model of the fleet ``tests/workers/fleet.py`` runs."""


def worker_sum(state: dict[str, Any], pick: Any) -> int:
    """``pick(model)`` summed over the workers of a ``serve --workers`` answer that answered."""
    return sum(pick(w["models"][0]) for w in state["workers"] if "models" in w)


def assert_dom_sums_workers(snapshot: dict[str, Any]) -> None:
    """The page shows each count summed over the workers that answered, and each limit as
    the (shared) limit every worker reports."""
    state = snapshot["state"]
    dom = snapshot["models"][FLEET_MODEL]
    answered = [w for w in state["workers"] if "models" in w]
    for field in ("running", "queued"):
        assert shown(dom["header"][field]) == worker_sum(state, lambda m, f=field: m[f])
    assert {shown(dom["header"]["cap"])} == {w["models"][0]["cap"] for w in answered}
    lane = dom["lanes"]["shared"]
    assert shown(lane["finished"]) == worker_sum(
        state, lambda m: sum(m["lanes"][0]["outcomes"].values())
    )
    assert shown(lane["running"]) == worker_sum(state, lambda m: m["lanes"][0]["running"])
    assert shown(lane["queued"]) == worker_sum(state, lambda m: m["lanes"][0]["queued"])
    for name, row in dom["tenants"].items():
        requests = worker_sum(
            state,
            lambda m, name=name: sum(t["requests"] for t in m["tenants"] if t["tenant"] == name),
        )
        assert shown(row["requests"]) == requests, name


async def test_under_serve_workers_the_page_sums_the_workers_and_shows_a_failed_one(
    tmp_path: Path,
) -> None:
    """Against a real ``serve --workers 2`` under load: the page shows both workers, the
    shared store, each worker's store link (its session, global), and every count summed
    over the workers (the finished count growing between renders). A worker that does not
    answer the fan-out appears in its answer as ``{"worker": i, "error": ...}``; no test can
    time a real failure between two polls, so the browser is handed that answer (a real one
    with worker 1 replaced) and must show the error, count one worker of two, and sum only
    worker 0."""
    from tests.distributed.cluster import ADMIN_KEY as FLEET_ADMIN_KEY
    from tests.workers.fleet import running_fleet

    log_dir = tmp_path / "fleet"
    log_dir.mkdir()
    with running_fleet(log_dir, workers=2) as fleet:
        url = fleet.gateway_url(0)
        stop = asyncio.Event()

        async def client(session: aiohttp.ClientSession) -> None:
            while not stop.is_set():
                body = {"model": FLEET_MODEL, "prompt": "hi", "max_tokens": 30, "ignore_eos": True}
                async with session.post(url + "/v1/completions", json=body) as response:
                    await response.read()

        async with aiohttp.ClientSession() as session, browser(tmp_path) as chrome:
            tasks = [asyncio.create_task(client(session)) for _ in range(8)]
            try:
                page = await chrome.new_page()
                await page.set_headers(basic_header(FLEET_ADMIN_KEY))
                await page.navigate(url + "/dashboard")
                first = await snapshot_after(page, 2)
                later = await snapshot_after(page, first["renders"] + 2)
            finally:
                stop.set()
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            for snapshot in (first, later):
                assert [w["worker"] for w in snapshot["state"]["workers"]] == [0, 1]
                assert_dom_sums_workers(snapshot)
            finished = [
                shown(s["models"][FLEET_MODEL]["lanes"]["shared"]["finished"])
                for s in (first, later)
            ]
            assert finished[1] > finished[0] > 0, finished
            header = await page.evaluate(
                "[...document.querySelectorAll('#status [data-field]')].map(e => e.textContent)"
            )
            assert "2/2 workers" in header
            assert "store: redis, global, 2 replicas" in header
            links = await page.evaluate(
                "[...document.querySelectorAll('#links tr[data-link]')].map((row) =>"
                " [row.dataset.link, row.querySelector('[data-field=mode]').textContent])"
            )
            sessions = [w["store"]["session"] for w in later["state"]["workers"]]
            assert links == [[session, "global"] for session in sessions], links
            assert page.errors == []

            real = await fetch_fleet_state(session, url, FLEET_ADMIN_KEY)
            failed = {"workers": [real["workers"][0], {"worker": 1, "error": "timed out"}]}
            await page.fulfill("*/admin/state", orjson.dumps(failed))
            shows = await snapshot_after(page, later["renders"] + 2)
            assert shows["state"] == failed
            assert_dom_sums_workers(shows)
            errors = await page.evaluate(
                "[...document.querySelectorAll('[data-field=worker-error]')]"
                ".map(e => e.textContent)"
            )
            assert errors == ["worker 1: timed out"]
            workers = await page.evaluate(
                "document.querySelector('[data-field=workers]').textContent"
            )
            assert workers == "1/2 workers"


async def fetch_fleet_state(session: aiohttp.ClientSession, url: str, key: str) -> dict[str, Any]:
    """``/admin/state`` of a ``serve --workers`` gateway, every worker having answered."""
    headers = {"Authorization": f"Bearer {key}"}
    for _ in range(50):
        async with session.get(url + "/admin/state", headers=headers) as response:
            data: dict[str, Any] = await response.json()
        if all("models" in w for w in data["workers"]):
            return data
        await asyncio.sleep(0.1)
    raise AssertionError(f"a worker kept failing: {data}")
