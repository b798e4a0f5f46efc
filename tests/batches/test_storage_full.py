"""Batch storage that fills up or stops answering (issue 27, findings 3 and 7).

Real gateways (in-thread uvicorn) in front of an emulated engine; real ``redis-server``s
started with a small ``maxmemory``; a real full disk (a small tmpfs, mounted when the tests
run as root). What must hold:

- Redis out of memory (one tenant's uploads filled it): uploads answer 507 ``storage_full``
  in OpenAI's shape with ``Retry-After``, the limits stay global (the store link never falls
  back, rate-limited and plain requests are served), and no log line carries a byte of the
  uploaded lines (redis-py puts a failed pipeline command's arguments in its message);
- ``batches.store``: batch data in a Redis of its own; filling it writes nothing to the
  limits' store;
- SQLite on a full disk: 507 in OpenAI's shape; the runner logs one line when it starts
  failing and one when it recovers (no traceback per tick), and the batch completes by
  itself once there is room;
- Redis paused: the batch API answers 503 ``storage_unavailable`` within
  ``batches.store_timeout_s`` (it was a plain-text 500 after redis-py's 5 s).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import redis

from sluicegate.batches.redis.redis_batches import RedisBatches
from sluicegate.config import ConfigError, parse_config
from sluicegate.gateway.batch_lane.lane import open_backend
from tests.batches.batch_harness import (
    CHAT,
    ENVIRON,
    KEY_A,
    KEY_B,
    chat_line,
    distributed_section,
    jsonl,
)
from tests.gateway.gateway_harness import (
    MODEL,
    Reply,
    Stack,
    admin_state,
    assert_retry_headers,
    http_call,
    metric,
    openai_error,
    stack,
    wait_until,
)
from tests.hardening.hardening_harness import LogCapture
from tests.store.redis_server import REDIS_SERVER, RedisServer, running_redis

CANARY = "CANARYPROMPT9f1c2e"
"""Put in every uploaded line: it must appear in no log line (no hyphen: redis-py shortens
its quote of a command at word and hyphen breaks)."""
TENANTS = """tenants:
  - {name: a, api_key_env: KEY_A, requests_per_s: 200, tokens_per_min: 10000000}
  - {name: b, api_key_env: KEY_B}
"""
SMALL = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "ignore_eos": True}
BATCH_PREFIX = "{sluicegate:batch}:"

needs_redis = pytest.mark.skipif(
    not os.path.exists(REDIS_SERVER),
    reason=f"redis-server not installed ({REDIS_SERVER}); `make test` installs it",
)


Logs = LogCapture
"""Every record of every logger (uvicorn's included), formatted with its traceback."""


@pytest.fixture
def logs() -> Iterator[Logs]:
    """Capture every record that reaches the root logger (``gateway`` adds uvicorn's)."""
    handler = Logs()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        logging.getLogger("uvicorn").removeHandler(handler)
        root.setLevel(level)


@contextlib.contextmanager
def gateway(body: str, logs: Logs) -> Iterator[Stack]:
    """``stack(body)`` whose uvicorn errors ("Exception in ASGI application" and its
    traceback) reach ``logs`` too: uvicorn's loggers do not propagate, and each server's
    start sets their handlers anew, so the handler is added once all have started."""
    with stack(body, environ=ENVIRON) as live:
        logging.getLogger("uvicorn").addHandler(logs)
        yield live


def upload(base_url: str, content: bytes, key: str = KEY_A) -> Reply:
    """``POST /v1/files`` (purpose ``batch``) as raw multipart: every status is seen as is."""
    boundary = uuid.uuid4().hex
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
            "Content-Type: application/jsonl\r\n\r\n"
        ).encode()
        + content
        + f"\r\n--{boundary}--\r\n".encode()
    )
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    return http_call(base_url, "POST", "/v1/files", body=body, key=key, headers=headers)


def canary_lines(count: int, size: int, *, tag: str = "") -> bytes:
    """``count`` chat lines of about ``size`` bytes each, each carrying the canary in its
    ``custom_id`` (a line's first bytes: what redis-py's message quotes) and its prompt."""
    text = f"{CANARY} {tag} " + "x" * size
    return jsonl([chat_line(f"{CANARY}-{tag}-{i}", text=text, max_tokens=2) for i in range(count)])


def assert_storage_full(reply: Reply) -> None:
    """507 ``storage_full`` in OpenAI's shape, with ``Retry-After``, and no request content."""
    assert reply.status == 507, reply
    error = openai_error(reply)
    assert error["code"] == "storage_full", error
    assert_retry_headers(reply)
    assert CANARY.encode() not in reply.body


