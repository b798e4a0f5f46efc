"""Secrets canary: a tenant key and the admin key, used across many requests that succeed and
fail, never show up in a log record, on stdout/stderr, in an answer or in ``/metrics``.

The servers run in this process (uvicorn in threads), so every record of the root,
uvicorn, sluicegate and aiohttp loggers is captured at DEBUG level, tracebacks
included, and file descriptors 1 and 2 through ``capfd``. Attaching a handler to
``uvicorn.access`` switches uvicorn's access log on, so request lines are checked
too. (A key a client puts in the URL's query would be in any access log, here or
in a proxy; the gateway never reads keys from there, so that case is not tested.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gateway.gateway_harness import ADMIN_KEY, MODEL, Reply, http_call, stack
from tests.hardening.hardening_harness import capture_server_logs, raw_exchange, request_bytes

CANARY = "sk-canary-5d41402abc4b2a76b9719d911017c592"
BODY = """    lanes:
      - {name: interactive}
      - {name: batch}
tenants:
  - {name: a, api_key_env: KEY_A, allowed_lanes: [interactive]}
server: {max_body_bytes: 4096}
batches: {path: %s, lane: interactive, poll_interval_s: 0.1}
"""
BOUNDARY = "canaryboundary"
CHAT = "/v1/chat/completions"
GOOD = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
SECRETS = (CANARY, ADMIN_KEY)


def _calls(base_url: str, port: int) -> list[tuple[str, int, bytes, dict[str, str]]]:
    """Every kind of request the canary rides on: (label, status, body, headers)."""
    out: list[tuple[str, int, bytes, dict[str, str]]] = []

    def call(label: str, method: str, path: str, **kwargs: object) -> None:
        reply: Reply = http_call(base_url, method, path, **kwargs)  # type: ignore[arg-type]
        out.append((label, reply.status, reply.body, reply.headers))

    json_type = {"Content-Type": "application/json"}
    call("ok", "POST", CHAT, json=GOOD, key=CANARY)
    call("ok-stream", "POST", CHAT, json={**GOOD, "stream": True}, key=CANARY)
    call("ok-key-in-body", "POST", CHAT, json={**GOOD, "user": CANARY}, key=CANARY)
    call("bad-json", "POST", CHAT, body=b'{"model": "tiny", "x": "' + CANARY.encode(),
         key=CANARY, headers=json_type)  # fmt: skip
    call("bad-max-tokens", "POST", CHAT, json={**GOOD, "max_tokens": "10"}, key=CANARY)
    call("unknown-model", "POST", CHAT, json={**GOOD, "model": "gpt-none"}, key=CANARY)
    call("lane-403", "POST", CHAT, json=GOOD, key=CANARY, headers={"X-Sluicegate-Lane": "batch"})
    call("bad-priority", "POST", CHAT, json=GOOD, key=CANARY,
         headers={"X-Sluicegate-Priority": "\xb2"})  # fmt: skip
    call("too-large", "POST", CHAT, json={**GOOD, "pad": "x" * 8000}, key=CANARY)
    call(
        "not-json-type", "POST", CHAT, body=b"x", key=CANARY, headers={"Content-Type": "text/plain"}
    )
    long_prompt = {"model": MODEL, "prompt": "x" * 3000, "max_tokens": 100_000_000}
    call("engine-400", "POST", "/v1/completions", json=long_prompt, key=CANARY)
    bad_embedding = {"model": MODEL, "input": "x", "dimensions": 0}
    call("engine-400-embeddings", "POST", "/v1/embeddings", json=bad_embedding, key=CANARY)
    line = b'{"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": {}}'
    upload = (
        (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
            "Content-Type: application/jsonl\r\n\r\n"
        ).encode()
        + line
        + f"\r\n--{BOUNDARY}--\r\n".encode()
    )
    multipart = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    call("batch-upload", "POST", "/v1/files", body=upload, key=CANARY, headers=multipart)
    call("batch-upload-not-multipart", "POST", "/v1/files", body=b"x", key=CANARY)
    call("batch-upload-no-key", "POST", "/v1/files", body=upload, headers=multipart)
    create = {"input_file_id": "file-nope", "endpoint": CHAT, "completion_window": "24h"}
    call("batch-create-unknown-file", "POST", "/v1/batches", json=create, key=CANARY)
    call("batch-unknown", "GET", "/v1/batches/batch_nope", key=CANARY)
    call("batch-list", "GET", "/v1/batches", key=CANARY)
    call("batch-list-admin-key", "GET", "/v1/batches", key=ADMIN_KEY)
    call("admin-key-as-tenant", "POST", CHAT, json=GOOD, key=ADMIN_KEY)
    call("canary-plus-suffix", "POST", CHAT, json=GOOD, key=CANARY + "x")
    call(
        "canary-twice",
        "POST",
        CHAT,
        json=GOOD,
        headers={"Authorization": f"Bearer {CANARY} {CANARY}"},
    )
    call("canary-basic", "POST", CHAT, json=GOOD, headers={"Authorization": f"Basic {CANARY}"})
    call("canary-bare", "POST", CHAT, json=GOOD, headers={"Authorization": CANARY})
    call("unknown-path", "GET", "/nowhere", key=CANARY)
    call("wrong-method", "GET", CHAT, key=CANARY)
    call("models", "GET", "/v1/models", key=CANARY)
    call("tenant-on-admin", "GET", "/admin/state", key=CANARY)
    call("admin-state", "GET", "/admin/state", key=ADMIN_KEY)
    call("admin-basic", "GET", "/admin/state", headers={"Authorization": f"Basic {ADMIN_KEY}"})
    call("metrics", "GET", "/metrics")
    for label, extra in (
        ("two-authorizations", [("Authorization", f"Bearer {ADMIN_KEY}")]),
        ("cr-in-header", [("X-Evil", f"a\r{CANARY}")]),
        ("huge-headers", [("X-Big", CANARY * 1000)]),
    ):
        headers = [("Authorization", f"Bearer {CANARY}"), *extra]
        raw = raw_exchange(port, request_bytes("POST", CHAT, headers, b"{}"))
        out.append((label, raw.status, raw.body, raw.headers))
    call("drain", "POST", "/admin/drain", key=ADMIN_KEY)
    call("draining-503", "POST", CHAT, json=GOOD, key=CANARY)
    return out


def test_keys_never_appear_in_logs_answers_or_metrics(
    capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Across ~40 requests (served, refused at every stage, malformed, engine errors, the
    batch API, admin) neither key appears anywhere the gateway writes; the capture itself is
    shown to work."""
    with stack(BODY % (tmp_path / "batches.db"), environ={"KEY_A": CANARY}) as gateway:
        with capture_server_logs() as logs:
            calls = _calls(gateway.base_url, gateway.gateway_port)
            metrics = http_call(gateway.base_url, "GET", "/metrics").body.decode()
        statuses = {label: status for label, status, _, _ in calls}
    out, err = capfd.readouterr()
    written = "\n".join([logs.text(), out, err])

    # The requests did what they were meant to (the canary rode on every path).
    assert statuses["ok"] == statuses["ok-stream"] == statuses["admin-state"] == 200
    assert statuses["bad-json"] == statuses["bad-max-tokens"] == statuses["bad-priority"] == 400
    expected = {
        "unknown-model": 404, "lane-403": 403, "too-large": 413, "not-json-type": 415,
        "engine-400": 400, "engine-400-embeddings": 400, "cr-in-header": 400, "huge-headers": 431,
        "batch-upload": 200, "batch-upload-not-multipart": 415, "batch-upload-no-key": 401,
        "batch-create-unknown-file": 404, "batch-unknown": 404, "batch-list": 200,
        "batch-list-admin-key": 401,
        "draining-503": 503, "unknown-path": 404, "wrong-method": 405,
    }  # fmt: skip
    assert {label: statuses[label] for label in expected} == expected
    for label in ("admin-key-as-tenant", "canary-plus-suffix", "canary-twice", "tenant-on-admin"):
        assert statuses[label] == 401, label
    # The capture is live: uvicorn's warning for the malformed request reached it.
    assert "Invalid HTTP request received." in written
    assert "sluicegate_requests_total" in metrics

    for secret in SECRETS:
        assert secret not in written, "a key was logged or printed"
        assert secret not in metrics
        for label, _, body, headers in calls:
            assert secret.encode() not in body, label
            assert all(secret not in value for value in headers.values()), label
