"""The ``BatchBackend`` contract, run over every backend (SQLite and Redis)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterator

import orjson
import pytest

from sluicegate.batches.batch_backend import (
    BatchBackend,
    Counts,
    Quota,
    QuotaExceededError,
    Result,
    Retry,
    Swept,
)
from tests.batches.conftest import (
    ENDPOINT,
    LEASE_S,
    NOW,
    RETENTION_S,
    answer,
    batch_over,
    content,
    file_of,
    line,
    new_batch,
    read,
)


async def test_files_are_stored_listed_paged_and_deleted_per_tenant(
    backend: BatchBackend,
) -> None:
    """A file keeps its lines in order; listing is newest first with ``after`` and
    ``has_more``; another tenant sees nothing and deletes nothing."""
    lines = [f"line {i}".encode() for i in range(2500)]
    first = await backend.create_file(file_of("t1", "a.jsonl", 123), lines)
    assert first["lines"] == 2500
    assert first["bytes"] == 123
    assert first["filename"] == "a.jsonl"
    second = await backend.create_file(file_of("t1", "b.jsonl", 1, NOW + 1), [b"x"])
    third = await backend.create_file(file_of("t1", "c.jsonl", 1, NOW + 2, purpose="other"), [b"y"])
    assert await backend.get_file("t1", first["id"]) == first
    assert await backend.get_file("t2", first["id"]) is None
    assert await backend.get_file("t1", "file-nope") is None
    assert await content(backend, first["id"]) == lines
    assert await backend.file_page(first["id"], 2499) == [b"line 2499"]

    page, more = await backend.list_files("t1", None, None, 2)
    assert [f["id"] for f in page] == [third["id"], second["id"]]
    assert more
    page, more = await backend.list_files("t1", None, second["id"], 2)
    assert [f["id"] for f in page] == [first["id"]]
    assert not more
    page, more = await backend.list_files("t1", "batch", None, 1)
    assert [f["id"] for f in page] == [second["id"]]
    assert more
    assert await backend.list_files("t2", None, None, 10) == ([], False)
    assert await backend.list_files("t1", None, "file-gone", 10) == ([], False)
    theirs = await backend.create_file(file_of("t2", "t.jsonl", 1, NOW + 3), [b"z"])
    assert await backend.list_files("t1", None, theirs["id"], 10) == ([], False)

    assert not await backend.delete_file("t2", first["id"])
    assert await backend.delete_file("t1", first["id"])
    assert not await backend.delete_file("t1", first["id"])
    assert await backend.get_file("t1", first["id"]) is None
    assert await backend.file_page(first["id"], 0) == []
    page, _ = await backend.list_files("t1", None, None, 10)
    assert [f["id"] for f in page] == [third["id"], second["id"]]


async def test_a_failing_upload_stores_nothing(backend: BatchBackend) -> None:
    """An exception raised while the lines are read propagates and leaves no file."""

    def lines() -> Iterator[bytes]:
        yield from (b"a" for _ in range(1500))
        raise ValueError("upload broke")

    with pytest.raises(ValueError, match="upload broke"):
        await backend.create_file(file_of("t1", "a.jsonl", 10), lines())
    assert await backend.list_files("t1", None, None, 10) == ([], False)


async def test_batches_are_created_listed_and_cancelled_per_tenant(backend: BatchBackend) -> None:
    """A batch starts ``validating``; listing pages newest first; cancel moves an unfinished
    batch to ``cancelling`` once; another tenant's batch is None."""
    file = await backend.create_file(file_of("t1", "in.jsonl", 5), [line("a")])
    ids = []
    for i in range(3):
        row = await backend.create_batch(batch_over(file, lane="batch", metadata={"n": str(i)}))
        assert row["status"] == "validating"
        assert (row["tenant"], row["input_file_id"]) == ("t1", file["id"])
        assert (row["endpoint"], row["completion_window"]) == (ENDPOINT, "3600s")
        assert row["created_at"] == NOW
        assert row["expires_at"] == NOW + 3600
        assert row["lane"] == "batch"
        assert orjson.loads(row["metadata"]) == {"n": str(i)}
        assert row["total"] == 0
        assert row["output_file_id"] is None
        ids.append(row["id"])
        assert await backend.get_batch("t1", row["id"]) == row
    assert await backend.get_batch("t2", ids[0]) is None
    page, more = await backend.list_batches("t1", None, 2)
    assert [b["id"] for b in page] == [ids[2], ids[1]]
    assert more
    page, more = await backend.list_batches("t1", ids[1], 2)
    assert [b["id"] for b in page] == [ids[0]]
    assert not more
    assert await backend.list_batches("t2", None, 5) == ([], False)
    assert await backend.list_batches("t2", ids[2], 5) == ([], False)
    assert await backend.batch_route(ids[0]) == ("t1", "batch", "/v1/chat/completions")
    assert await backend.batch_route("batch_nope") is None

    assert await backend.cancel_batch("t2", ids[0], NOW + 5) is None
    assert await backend.cancel_batch("t1", "batch_nope", NOW + 5) is None
    cancelled = await backend.cancel_batch("t1", ids[0], NOW + 5)
    assert cancelled is not None
    assert cancelled["status"] == "cancelling"
    assert cancelled["cancelling_at"] == NOW + 5
    again = await backend.cancel_batch("t1", ids[0], NOW + 9)
    assert again is not None
    assert again["cancelling_at"] == NOW + 5
    assert await backend.statuses([ids[0], ids[1], "batch_nope"]) == {
        ids[0]: "cancelling",
        ids[1]: "validating",
    }


