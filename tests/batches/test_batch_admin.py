"""The admin controls every tenant's batches, and a tenant removed from the config stops.

Backend level (both backends): every tenant's batches listed and paged, the active ones and
their tenants, ``stop_batch``. Over real HTTP: ``GET /admin/batches`` and ``POST
/admin/batches/{id}/cancel`` across tenants, refused to a tenant key and cross-site; a tenant
removed between two gateway runs on the same SQLite database: its lines end as
``tenant_removed`` error lines, the batch ``cancelled``, and none ever reaches the engine.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import orjson

from sluicegate.batches.batch_backend import BatchBackend
from sluicegate.batches.objects import batch_object
from tests.batches.batch_harness import (
    ENVIRON,
    KEY_A,
    KEY_B,
    TENANTS,
    TERMINAL,
    batch_stack,
    by_custom_id,
    chat_line,
    client,
    file_lines,
    start_batch,
    wait_batch,
)
from tests.batches.conftest import NOW, answer, content, line, new_batch, read
from tests.gateway.gateway_harness import (
    ADMIN_KEY,
    Reply,
    Stack,
    engine_stats,
    http_call,
    openai_error,
    stack,
    wait_until,
)

# ------------------------------------------------------------------ backend level


async def test_admin_batches_lists_every_tenant_newest_first_and_pages(
    backend: BatchBackend,
) -> None:
    """Five batches of three tenants: all five newest first, each naming its tenant; pages of
    two follow ``after``; ``tenant`` narrows to one tenant; an unknown ``after`` is empty."""
    made = [await new_batch(backend, [line("x")], tenant=f"t{i % 3}") for i in range(5)]
    rows, more = await backend.admin_batches(None, None, 10)
    assert [r["id"] for r in rows] == made[::-1]
    assert [r["tenant"] for r in rows] == ["t1", "t0", "t2", "t1", "t0"]
    assert more is False
    seen: list[str] = []
    after = None
    while True:
        page, more = await backend.admin_batches(None, after, 2)
        seen += [r["id"] for r in page]
        if not more:
            break
        after = page[-1]["id"]
    assert seen == made[::-1]
    rows, _ = await backend.admin_batches("t1", None, 10)
    assert [r["id"] for r in rows] == [made[4], made[1]]
    assert await backend.admin_batches(None, "batch_unknown", 10) == ([], False)
    batch_object(rows[0], await backend.batch_counts(rows[0]["id"]))  # a full record


async def test_stop_batch_ends_its_lines_with_the_code_and_cancels_it(
    backend: BatchBackend,
) -> None:
    """``stop_batch`` on a running batch with one line answered: no line can be claimed any
    more, ``finish_due`` ends it ``cancelled``, the answered line stays in the output file and
    every other one is a ``tenant_removed`` error line, and ``errors`` names the code. The
    other tenant's batch is untouched; a second stop (or one of an ended batch) is False."""
    gone = await new_batch(backend, [line(f"g{i}") for i in range(4)], tenant="gone")
    kept = await new_batch(backend, [line("k0")], tenant="kept")
    await backend.validate_pending(read, NOW)
    assert sorted(await backend.active_batches()) == sorted([(gone, "gone"), (kept, "kept")])
    (first,) = await backend.claim("m1", "o", 1, NOW, 30.0)
    assert first.batch_id == gone
    await backend.record([answer(first)], [], "o")
    held = await backend.claim("m1", "o", 2, NOW, 30.0)  # in turn: kept's line, then gone's
    assert [c.batch_id for c in held] == [kept, gone]
    running = held[1]

    assert await backend.stop_batch(gone, "tenant_removed", "removed", NOW + 1) is True
    assert await backend.stop_batch(gone, "tenant_removed", "removed", NOW + 1) is False
    claims = await backend.claim("m1", "o", 10, NOW + 100, 30.0)
    assert [c.batch_id for c in claims] == [kept]
    await backend.record([answer(running)], [], "o")  # a late answer is ignored
    ended = dict(await backend.finish_due(NOW + 2))
    assert ended[gone] == "cancelled"
    row = await backend.get_batch("gone", gone)
    assert row is not None
    obj = batch_object(row, await backend.batch_counts(gone))
    assert obj["status"] == "cancelled"
    assert obj["errors"]["data"][0]["code"] == "tenant_removed"
    assert obj["request_counts"] == {"total": 4, "completed": 1, "failed": 3}
    errors = [orjson.loads(x) for x in await content(backend, row["error_file_id"])]
    assert sorted(e["custom_id"] for e in errors) == ["g1", "g2", "g3"]
    assert {e["error"]["code"] for e in errors} == {"tenant_removed"}
    assert len(await content(backend, row["output_file_id"])) == 1
    assert await backend.active_batches() == [(kept, "kept")]
    assert await backend.stop_batch(gone, "tenant_removed", "removed", NOW + 3) is False


