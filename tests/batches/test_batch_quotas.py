"""Batch data has owners, quotas and an end (issue 27, finding 3), through the SDK.

Per-tenant quotas (bytes stored, files, batches not yet over; a per-tenant override)
are refused with 429 ``quota_exceeded``, ``Retry-After`` and ``x-should-retry: false``
(the SDK does not send the upload again), store nothing, and free up after a delete or
an expiry. ``expires_after`` on upload is honoured and shown as ``expires_at``; the
sweeper deletes expired files and batches past their retention, which are 404 after.
"""

from __future__ import annotations

import io
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest

from sluicegate.batches.batch_backend import Quota, QuotaExceededError, Swept
from sluicegate.batches.sqlite.sqlite_batches import SqliteBatches
from sluicegate.config import ConfigError, parse_config
from tests.batches.batch_harness import (
    CHAT,
    KEY_A,
    KEY_B,
    batch_stack,
    chat_line,
    client,
    jsonl,
    refusal,
    start_batch,
    upload,
    wait_batch,
)
from tests.batches.conftest import file_of
from tests.gateway.gateway_harness import Stack, wait_until

QUOTAS = """  quota:
    max_bytes: 100000
    max_files: 3
    max_active_batches: 1
    tenants:
      b: {max_bytes: 1000000}
"""


def _file(size: int) -> bytes:
    """A JSONL file of exactly ``size`` bytes (at least 200)."""
    line = jsonl([chat_line("pad", text="x")])
    pad = size - len(line)
    return jsonl([chat_line("pad", text="x" * (1 + pad))])


def _upload(sdk: openai.OpenAI, size: int, **extra: object) -> openai.types.FileObject:
    return sdk.files.create(file=("f.jsonl", io.BytesIO(_file(size))), purpose="batch", **extra)  # type: ignore[arg-type]


@contextmanager
def counting_client(live: Stack, key: str = KEY_A) -> Iterator[tuple[openai.OpenAI, list[str]]]:
    """An SDK client that retries as the SDK does by default (twice), and the requests it
    sent."""
    sent: list[str] = []
    http = openai.DefaultHttpxClient(event_hooks={"request": [lambda r: sent.append(r.url.path)]})
    sdk = openai.OpenAI(
        base_url=live.base_url + "/v1", api_key=key, max_retries=2, http_client=http
    )
    with sdk:
        yield sdk, sent


def test_uploads_past_a_quota_are_429_store_nothing_and_fit_after_a_delete(
    tmp_path: Path,
) -> None:
    """Tenant a (100 kB, 3 files): an upload past its bytes is 429 ``quota_exceeded`` with
    ``Retry-After`` and ``x-should-retry: false``, which the SDK obeys (one request, no
    retry); nothing is stored. Tenant b (its own 1 MB) is unaffected. A delete frees the
    room. A fourth file is refused by ``max_files``."""
    with batch_stack(tmp_path, settings=QUOTAS) as live:
        sdk_a, sdk_b = client(live), client(live, KEY_B)
        first = _upload(sdk_a, 60_000)
        assert first.bytes == 60_000
        with counting_client(live) as (retrying, sent):
            with pytest.raises(openai.RateLimitError) as refused:
                _upload(retrying, 50_000)
            assert sent == ["/v1/files"]
        response = refused.value.response
        assert response.headers["x-should-retry"] == "false"
        assert int(response.headers["retry-after"]) >= 1
        assert int(response.headers["retry-after-ms"]) >= 1
        assert isinstance(refused.value.body, dict)
        assert refused.value.body["code"] == "quota_exceeded"
        assert "batches.quota.max_bytes" in refused.value.body["message"]
        assert [f.id for f in sdk_a.files.list()] == [first.id]
        assert _upload(sdk_b, 150_000).bytes == 150_000
        sdk_a.files.delete(first.id)
        kept = [_upload(sdk_a, 50_000), _upload(sdk_a, 300), _upload(sdk_a, 300)]
        status, error = refusal(lambda: _upload(sdk_a, 300))
        assert (status, error["code"]) == (429, "quota_exceeded")
        assert "batches.quota.max_files" in error["message"]
        assert {f.id for f in sdk_a.files.list()} == {f.id for f in kept}