def fill_with_uploads(base_url: str, *, size: int = 32_768) -> list[str]:
    """Tenant a uploads one-line files until the storage refuses one; the files accepted."""
    accepted: list[str] = []
    for index in range(2000):
        reply = upload(base_url, canary_lines(1, size, tag=f"fill{index}"))
        if reply.status != 200:
            assert_storage_full(reply)
            return accepted
        accepted.append(reply.json()["id"])
    raise AssertionError("the storage never filled")


def pin_over_maxmemory(server: RedisServer) -> None:
    """Set ``maxmemory`` 512 KiB below what Redis uses: over it for sure. At the edge where the
    uploads left it, a command's own buffer decides (a big upload is refused while a small
    write passes); the store must hold the limits even when Redis is clearly over."""
    with redis.Redis.from_url(server.url) as client:
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory", str(used - 512 * 1024))
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            client.set("probe", b"1")


def distributed_body(store: str, batches: str = "") -> str:
    """Top-level YAML of a distributed gateway with the batch lane on (no ``batches.path``)."""
    return distributed_section(store, batches, TENANTS)


def assert_limits_global(live: Stack) -> None:
    """Both tenants are served (a's rate limit is charged in the store), the link is global
    and never left global mode."""
    for key in (KEY_A, KEY_B):
        reply = http_call(live.base_url, "POST", "/v1/completions", json=SMALL, key=key)
        assert reply.status == 200, reply
    assert admin_state(live.base_url)["store"]["mode"] == "global"
    for mode in ("fail_open", "fail_closed"):
        assert not metric(live.base_url, "sluicegate_store_transitions_total", mode=mode)


def assert_no_canary(logs: Logs) -> None:
    leaked = logs.matching(CANARY)
    assert not leaked, leaked[:3]


@needs_redis
def test_redis_out_of_memory_refuses_uploads_and_keeps_limits_global(logs: Logs) -> None:
    """One Redis for limits and batch data, ``maxmemory`` 8 MiB: tenant a's uploads fill it;
    every further upload (and a create) answers 507 ``storage_full`` with ``Retry-After``,
    reads still answer, requests of both tenants are admitted by the store (global, no
    fallback), deleting files frees room (uploads go through again), and no log line holds
    the canary of the uploaded lines."""
    args = ["--maxmemory", "8mb", "--maxmemory-policy", "noeviction"]
    with (
        running_redis(args=args) as server,
        gateway(distributed_body(server.url), logs) as live,
    ):
        first = upload(live.base_url, canary_lines(2, 100, tag="first"))
        assert first.status == 200, first
        file_id = first.json()["id"]
        accepted = fill_with_uploads(live.base_url)
        assert len(accepted) > 10
        pin_over_maxmemory(server)
        for _ in range(3):
            assert_storage_full(upload(live.base_url, canary_lines(1, 200, tag="more")))
        create = {"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"}
        assert_storage_full(http_call(live.base_url, "POST", "/v1/batches", json=create, key=KEY_A))
        assert http_call(live.base_url, "GET", "/v1/files", key=KEY_A).status == 200
        assert_limits_global(live)
        refused = metric(
            live.base_url, "sluicegate_batch_storage_errors_total", source="api", kind="full"
        )
        assert refused is not None
        assert refused >= 5
        for file_id in accepted[:40]:  # deleting frees room, also while Redis is over
            path = f"/v1/files/{file_id}"
            assert http_call(live.base_url, "DELETE", path, key=KEY_A).status == 200
        assert upload(live.base_url, canary_lines(1, 200, tag="after")).status == 200
    assert_no_canary(logs)


@needs_redis
def test_a_separate_batch_store_fills_without_touching_the_limits_store(logs: Logs) -> None:
    """``batches.store`` names a Redis of its own: filling it until uploads answer 507 writes
    no batch key to the limits' store and leaves its memory where it was; limits stay
    global."""
    args = ["--maxmemory", "8mb", "--maxmemory-policy", "noeviction"]
    with (
        running_redis() as limits,
        running_redis(args=args) as data,
        gateway(distributed_body(limits.url, f"  store: {data.url}\n"), logs) as live,
        redis.Redis.from_url(limits.url) as limits_client,
        redis.Redis.from_url(data.url) as data_client,
    ):
        assert_limits_global(live)
        before = int(limits_client.info("memory")["used_memory"])
        fill_with_uploads(live.base_url)
        pin_over_maxmemory(data)
        assert_storage_full(upload(live.base_url, canary_lines(1, 200, tag="more")))
        assert_limits_global(live)
        assert list(limits_client.scan_iter(BATCH_PREFIX + "*")) == []
        assert list(data_client.scan_iter(BATCH_PREFIX + "f:*"))
        grown = int(limits_client.info("memory")["used_memory"]) - before
        assert grown < 256 * 1024, grown
    assert_no_canary(logs)