# ------------------------------------------------------------------ over HTTP


def _admin(live: Stack, method: str, path: str, key: str | None = ADMIN_KEY) -> Reply:
    return http_call(live.base_url, method, path, key=key)


def _slow(prefix: str, n: int) -> list[dict[str, Any]]:
    return [chat_line(f"{prefix}-{i}", max_tokens=6000) for i in range(n)]


def test_the_admin_lists_and_cancels_any_tenants_batches(tmp_path: Path) -> None:
    """Tenants a and b each run a batch. ``GET /admin/batches`` shows both, newest first,
    with their tenant and counts, paged like OpenAI's lists and narrowed by ``tenant``; a
    tenant key is 401. The admin cancels b's batch (b sees it ``cancelled``); a tenant key,
    Basic credentials or a cross-site request cannot, and an unknown id is 404."""
    with batch_stack(tmp_path) as live:
        a, b = client(live, KEY_A), client(live, KEY_B)
        batch_a = start_batch(a, _slow("a", 2))
        batch_b = start_batch(b, _slow("b", 2))
        wait_batch(b, batch_b.id, lambda x: x.status == "in_progress", within_s=30)

        listing = _admin(live, "GET", "/admin/batches")
        assert listing.status == 200, listing
        data = listing.json()
        assert [(x["id"], x["tenant"]) for x in data["data"]] == [
            (batch_b.id, "b"),
            (batch_a.id, "a"),
        ]
        assert data["data"][0]["request_counts"]["total"] in (0, 2)
        assert data["object"] == "list"
        assert data["has_more"] is False
        first = _admin(live, "GET", "/admin/batches?limit=1").json()
        assert (first["has_more"], first["last_id"]) == (True, batch_b.id)
        rest = _admin(live, "GET", f"/admin/batches?limit=1&after={batch_b.id}").json()
        assert [x["id"] for x in rest["data"]] == [batch_a.id]
        only_a = _admin(live, "GET", "/admin/batches?tenant=a").json()
        assert [x["id"] for x in only_a["data"]] == [batch_a.id]
        refused = _admin(live, "GET", "/admin/batches", key=KEY_A)
        assert refused.status == 401
        assert openai_error(refused)["code"] == "invalid_admin_key"

        cancel = f"/admin/batches/{batch_b.id}/cancel"
        for key in (KEY_A, KEY_B, None):
            assert _admin(live, "POST", cancel, key=key).status == 401
        cross = http_call(
            live.base_url,
            "POST",
            cancel,
            headers={"Authorization": f"Bearer {ADMIN_KEY}", "Sec-Fetch-Site": "cross-site"},
        )
        assert cross.status == 403
        assert b.batches.retrieve(batch_b.id).status == "in_progress"
        assert _admin(live, "POST", "/admin/batches/batch_nope/cancel").status == 404

        cancelled = _admin(live, "POST", cancel)
        assert cancelled.status == 200, cancelled
        assert (cancelled.json()["status"], cancelled.json()["tenant"]) == ("cancelling", "b")
        assert wait_batch(b, batch_b.id, within_s=60).status == "cancelled"
        assert a.batches.retrieve(batch_a.id).status == "in_progress"
        a.batches.cancel(batch_a.id)
        wait_batch(a, batch_a.id, within_s=60)