def test_active_batches_are_bounded_until_one_ends(tmp_path: Path) -> None:
    """With ``max_active_batches: 1`` a second batch is 429 ``quota_exceeded`` while the
    first runs; once the first is cancelled, the second is accepted. Both creates name one
    input, uploaded once: the first batch's error file is the third file of ``max_files:
    3`` whenever its line was checked before the cancel, so another upload would be refused."""
    with batch_stack(tmp_path, settings=QUOTAS) as live:
        sdk = client(live)
        first = start_batch(sdk, [chat_line("a", max_tokens=2000)])
        quick = upload(sdk, [chat_line("b")])

        def create() -> openai.types.Batch:
            return sdk.batches.create(
                input_file_id=quick.id, endpoint=CHAT, completion_window="24h"
            )

        status, error = refusal(create)
        assert (status, error["code"]) == (429, "quota_exceeded")
        assert "batches.quota.max_active_batches" in error["message"]
        sdk.batches.cancel(first.id)
        wait_batch(sdk, first.id)
        second = create()
        assert wait_batch(sdk, second.id).status == "completed"


def test_expires_after_is_honoured_and_checked(tmp_path: Path) -> None:
    """``expires_after`` (anchor ``created_at``, 3600 s to 30 days) sets ``expires_at``;
    without it a file expires after ``file_retention`` (30 days); a bad anchor or number
    is 400 ``invalid_expires_after`` naming the field, and stores nothing."""
    with batch_stack(tmp_path) as live:
        sdk = client(live)
        asked = _upload(sdk, 300, expires_after={"anchor": "created_at", "seconds": 3600})
        assert asked.expires_at == asked.created_at + 3600
        assert sdk.files.retrieve(asked.id).expires_at == asked.created_at + 3600
        default = _upload(sdk, 300)
        assert default.expires_at == default.created_at + 30 * 86400
        before = [f.id for f in sdk.files.list()]
        for expires, param in (
            ({"anchor": "last_active_at", "seconds": 3600}, "expires_after.anchor"),
            ({"anchor": "created_at", "seconds": 59}, "expires_after.seconds"),
            ({"anchor": "created_at", "seconds": 2_592_001}, "expires_after.seconds"),
        ):
            status, error = refusal(lambda e=expires: _upload(sdk, 300, expires_after=e))  # type: ignore[misc]
            assert (status, error["code"], error["param"]) == (
                400,
                "invalid_expires_after",
                param,
            )
        assert [f.id for f in sdk.files.list()] == before


def test_the_sweeper_ends_files_and_batches_and_frees_the_quota(tmp_path: Path) -> None:
    """``file_retention: 3s`` and ``batch_retention: 1s``: a batch runs to completion; then
    its input and output files and the batch itself are 404 (retrieve, content, listing),
    and the tenant's full byte quota is free again."""
    settings = (
        "  file_retention: 3s\n  batch_retention: 1s\n  sweep_interval_s: 0.2\n"
        "  quota:\n    max_bytes: 20000\n"
    )
    with batch_stack(tmp_path, settings=settings) as live:
        sdk = client(live)
        batch = start_batch(sdk, [chat_line("a"), chat_line("b")])
        done = wait_batch(sdk, batch.id)
        assert done.status == "completed"
        assert done.output_file_id is not None
        output = sdk.files.retrieve(done.output_file_id)
        assert output.expires_at is not None
        assert output.expires_at <= output.created_at + 3
        status, error = refusal(lambda: _upload(sdk, 19_000))
        assert (status, error["code"]) == (429, "quota_exceeded")

        def gone() -> bool:
            return not list(sdk.files.list()) and not list(sdk.batches.list())

        assert wait_until(gone, 10.0, 0.1)
        for call in (
            lambda: sdk.files.retrieve(batch.input_file_id),
            lambda: sdk.files.content(done.output_file_id or ""),
            lambda: sdk.batches.retrieve(batch.id),
        ):
            status, error = refusal(call)
            assert (status, error["code"]) == (404, "not_found")

        def room() -> bool:  # the sweeper deleted them: their bytes are free
            try:
                _upload(sdk, 19_000)
            except openai.RateLimitError:
                return False
            return True

        assert wait_until(room, 10.0, 0.2)