async def test_validation_runs_good_lines_and_counts_bad_ones_failed(
    backend: BatchBackend,
) -> None:
    """Good lines make the batch ``in_progress`` with every line in ``total``; malformed lines
    become error results, counted failed, and never run."""
    lines = [line("a"), b"not json", line("b", "m2"), line("c", "unknown")]
    batch_id = await new_batch(backend, lines)
    assert await backend.validate_pending(read, NOW + 1) == [(batch_id, "in_progress")]
    assert await backend.validate_pending(read, NOW + 2) == []
    row = await backend.get_batch("t1", batch_id)
    assert row is not None
    assert row["status"] == "in_progress"
    assert row["total"] == 4
    assert row["in_progress_at"] == NOW + 1
    assert await backend.batch_counts(batch_id) == Counts(completed=0, failed=2)
    m1 = await backend.claim("m1", "A", 10, NOW + 2, LEASE_S)
    m2 = await backend.claim("m2", "A", 10, NOW + 2, LEASE_S)
    assert [(c.custom_id, c.idx, c.attempts) for c in m1] == [("a", 0, 0)]
    assert [(c.custom_id, c.idx) for c in m2] == [("b", 2)]
    assert orjson.loads(m2[0].body)["model"] == "m2"


@pytest.mark.parametrize(
    ("lines", "errors"),
    [
        ([line("a"), line("b"), line("a")], [("duplicate_custom_id", 3)]),
        ([line("a", "unknown"), line("a")], [("duplicate_custom_id", 2)]),
        ([b"{}", b"[1]"], [("invalid_custom_id", 1), ("invalid_json_line", 2)]),
        ([], [("empty_file", None)]),
    ],
    ids=["duplicate", "duplicate-of-a-malformed-line", "all-bad", "empty"],
)
async def test_validation_fails_a_batch_that_cannot_run(
    backend: BatchBackend, lines: list[bytes], errors: list[tuple[str, int | None]]
) -> None:
    """A repeated custom_id (even on a malformed line), no runnable line or no line at all:
    ``failed`` with the problems and their line numbers, and nothing to claim."""
    batch_id = await new_batch(backend, lines)
    assert await backend.validate_pending(read, NOW + 1) == [(batch_id, "failed")]
    row = await backend.get_batch("t1", batch_id)
    assert row is not None
    assert row["status"] == "failed"
    assert row["failed_at"] == NOW + 1
    assert [(e["code"], e["line"]) for e in orjson.loads(row["errors"])] == errors
    assert await backend.claim("m1", "A", 10, NOW + 2, LEASE_S) == []
    assert await backend.finish_due(NOW + 10**6) == []