@needs_redis
def test_a_paused_redis_answers_503_within_the_store_timeout(logs: Logs) -> None:
    """Redis frozen (SIGSTOP): ``GET /v1/batches``, ``GET /v1/files`` and an upload answer 503
    ``storage_unavailable`` with ``Retry-After`` within ``batches.store_timeout_s`` (1 s here;
    it was a plain-text 500 after redis-py's default 5 s); the runner logs the failure once
    and its recovery once; after SIGCONT the API answers 200 again."""
    with (
        running_redis() as server,
        gateway(distributed_body(server.url, "  store_timeout_s: 1.0\n"), logs) as live,
    ):
        assert http_call(live.base_url, "GET", "/v1/batches", key=KEY_A).status == 200
        before = len(logs.lines)  # what a stack torn down by an earlier test may still log
        server.pause()
        try:
            took: list[float] = []
            for method, path in (("GET", "/v1/batches"), ("GET", "/v1/files")):
                started = time.monotonic()
                reply = http_call(live.base_url, method, path, key=KEY_A)
                took.append(time.monotonic() - started)
                assert reply.status == 503, reply
                assert openai_error(reply)["code"] == "storage_unavailable"
                assert_retry_headers(reply)
            started = time.monotonic()
            reply = upload(live.base_url, canary_lines(1, 100, tag="paused"))
            took.append(time.monotonic() - started)
            assert reply.status == 503, reply
            assert max(took) < 1.8, took
            assert wait_until(lambda: bool(logs.matching("batch storage unavailable")), 5.0)
            time.sleep(1.0)  # a few more failing ticks
        finally:
            server.resume()
        assert wait_until(lambda: bool(logs.matching("batch storage recovered")), 10.0)
        assert http_call(live.base_url, "GET", "/v1/batches", key=KEY_A).status == 200
    since = logs.lines[before:]
    assert sum("batch storage unavailable" in line for line in since) == 1, logs.text()
    assert sum("batch storage recovered" in line for line in since) == 1, logs.text()
    assert not logs.matching("Traceback"), logs.text()
    assert_no_canary(logs)


@needs_redis
def test_a_gateway_stopped_while_its_batch_redis_is_down_shuts_down(logs: Logs) -> None:
    """Lines in flight, redis-server killed, then the gateway stopped: the runner's last
    record (the lines it hands back) fails; that is one warning naming them, not a
    traceback, and the shutdown goes on to its end (uvicorn reports no failed shutdown)."""
    with (
        running_redis() as server,
        gateway(distributed_body(server.url, "  max_inflight: 2\n"), logs) as live,
    ):
        lines = [chat_line(f"long{i}", max_tokens=2000) for i in range(4)]
        file_id = upload(live.base_url, jsonl(lines)).json()["id"]
        create = {"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"}
        reply = http_call(live.base_url, "POST", "/v1/batches", json=create, key=KEY_A)
        assert reply.status == 200, reply

        def running() -> float:
            found = metric(live.base_url, "sluicegate_batch_lines", model=MODEL, state="running")
            return found or 0.0

        assert wait_until(lambda: running() >= 2, 10.0), logs.text()
        server.kill()
    warned = logs.matching("at shutdown")
    assert len(warned) == 1, logs.text()
    assert "2 lines handed back" in warned[0], warned
    assert not logs.matching("Application shutdown failed"), logs.text()
    assert not logs.matching("Traceback"), logs.text()