def test_admin_batches_without_the_batch_lane_is_404() -> None:
    """A gateway without ``batches:`` answers the admin batch paths 404
    ``batches_disabled`` (after the admin key check)."""
    with stack("    max_concurrency: 1\n") as live:
        reply = _admin(live, "GET", "/admin/batches")
        assert reply.status == 404
        assert openai_error(reply)["code"] == "batches_disabled"
        assert _admin(live, "GET", "/admin/batches", key=None).status == 401


def test_file_content_is_no_store(tmp_path: Path) -> None:
    """``GET /v1/files/{id}/content`` carries ``Cache-Control: no-store``: prompts and
    answers are kept by no cache on the way."""
    with batch_stack(tmp_path) as live:
        file = client(live).files.create(
            file=("in.jsonl", orjson.dumps(chat_line("x")) + b"\n"), purpose="batch"
        )
        reply = http_call(live.base_url, "GET", f"/v1/files/{file.id}/content", key=KEY_A)
        assert reply.status == 200
        assert reply.headers.get("cache-control") == "no-store"


def _status(tmp_path: Path, batch_id: str) -> str:
    """A batch's status as the database holds it (read-only, beside the gateway)."""
    uri = f"file:{tmp_path / 'batches.db'}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
        (status,) = conn.execute("SELECT status FROM batches WHERE id = ?", (batch_id,)).fetchone()
    return str(status)


ONLY_A = """tenants:
  - {name: a, api_key_env: KEY_A}
"""


def test_a_removed_tenants_batch_ends_tenant_removed_and_never_runs(tmp_path: Path) -> None:
    """Run 1 (tenants a and b), drained so nothing runs: b's batch of 3 lines is accepted
    and validated. Run 2, on the same database, without b: the batch ends ``cancelled`` with
    ``tenant_removed`` in its errors and 3 failed lines, and the engine gets no request at
    all (no line ran under the default tenant's limits, or anyone's). Run 3, b back: its
    error file holds one ``tenant_removed`` line per custom_id."""
    with batch_stack(tmp_path) as live:
        assert _admin(live, "POST", "/admin/drain").status == 200
        b = client(live, KEY_B)
        batch = start_batch(b, [chat_line(f"b-{i}", max_tokens=4) for i in range(3)])
        wait_batch(b, batch.id, lambda x: x.status == "in_progress", within_s=30)

    with batch_stack(tmp_path, tenants=ONLY_A) as live:
        # read from the database itself, so the outcome shows whatever the gateway does
        assert wait_until(lambda: _status(tmp_path, batch.id) in TERMINAL, 30)
        stats = engine_stats(live.engine_url())
        assert (stats["admitted_total"], stats["finished_total"]) == (0, 0), stats
        assert _status(tmp_path, batch.id) == "cancelled"
        (row,) = _admin(live, "GET", "/admin/batches").json()["data"]
        assert (row["id"], row["tenant"]) == (batch.id, "b")
        assert row["errors"]["data"][0]["code"] == "tenant_removed"
        assert row["request_counts"] == {"total": 3, "completed": 0, "failed": 3}
        state = _admin(live, "GET", "/admin/state").json()
        assert state["models"][0]["tenants"] == []  # nobody's usage, not "other"'s
        assert _admin(live, "GET", "/admin/batches?tenant=b").json()["data"][0]["id"] == batch.id

    with batch_stack(tmp_path, tenants=TENANTS, environ=ENVIRON) as live:
        b = client(live, KEY_B)
        ended = b.batches.retrieve(batch.id)
        assert ended.status == "cancelled"
        errors = by_custom_id(file_lines(b, ended.error_file_id))
        assert {k: v["error"]["code"] for k, v in errors.items()} == {
            f"b-{i}": "tenant_removed" for i in range(3)
        }
        assert ended.output_file_id is None