async def test_validation_fails_when_the_input_was_deleted(backend: BatchBackend) -> None:
    """A batch whose input file is deleted before it is checked fails."""
    file = await backend.create_file(file_of("t1", "in.jsonl", 5), [line("a")])
    row = await backend.create_batch(batch_over(file))
    assert await backend.delete_file("t1", file["id"])
    assert await backend.validate_pending(read, NOW) == [(row["id"], "failed")]


async def test_a_claim_holds_until_its_lease_ends_then_another_owner_takes_it(
    backend: BatchBackend,
) -> None:
    """A line is claimed once; after its lease runs out another owner claims it; when both
    record, the first result is the one kept."""
    batch_id = await new_batch(backend, [line("a"), line("b")])
    await backend.validate_pending(read, NOW)
    first = await backend.claim("m1", "A", 1, NOW, LEASE_S)
    assert [c.custom_id for c in first] == ["a"]
    second = await backend.claim("m1", "B", 5, NOW + 1, LEASE_S)
    assert [c.custom_id for c in second] == ["b"]
    assert await backend.claim("m1", "B", 5, NOW + LEASE_S - 1, LEASE_S) == []
    stale = await backend.claim("m1", "B", 5, NOW + LEASE_S + 0.5, LEASE_S)
    assert [(c.custom_id, c.idx) for c in stale] == [("a", 0)]
    await backend.record([answer(stale[0], prompt=3, completion=4)], [], "B")
    await backend.record([Result(batch_id, 0, False, b'{"late": 1}', 9, 9)], [], "A")
    assert await backend.batch_counts(batch_id) == Counts(1, 0, 3, 4)
    await backend.record([answer(second[0], completion=5)], [], "B")
    assert await backend.finish_due(NOW + 40) == [(batch_id, "completed")]
    row = await backend.get_batch("t1", batch_id)
    assert row is not None
    assert row["error_file_id"] is None
    out = [orjson.loads(text) for text in await content(backend, row["output_file_id"])]
    assert out == [{"custom_id": "a", "ok": True}, {"custom_id": "b", "ok": True}]


async def test_retries_wait_and_only_failures_count_as_attempts(backend: BatchBackend) -> None:
    """A retried line is not claimable before ``not_before``; a failed retry adds an attempt,
    a deferred one does not; only the current owner can send a line back."""
    await new_batch(backend, [line("a")])
    await backend.validate_pending(read, NOW)
    (claim,) = await backend.claim("m1", "A", 1, NOW, LEASE_S)
    await backend.record([], [Retry(claim, NOW + 10, failed=True)], "A")
    assert await backend.claim("m1", "A", 1, NOW + 9, LEASE_S) == []
    (claim,) = await backend.claim("m1", "A", 1, NOW + 10, LEASE_S)
    assert claim.attempts == 1
    await backend.record([], [Retry(claim, NOW + 20, failed=False)], "B")
    assert await backend.claim("m1", "C", 1, NOW + 20, LEASE_S) == []
    await backend.record([], [Retry(claim, NOW + 20, failed=False)], "A")
    (claim,) = await backend.claim("m1", "A", 1, NOW + 20, LEASE_S)
    assert claim.attempts == 1