@contextlib.contextmanager
def small_disk(path: Path, size: str = "3m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (root only; skips the test otherwise)."""
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill_disk(path: Path) -> Path:
    """Write a file under ``path`` until the disk is full; the file."""
    filler = path / "filler"
    block = b"\0" * 65_536
    with filler.open("wb", buffering=0) as out:
        for size in (65_536, 4096, 512):
            with contextlib.suppress(OSError):
                while True:
                    out.write(block[:size])
    return filler


def batch_state(live: Stack, batch_id: str) -> dict[str, object]:
    reply = http_call(live.base_url, "GET", f"/v1/batches/{batch_id}", key=KEY_A)
    assert reply.status == 200, reply
    data: dict[str, object] = reply.json()
    return data


def test_a_full_disk_refuses_uploads_and_batches_resume_by_themselves(
    tmp_path: Path, logs: Logs
) -> None:
    """The SQLite database on a 16 MiB tmpfs, a batch running: the disk fills (another file
    takes the rest). An upload answers 507 ``storage_full`` in OpenAI's shape with
    ``Retry-After``; the runner logs ``batch storage full`` once (no traceback, however many
    ticks fail); once the file is deleted it logs its recovery once and the batch completes
    by itself, one output line per input line."""
    # Room for SQLite's log between checkpoints (1,000 pages, 4 MiB): on a smaller disk the
    # log alone fills it again after the file is deleted, and the batch stalls (seen on 3 MiB).
    with small_disk(tmp_path / "disk", size="16m") as disk:
        body = (
            TENANTS + f"batches:\n  path: {disk / 'batches.db'}\n  poll_interval_s: 0.1\n"
            "  max_inflight: 2\n"
        )
        with gateway(body, logs) as live:
            lines = [
                chat_line(f"line-{i}", text=f"{CANARY} " + "y" * 2000, max_tokens=40)
                for i in range(60)
            ]
            first = upload(live.base_url, jsonl(lines))
            assert first.status == 200, first
            create = {
                "input_file_id": first.json()["id"],
                "endpoint": CHAT,
                "completion_window": "24h",
            }
            created = http_call(live.base_url, "POST", "/v1/batches", json=create, key=KEY_A)
            assert created.status == 200, created
            batch_id = created.json()["id"]

            def running() -> bool:
                counts = batch_state(live, batch_id)["request_counts"]
                assert isinstance(counts, dict)
                return int(counts["completed"]) >= 2

            assert wait_until(running, 30.0, every_s=0.05)
            filler = fill_disk(disk)
            assert_storage_full(upload(live.base_url, canary_lines(50, 1000, tag="full")))
            assert wait_until(lambda: bool(logs.matching("batch storage full")), 20.0), logs.text()
            time.sleep(1.5)  # 15 more ticks, all failing
            assert batch_state(live, batch_id)["status"] == "in_progress"
            assert admin_state(live.base_url)["batches"]["storage"] == "full"
            filler.unlink()
            assert wait_until(lambda: bool(logs.matching("batch storage recovered")), 10.0)

            def ended() -> bool:
                return batch_state(live, batch_id)["status"] == "completed"

            assert wait_until(ended, 60.0, every_s=0.1), batch_state(live, batch_id)
            output = batch_state(live, batch_id)["output_file_id"]
            content = http_call(live.base_url, "GET", f"/v1/files/{output}/content", key=KEY_A)
            ids = sorted(orjson.loads(line)["custom_id"] for line in content.body.splitlines())
            assert ids == sorted(f"line-{i}" for i in range(60))
            assert admin_state(live.base_url)["batches"]["storage"] == "ok"
    assert len(logs.matching("batch storage full")) == 1, logs.text()
    assert len(logs.matching("batch storage recovered")) == 1, logs.text()
    assert not logs.matching("Traceback"), logs.text()
    assert not logs.matching("tick failed"), logs.text()
    assert_no_canary(logs)


CONFIG = """models:
  - name: m
    backends: [{name: e, url: 'http://127.0.0.1:9', engine: emulator}]
"""


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        (
            "store: memory\nbatches: {path: /tmp/b.db, store: 'redis://127.0.0.1:7/0'}\n",
            "distributed",
        ),
        ("store: redis://127.0.0.1:7/0\nbatches: {store: 'http://u:hunter2@h/0'}\n", "redis://"),
        ("store: redis://127.0.0.1:7/0\nbatches: {store: 'redis://u:hunter2@h/x'}\n", "database"),
        ("store: redis://127.0.0.1:7/0\nbatches: {store_timeout_s: 0}\n", "store_timeout_s"),
    ],
)
def test_batches_store_is_checked(section: str, problem: str) -> None:
    """``batches.store`` is a Redis URL (a password in it is never echoed) and needs
    distributed mode; ``batches.store_timeout_s`` is positive."""
    with pytest.raises(ConfigError) as caught:
        parse_config(CONFIG + section)
    assert problem in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_batches_store_defaults_to_the_shared_store() -> None:
    """Unset, batch data lives in the shared store (as before); set, in its own Redis."""
    shared = "store: redis://127.0.0.1:7/0\n"
    default = parse_config(CONFIG + shared + "batches: {}\n")
    own = parse_config(CONFIG + shared + "batches: {store: 'redis://127.0.0.1:8/1'}\n")
    assert isinstance(open_backend(default), RedisBatches)
    assert open_backend(default).url == "redis://127.0.0.1:7/0"  # type: ignore[attr-defined]
    assert open_backend(own).url == "redis://127.0.0.1:8/1"  # type: ignore[attr-defined]