def test_an_expired_file_is_404_before_it_is_swept(tmp_path: Path) -> None:
    """Between its ``expires_at`` and the next sweep a file is already 404 (retrieve,
    content, a batch of it) and missing from the listing."""
    settings = "  file_retention: 1s\n  sweep_interval_s: 3600\n"
    with batch_stack(tmp_path, settings=settings) as live:
        sdk = client(live)
        file = upload(sdk, [chat_line("a")])
        time.sleep(max(0.0, (file.expires_at or 0) - time.time()) + 0.1)
        for call in (
            lambda: sdk.files.retrieve(file.id),
            lambda: sdk.files.content(file.id),
            lambda: sdk.batches.create(
                input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
            ),
        ):
            status, error = refusal(call)
            assert (status, error["code"]) == (404, "not_found")
        assert list(sdk.files.list()) == []
        assert KEY_A  # the file was tenant a's


V1_FILES = """
CREATE TABLE files (
    seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, tenant TEXT NOT NULL,
    purpose TEXT NOT NULL, filename TEXT NOT NULL, bytes INTEGER NOT NULL,
    lines INTEGER NOT NULL, created_at INTEGER NOT NULL
)"""


async def test_a_version_1_database_gets_expiry_and_quotas(tmp_path: Path) -> None:
    """A batch database written before quotas and expiry (schema 1) opens: its files get
    ``created_at + file_retention`` as their expiry, count against the quota, and are
    swept when it comes."""
    path = tmp_path / "v1.db"
    conn = sqlite3.connect(path)
    conn.execute(V1_FILES)
    conn.execute(
        "INSERT INTO files (id, tenant, purpose, filename, bytes, lines, created_at)"
        " VALUES ('file-old', 'a', 'batch', 'old.jsonl', 500, 0, 1000)"
    )
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    backend = SqliteBatches(str(path), file_retention_s=100)
    await backend.open()
    try:
        old = await backend.get_file("a", "file-old")
        assert old is not None
        assert old["expires_at"] == 1100
        with pytest.raises(QuotaExceededError):
            await backend.create_file(file_of("a", "n", 1, 1050), [b"x"], quota=Quota(500))
        assert await backend.sweep(1100, None, 10) == Swept(files=1)
        await backend.create_file(file_of("a", "n", 1, 1100), [b"x"], quota=Quota(500))
    finally:
        await backend.close()


BASE = """models:
  - name: m
    lanes: [{name: best_effort}]
tenants:
  - {name: a, api_key_env: KEY_A, default_lane: best_effort}
batches:
  path: /tmp/b.db
"""
OWN = "  quota:\n    max_files: 7\n    tenants:\n      a: {max_bytes: 5, max_files: null}\n"


def test_quota_and_retention_settings_are_checked() -> None:
    """A per-tenant quota names a configured tenant, and falls back field by field to the
    defaults (``null``: no limit); a retention is a duration or ``null``."""
    config = parse_config(BASE + OWN)
    assert config.batches is not None
    assert config.batches.quota.of("a") == Quota(max_bytes=5, max_files=None, max_active_batches=20)
    assert config.batches.quota.of("anonymous") == Quota(1024**3, 7, 20)
    assert config.batches.file_retention_s == 30 * 86400
    with pytest.raises(ConfigError, match="no such tenants"):
        parse_config(BASE + "  quota:\n    tenants:\n      nobody: {max_files: 1}\n")
    with pytest.raises(ConfigError, match="file_retention"):
        parse_config(BASE + "  file_retention: forever\n")
    off = parse_config(BASE + "  file_retention: null\n  batch_retention: null\n").batches
    assert off is not None
    assert (off.file_retention_s, off.batch_retention_s) == (None, None)