async def test_renew_keeps_a_claim_from_going_stale(backend: BatchBackend) -> None:
    """A renewed lease lasts until its new end; an expired one does not."""
    await new_batch(backend, [line("a")])
    await backend.validate_pending(read, NOW)
    claims = await backend.claim("m1", "A", 1, NOW, LEASE_S)
    await backend.renew("A", claims, NOW + 100)
    assert await backend.claim("m1", "B", 1, NOW + 99, LEASE_S) == []
    assert len(await backend.claim("m1", "B", 1, NOW + 101, LEASE_S)) == 1


async def test_completed_batch_files_hold_one_line_per_input_line_in_order(
    backend: BatchBackend,
) -> None:
    """A batch ends ``completed`` when every line has a result: answers in the output file,
    error lines (malformed, failed) in the error file, each by input index, and the usage."""
    lines = [line(f"c{i}") for i in range(5)] + [b"oops"] + [line("c6", "m2")]
    batch_id = await new_batch(backend, lines)
    await backend.validate_pending(read, NOW)
    claims = await backend.claim("m1", "A", 10, NOW, LEASE_S)
    claims += await backend.claim("m2", "A", 10, NOW, LEASE_S)
    assert [c.idx for c in claims] == [0, 1, 2, 3, 4, 6]
    assert await backend.finish_due(NOW + 1) == []
    results = [answer(c, ok=c.idx != 3, prompt=2, completion=1) for c in reversed(claims)]
    await backend.record(results, [], "A")
    assert await backend.finish_due(NOW + 2) == [(batch_id, "completed")]
    assert await backend.finish_due(NOW + 3) == []
    row = await backend.get_batch("t1", batch_id)
    assert row is not None
    assert row["status"] == "completed"
    assert row["completed_at"] == NOW + 2
    out = [orjson.loads(t)["custom_id"] for t in await content(backend, row["output_file_id"])]
    assert out == ["c0", "c1", "c2", "c4", "c6"]
    errors = [orjson.loads(t) for t in await content(backend, row["error_file_id"])]
    assert [e["custom_id"] for e in errors] == ["c3", None]
    assert errors[1]["error"]["code"] == "invalid_json_line"
    assert await backend.batch_counts(batch_id) == Counts(5, 2, 12, 6)
    output = await backend.get_file("t1", row["output_file_id"])
    assert output is not None
    assert output["purpose"] == "batch_output"
    assert output["lines"] == 5
    assert output["bytes"] == sum(len(t) + 1 for t in await content(backend, output["id"]))
    await backend.record([answer(claims[0], ok=False)], [], "A")
    assert await backend.batch_counts(batch_id) == Counts(5, 2, 12, 6)


@pytest.mark.parametrize("ending", ["expired", "cancelled"])
async def test_an_ended_batch_gives_its_unfinished_lines_error_lines(
    backend: BatchBackend, ending: str
) -> None:
    """Expired (past ``expires_at``) or cancelled: every line without a result gets a
    ``batch_expired``/``batch_cancelled`` error line; results after the end are ignored and
    the lines no longer run."""
    batch_id = await new_batch(backend, [line(f"c{i}") for i in range(4)], window_s=100)
    await backend.validate_pending(read, NOW)
    claims = await backend.claim("m1", "A", 2, NOW, LEASE_S)
    await backend.record([answer(claims[1])], [], "A")
    if ending == "cancelled":
        await backend.cancel_batch("t1", batch_id, NOW + 5)
        assert await backend.finish_due(NOW + 6) == [(batch_id, "cancelled")]
    else:
        assert await backend.finish_due(NOW + 99) == []
        assert await backend.finish_due(NOW + 100) == [(batch_id, "expired")]
    await backend.record([answer(claims[0])], [], "A")
    assert await backend.claim("m1", "B", 10, NOW + 1000, LEASE_S) == []
    row = await backend.get_batch("t1", batch_id)
    assert row is not None
    assert row["status"] == ending
    assert row[f"{ending}_at"] is not None
    out = [orjson.loads(t)["custom_id"] for t in await content(backend, row["output_file_id"])]
    assert out == ["c1"]
    errors = [orjson.loads(t) for t in await content(backend, row["error_file_id"])]
    assert [e["custom_id"] for e in errors] == ["c0", "c2", "c3"]
    assert {e["error"]["code"] for e in errors} == {f"batch_{ending}"}
    assert await backend.batch_counts(batch_id) == Counts(1, 3)


async def test_a_batch_cancelled_while_validating_ends_without_files(
    backend: BatchBackend,
) -> None:
    """Cancelled before its lines were checked: ``cancelled``, no files, never validated."""
    batch_id = await new_batch(backend, [line("a")])
    await backend.cancel_batch("t1", batch_id, NOW)
    assert await backend.validate_pending(read, NOW) == []
    assert await backend.finish_due(NOW) == [(batch_id, "cancelled")]
    row = await backend.get_batch("t1", batch_id)
    assert row is not None
    assert row["output_file_id"] is None
    assert row["error_file_id"] is None


async def test_progress_counts_lines_by_state_and_batches_by_status(
    backend: BatchBackend,
) -> None:
    """Lines of unfinished batches per (model, state), and batches per status."""
    done_id = await new_batch(backend, [line("z")])
    await backend.validate_pending(read, NOW)
    (claim,) = await backend.claim("m1", "A", 1, NOW, LEASE_S)
    await backend.record([answer(claim)], [], "A")
    await backend.finish_due(NOW)
    await new_batch(backend, [line("a"), line("b"), line("c"), line("d", "m2"), b"bad"])
    await backend.validate_pending(read, NOW)
    await new_batch(backend, [line("v")])
    claims = await backend.claim("m1", "A", 3, NOW, LEASE_S)
    await backend.record([answer(claims[0]), answer(claims[1], ok=False)], [], "A")
    lines, batches = await backend.progress()
    assert lines == {
        ("m1", "completed"): 1,
        ("m1", "failed"): 1,
        ("m1", "running"): 1,
        ("m2", "queued"): 1,
    }
    assert batches == {"completed": 1, "in_progress": 1, "validating": 1}
    await backend.record([], [Retry(claims[2], NOW + 5, failed=True)], "A")
    lines, _ = await backend.progress()
    assert lines[("m1", "queued")] == 1
    assert ("m1", "running") not in lines
    assert await backend.statuses([done_id]) == {done_id: "completed"}


async def test_a_batch_answered_in_full_completes_even_past_its_window(
    backend: BatchBackend,
) -> None:
    """Every line has its result when the window ends: ``completed``, not ``expired``."""
    batch_id = await new_batch(backend, [line("a")], window_s=100)
    await backend.validate_pending(read, NOW)
    (claim,) = await backend.claim("m1", "A", 1, NOW, LEASE_S)
    await backend.record([answer(claim)], [], "A")
    assert await backend.finish_due(NOW + 100) == [(batch_id, "completed")]


async def _refused(call: Awaitable[object]) -> QuotaExceededError:
    with pytest.raises(QuotaExceededError) as refused:
        await call
    return refused.value


async def test_file_quotas_hold_per_tenant_and_free_on_delete(backend: BatchBackend) -> None:
    """Bytes and files count every file of a tenant; an upload past either is refused
    before a line is stored (and names the earliest expiry); another tenant is unaffected;
    a delete gives the room back."""
    quota = Quota(max_bytes=100, max_files=3)
    first = await backend.create_file(
        file_of("t1", "a", 60, expires_at=NOW + 50), [b"a"], quota=quota
    )
    refused = await _refused(backend.create_file(file_of("t1", "b", 41), [b"b"], quota=quota))
    assert (refused.kind, refused.limit, refused.retry_at) == ("bytes", 100, NOW + 50)
    await backend.create_file(file_of("t2", "b", 100), [b"b"], quota=quota)
    await backend.create_file(file_of("t1", "c", 40), [b"c"], quota=quota)
    await backend.create_file(file_of("t1", "d", 0), [b"d"], quota=quota)
    refused = await _refused(backend.create_file(file_of("t1", "e", 0), [b"e"], quota=quota))
    assert (refused.kind, refused.limit) == ("files", 3)
    files, _ = await backend.list_files("t1", None, None, 10)
    assert [f["filename"] for f in files] == ["d", "c", "a"]
    assert await backend.delete_file("t1", first["id"])
    await backend.create_file(file_of("t1", "f", 60), [b"f"], quota=quota)


async def test_two_uploads_at_once_cannot_both_take_the_last_bytes(
    backend: BatchBackend,
) -> None:
    """The quota is reserved atomically before the lines are written: of two concurrent
    uploads that each fit alone, one is stored and the other refused, whole."""
    quota = Quota(max_bytes=100)
    lines = [f"line {i}".encode() for i in range(3000)]
    outcomes = await asyncio.gather(
        backend.create_file(file_of("t1", "a", 60), lines, quota=quota),
        backend.create_file(file_of("t1", "b", 60), lines, quota=quota),
        return_exceptions=True,
    )
    assert sorted(type(o).__name__ for o in outcomes) == ["QuotaExceededError", "dict"]
    files, _ = await backend.list_files("t1", None, None, 10)
    assert len(files) == 1
    assert await content(backend, files[0]["id"]) == lines


async def test_a_failed_upload_gives_its_reservation_back(backend: BatchBackend) -> None:
    """An upload whose lines raise stores nothing and holds none of the quota."""
    quota = Quota(max_bytes=100, max_files=1)

    def lines() -> Iterator[bytes]:
        yield from (b"a" for _ in range(2500))
        raise ValueError("upload broke")

    with pytest.raises(ValueError, match="upload broke"):
        await backend.create_file(file_of("t1", "a", 100), lines(), quota=quota)
    stored = await backend.create_file(file_of("t1", "b", 100), [b"b"], quota=quota)
    assert stored["bytes"] == 100


async def test_active_batches_are_bounded_until_one_ends(backend: BatchBackend) -> None:
    """``max_active_batches`` counts batches not yet over: the next create is refused
    (naming the earliest window end) until one ends; another tenant is unaffected."""
    quota = Quota(max_active_batches=2)
    file = await backend.create_file(file_of("t1", "in", 5), [line("a")])
    theirs = await backend.create_file(file_of("t2", "in", 5), [line("a")])
    ids = []
    for window_s in (600, 300):
        row = await backend.create_batch(batch_over(file, window_s=window_s), quota=quota)
        ids.append(row["id"])
    refused = await _refused(backend.create_batch(batch_over(file), quota=quota))
    assert (refused.kind, refused.limit, refused.retry_at) == ("active_batches", 2, NOW + 300)
    await backend.create_batch(batch_over(theirs), quota=quota)
    await backend.validate_pending(read, NOW + 1)
    await backend.cancel_batch("t1", ids[0], NOW + 2)
    await _refused(backend.create_batch(batch_over(file), quota=quota))
    assert (ids[0], "cancelled") in await backend.finish_due(NOW + 3)
    await backend.create_batch(batch_over(file), quota=quota)


async def test_output_files_count_against_the_tenant_and_expire(retained: BatchBackend) -> None:
    """A batch's output and error files belong to its tenant's bytes and files, and expire
    ``file_retention_s`` after they were written."""
    batch_id = await new_batch(retained, [line("a"), b"not json"])
    await retained.validate_pending(read, NOW + 1)
    claims = await retained.claim("m1", "A", 10, NOW + 1, LEASE_S)
    await retained.record([answer(claims[0])], [], "A")
    assert await retained.finish_due(NOW + 2) == [(batch_id, "completed")]
    row = await retained.get_batch("t1", batch_id)
    assert row is not None
    output = await retained.get_file("t1", row["output_file_id"])
    errors = await retained.get_file("t1", row["error_file_id"])
    assert output is not None
    assert errors is not None
    assert output["expires_at"] == errors["expires_at"] == NOW + 2 + RETENTION_S
    stored = 100 + output["bytes"] + errors["bytes"]
    await _refused(
        retained.create_file(file_of("t1", "x", 1), [b"x"], quota=Quota(max_bytes=stored))
    )
    await _refused(retained.create_file(file_of("t1", "x", 0), [b"x"], quota=Quota(max_files=3)))
    await retained.sweep(NOW + 2 + RETENTION_S, None, 100)
    assert await retained.get_file("t1", output["id"]) is None
    await retained.create_file(file_of("t1", "x", 1), [b"x"], quota=Quota(max_bytes=101))


async def test_the_sweep_deletes_expired_files_once_and_frees_their_quota(
    backend: BatchBackend,
) -> None:
    """A file is kept until its ``expires_at`` and deleted by the first sweep at or after
    it, lines and all, in steps of ``limit``; a second sweep finds nothing; the quota it
    held is free again."""
    quota = Quota(max_bytes=300)
    for i in range(3):
        await backend.create_file(
            file_of("t1", f"f{i}", 100, expires_at=NOW + 10), [b"x"] * 1500, quota=quota
        )
    kept = await backend.create_file(file_of("t1", "kept", 0), [b"k"], quota=quota)
    assert await backend.sweep(NOW + 9, None, 10) == Swept()
    assert await backend.sweep(NOW + 10, None, 2) == Swept(files=2)
    assert await backend.sweep(NOW + 10, None, 2) == Swept(files=1)
    assert await backend.sweep(NOW + 10, None, 2) == Swept()
    files, _ = await backend.list_files("t1", None, None, 10)
    assert [f["id"] for f in files] == [kept["id"]]
    await backend.create_file(file_of("t1", "again", 300), [b"a"], quota=quota)


async def test_a_batch_whose_input_expired_still_runs_its_lines(backend: BatchBackend) -> None:
    """The lines of a batch were copied when it was checked: its input file expiring (and
    swept) does not stop it."""
    file = await backend.create_file(
        file_of("t1", "in", 5, expires_at=NOW + 5), [line("a"), line("b")]
    )
    batch = await backend.create_batch(batch_over(file))
    await backend.validate_pending(read, NOW + 1)
    assert await backend.sweep(NOW + 5, None, 10) == Swept(files=1)
    claims = await backend.claim("m1", "A", 10, NOW + 6, LEASE_S)
    assert [c.custom_id for c in claims] == ["a", "b"]
    await backend.record([answer(c) for c in claims], [], "A")
    assert await backend.finish_due(NOW + 7) == [(batch["id"], "completed")]
    assert await backend.batch_counts(batch["id"]) == Counts(completed=2)


async def test_batches_over_for_their_retention_are_swept(backend: BatchBackend) -> None:
    """A batch is deleted ``batch_retention_s`` after it ended (not before, and never while
    it runs), with its counts; listing and progress no longer show it."""
    running = await new_batch(backend, [line("a")])
    ended = await new_batch(backend, [line("b")])
    await backend.validate_pending(read, NOW + 1)
    await backend.cancel_batch("t1", ended, NOW + 2)
    await backend.finish_due(NOW + 3)
    assert await backend.sweep(NOW + 3 + 99, 100, 10) == Swept()
    assert await backend.sweep(NOW + 3 + 100, 100, 10) == Swept(batches=1)
    assert await backend.sweep(NOW + 3 + 100, 100, 10) == Swept()
    assert await backend.get_batch("t1", ended) is None
    page, _ = await backend.list_batches("t1", None, 10)
    assert [b["id"] for b in page] == [running]
    _, statuses = await backend.progress()
    assert statuses == {"in_progress": 1}
    assert await backend.sweep(NOW + 10**6, 100, 10) == Swept()
