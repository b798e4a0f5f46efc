"""The Files and Batches APIs end to end through the official ``openai`` SDK.

A real gateway with ``batches:`` runs in front of an emulated engine on loopback;
the SDK uploads, creates, polls, lists, cancels and downloads exactly as it would
against OpenAI, and every answer is checked to the value: the output and error
files hold one line per ``custom_id``, the counts and usage add up, the lines ran
as their tenant in their lane.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import openai
import pytest

from sluicegate.emulator.embeddings import vector
from tests.batches.batch_harness import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    KEY_A,
    KEY_B,
    TENANTS,
    batch_stack,
    by_custom_id,
    chat_line,
    client,
    completion_line,
    embedding_line,
    file_lines,
    refusal,
    start_batch,
    upload,
    wait_batch,
)
from tests.gateway.gateway_harness import (
    MODEL,
    admin_state,
    engine_stats,
    metric,
    unused_port,
    wait_until,
)

LINE_MAKERS = {CHAT: chat_line, COMPLETIONS: completion_line, EMBEDDINGS: embedding_line}
ANSWER_OBJECT = {CHAT: "chat.completion", COMPLETIONS: "text_completion", EMBEDDINGS: "list"}


def _tenant_usage(base_url: str, tenant: str) -> dict[str, int] | None:
    model = next(m for m in admin_state(base_url)["models"] if m["name"] == MODEL)
    return next((t for t in model["tenants"] if t["tenant"] == tenant), None)


def _check_round_trip(sdk: openai.OpenAI, endpoint: str) -> None:
    make = LINE_MAKERS[endpoint]
    lines = [make(f"line-{i}", f"question number {i}") for i in range(12)]
    created = start_batch(sdk, lines, endpoint, metadata={"run": "round-trip"})
    assert created.status == "validating"
    assert created.endpoint == endpoint
    assert created.metadata == {"run": "round-trip"}
    batch = wait_batch(sdk, created.id)
    assert batch.status == "completed", batch
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed) == (12, 12)
    assert batch.request_counts.failed == 0
    assert batch.error_file_id is None
    assert batch.created_at <= batch.in_progress_at <= batch.finalizing_at  # type: ignore[operator]
    assert batch.finalizing_at <= batch.completed_at  # type: ignore[operator]
    assert batch.failed_at is batch.expired_at is batch.cancelled_at is None
    output = by_custom_id(file_lines(sdk, batch.output_file_id))
    assert set(output) == {f"line-{i}" for i in range(12)}
    prompt = completion = 0
    for i in range(12):
        line = output[f"line-{i}"]
        assert line["error"] is None
        assert line["id"].startswith("batch_req_")
        response = line["response"]
        assert response["status_code"] == 200
        body = response["body"]
        assert body["object"] == ANSWER_OBJECT[endpoint]
        usage = body["usage"]
        if endpoint == EMBEDDINGS:
            text = f"question number {i}"
            assert body["data"] == [
                {"object": "embedding", "index": 0, "embedding": vector(text.encode(), 16)}
            ]
            assert usage["prompt_tokens"] == math.ceil(len(text) / 4)
        else:
            assert body["model"] == MODEL
            assert len(body["choices"]) == 1
            choice = body["choices"][0]
            text = choice["message"]["content"] if endpoint == CHAT else choice["text"]
            assert isinstance(text, str)
            assert text
            assert usage["completion_tokens"] == 6
            assert usage["prompt_tokens"] > 0
        prompt += usage["prompt_tokens"]
        completion += usage.get("completion_tokens", 0)
    assert batch.usage is not None
    assert (batch.usage.input_tokens, batch.usage.output_tokens) == (prompt, completion)
    assert batch.usage.total_tokens == prompt + completion
    output_file = sdk.files.retrieve(batch.output_file_id)  # type: ignore[arg-type]
    assert output_file.purpose == "batch_output"
    assert output_file.bytes == len(sdk.files.content(output_file.id).content)


@pytest.mark.parametrize("endpoint", [CHAT, COMPLETIONS])
def test_round_trip_through_the_sdk(tmp_path: Path, endpoint: str) -> None:
    """Upload, create, poll until completed, download: one output line per custom_id with the
    engine's answer and status 200, exact counts, usage the sum of the lines', status times
    in order, and the lines' tokens counted for their tenant."""
    with batch_stack(tmp_path) as live:
        _check_round_trip(client(live), endpoint)
        in_lane = metric(
            live.base_url, "sluicegate_requests_total", model=MODEL, lane="best_effort",
            outcome="completed",
        )  # fmt: skip
        assert in_lane == 12
        usage_a = _tenant_usage(live.base_url, "a")
        assert usage_a is not None
        batch = client(live).batches.list().data[0]
        assert batch.usage is not None
        assert usage_a["requests"] == 12
        assert usage_a["prompt_tokens"] == batch.usage.input_tokens
        assert usage_a["completion_tokens"] == batch.usage.output_tokens
        assert _tenant_usage(live.base_url, "b") in (
            None,
            {"tenant": "b", "requests": 0, "prompt_tokens": 0, "completion_tokens": 0},
        )
        assert metric(live.base_url, "sluicegate_tokens_total", tenant="a", kind="completion") == (
            batch.usage.output_tokens
        )


def test_round_trip_of_embeddings(tmp_path: Path) -> None:
    """An embeddings batch in front of the emulator: every line answered with the engine's
    vectors and usage."""
    with batch_stack(tmp_path) as live:
        _check_round_trip(client(live), EMBEDDINGS)


def test_malformed_lines_become_error_lines_and_the_rest_run(tmp_path: Path) -> None:
    """Each malformed line is one error line with its documented code (and its custom_id when
    it had one); the good lines run; the counts say so."""
    model = f"""  - name: nolane
    backends:
      - {{name: n0, url: 'http://127.0.0.1:{unused_port()}', engine: emulator}}
    lanes:
      - {{name: interactive}}
"""
    bad: dict[str, Any] = {
        "url": {**chat_line("bad-url"), "url": COMPLETIONS},
        "get": {**chat_line("bad-get"), "method": "GET"},
        "stream": chat_line("bad-stream", stream=True),
        "model": {**chat_line("bad-model"), "body": {**chat_line("x")["body"], "model": "nope"}},
        "lane": {**chat_line("bad-lane"), "body": {**chat_line("x")["body"], "model": "nolane"}},
        "no-body": {k: v for k, v in chat_line("bad-body").items() if k != "body"},
    }
    no_id = {k: v for k, v in chat_line("ignored").items() if k != "custom_id"}
    bad_ids = [{**chat_line("x"), "custom_id": value} for value in ("", "i" * 513, 7, None)]
    # (a line over max_line_bytes refuses the upload: test_batch_hostile_tenant.py)
    lines = [
        chat_line("good-0"), "not json {", *bad.values(), no_id, "[1, 2]", *bad_ids,
        chat_line("good-1"),
    ]  # fmt: skip
    with batch_stack(tmp_path, model=model) as live:
        sdk = client(live)
        batch = wait_batch(sdk, start_batch(sdk, lines).id)
        assert batch.status == "completed", batch
        assert batch.request_counts is not None
        assert batch.request_counts.total == len(lines)
        assert (batch.request_counts.completed, batch.request_counts.failed) == (2, len(lines) - 2)
        output = by_custom_id(file_lines(sdk, batch.output_file_id))
        assert set(output) == {"good-0", "good-1"}
        errors = file_lines(sdk, batch.error_file_id)
        assert len(errors) == len(lines) - 2
        assert all(line["response"] is None for line in errors)
        codes = {line["custom_id"]: line["error"]["code"] for line in errors if line["custom_id"]}
        assert codes == {
            "bad-url": "invalid_url",
            "bad-get": "invalid_method",
            "bad-stream": "invalid_body",
            "bad-model": "model_not_found",
            "bad-lane": "model_not_found",
            "bad-body": "invalid_body",
        }
        anonymous = sorted(line["error"]["code"] for line in errors if line["custom_id"] is None)
        assert anonymous == [
            *["invalid_custom_id"] * 5,
            "invalid_json_line",
            "invalid_json_line",
        ]


def test_a_repeated_custom_id_fails_the_batch(tmp_path: Path) -> None:
    """Two lines with one custom_id: the batch fails with a ``duplicate_custom_id`` error
    naming the second line, and nothing runs."""
    lines = [chat_line("same"), chat_line("other"), chat_line("same")]
    with batch_stack(tmp_path) as live:
        sdk = client(live)
        batch = wait_batch(sdk, start_batch(sdk, lines).id)
        assert batch.status == "failed"
        assert batch.failed_at is not None
        assert batch.in_progress_at is None
        assert batch.errors is not None
        assert batch.errors.data is not None
        assert [(e.code, e.line) for e in batch.errors.data] == [("duplicate_custom_id", 3)]
        assert batch.output_file_id is None
        assert batch.error_file_id is None
        assert admin_state(live.base_url)["models"][0]["tenants"] in (
            [],
            [{"tenant": "a", "requests": 0, "prompt_tokens": 0, "completion_tokens": 0}],
        )


def test_a_custom_id_shared_with_a_malformed_line_fails_the_batch(tmp_path: Path) -> None:
    """A malformed line (method GET) and a good line with one custom_id: the batch fails with
    ``duplicate_custom_id`` (else that custom_id would appear in both files)."""
    lines = [{**chat_line("same"), "method": "GET"}, chat_line("same"), chat_line("other")]
    with batch_stack(tmp_path) as live:
        sdk = client(live)
        batch = wait_batch(sdk, start_batch(sdk, lines).id)
        assert batch.errors is not None
        assert batch.errors.data is not None
        assert [(e.code, e.line) for e in batch.errors.data] == [("duplicate_custom_id", 2)]
        assert batch.status == "failed"


def _slow_and_quick(quick: int, slow: int) -> list[dict[str, Any]]:
    return [chat_line(f"quick-{i}", max_tokens=3) for i in range(quick)] + [
        chat_line(f"slow-{i}", max_tokens=6000) for i in range(slow)
    ]


def test_cancel_mid_way(tmp_path: Path) -> None:
    """Cancelling a batch whose slow lines run: ``cancelling`` at once, then ``cancelled``;
    the finished lines are in the output file, the rest ``batch_cancelled`` in the error file,
    each custom_id exactly once across both; the engine stops generating for it."""
    with batch_stack(tmp_path) as live:
        sdk = client(live)
        batch = start_batch(sdk, _slow_and_quick(4, 4))
        wait_batch(
            sdk,
            batch.id,
            lambda b: b.request_counts is not None and b.request_counts.completed == 4,
            within_s=60,
        )
        assert wait_until(
            lambda: (
                metric(live.base_url, "sluicegate_batch_lines", model=MODEL, state="running") == 4
            ),
            30,
        )
        cancelling = sdk.batches.cancel(batch.id)
        assert cancelling.status == "cancelling"
        assert cancelling.cancelling_at is not None
        batch = wait_batch(sdk, batch.id, within_s=60)
        assert batch.status == "cancelled"
        assert batch.cancelled_at is not None
        assert batch.completed_at is None
        assert batch.request_counts is not None
        assert (batch.request_counts.completed, batch.request_counts.failed) == (4, 4)
        output = by_custom_id(file_lines(sdk, batch.output_file_id))
        errors = by_custom_id(file_lines(sdk, batch.error_file_id))
        assert set(output) == {f"quick-{i}" for i in range(4)}
        assert {k: v["error"]["code"] for k, v in errors.items()} == {
            f"slow-{i}": "batch_cancelled" for i in range(4)
        }
        assert wait_until(lambda: engine_stats(live.engine_url())["running"] == 0, 30)
        assert engine_stats(live.engine_url())["aborted_total"] == 4
        assert sdk.batches.cancel(batch.id).status == "cancelled"


def test_expiry_ends_unfinished_lines(tmp_path: Path) -> None:
    """A batch created with a 3 s window on slow lines expires: its quick lines are answered,
    its slow ones ``batch_expired``, each custom_id exactly once; a window longer than
    ``batches.max_completion_window`` is refused."""
    with batch_stack(tmp_path, settings="  max_completion_window: 1h\n") as live:
        sdk = client(live)
        status, error = refusal(lambda: start_batch(sdk, [chat_line("x")], completion_window="2h"))
        assert (status, error["code"], error["param"]) == (
            400,
            "invalid_completion_window",
            "completion_window",
        )
        batch = start_batch(sdk, _slow_and_quick(3, 3), completion_window="3s")
        assert batch.expires_at is not None
        assert batch.expires_at - batch.created_at == 3
        batch = wait_batch(sdk, batch.id, within_s=60)
        assert batch.status == "expired"
        assert batch.expired_at is not None
        assert batch.expired_at >= batch.expires_at
        output = by_custom_id(file_lines(sdk, batch.output_file_id))
        errors = by_custom_id(file_lines(sdk, batch.error_file_id))
        assert set(output) == {f"quick-{i}" for i in range(3)}
        assert {k: v["error"]["code"] for k, v in errors.items()} == {
            f"slow-{i}": "batch_expired" for i in range(3)
        }
        assert wait_until(lambda: engine_stats(live.engine_url())["running"] == 0, 30)
        assert engine_stats(live.engine_url())["aborted_total"] == 3


def test_list_pagination_as_openai_does(tmp_path: Path) -> None:
    """``limit``/``after`` pages, ``has_more``, ``first_id``/``last_id``; the SDK's
    auto-pagination over 25 batches yields every one once, newest first; files.list shows the
    tenant's files and filters by purpose."""
    with batch_stack(tmp_path, settings="  quota: {max_active_batches: null}\n") as live:
        sdk = client(live)
        file = upload(sdk, [chat_line("only")])
        ids = [
            sdk.batches.create(input_file_id=file.id, endpoint=CHAT, completion_window="24h").id
            for _ in range(25)
        ]
        newest_first = ids[::-1]
        first = sdk.batches.list(limit=10)
        assert [b.id for b in first.data] == newest_first[:10]
        assert (first.has_more, first.first_id, first.last_id) == (
            True,
            newest_first[0],
            newest_first[9],
        )
        second = sdk.batches.list(limit=10, after=first.last_id)  # type: ignore[arg-type]
        assert [b.id for b in second.data] == newest_first[10:20]
        third = sdk.batches.list(limit=10, after=second.last_id)  # type: ignore[arg-type]
        assert [b.id for b in third.data] == newest_first[20:]
        assert third.has_more is False
        assert [b.id for b in sdk.batches.list(limit=7)] == newest_first
        for limit in (1, 4, 24, 25, 26, 100):
            walked: list[str] = []
            after: str | None = None
            pages = 0
            while True:
                kwargs = {} if after is None else {"after": after}
                page = sdk.batches.list(limit=limit, **kwargs)
                walked += [b.id for b in page.data]
                pages += 1
                if not page.has_more:
                    break
                after = page.last_id
            assert walked == newest_first, limit
            assert pages == -(-25 // limit), limit  # no empty last page
        assert [b.id for b in sdk.batches.list()] == newest_first
        for batch_id in ids:
            wait_batch(sdk, batch_id)
        files = list(sdk.files.list())
        outputs = [f for f in files if f.purpose == "batch_output"]
        assert [f.id for f in files if f.purpose == "batch"] == [file.id]
        assert len(outputs) == 25
        assert [f.id for f in sdk.files.list(purpose="batch")] == [file.id]
        assert list(client(live, KEY_B).files.list()) == []


def test_tenants_see_only_their_own(tmp_path: Path) -> None:
    """Tenant B gets 404 for tenant A's file, file content, file deletion, batch and cancel, and
    lists none of them; A's batch is untouched by B's attempts."""
    with batch_stack(tmp_path) as live:
        a, b = client(live, KEY_A), client(live, KEY_B)
        batch = wait_batch(a, start_batch(a, [chat_line("mine")]).id)
        assert batch.status == "completed"
        for call in (
            lambda: b.files.retrieve(batch.input_file_id),
            lambda: b.files.content(batch.input_file_id),
            lambda: b.files.content(batch.output_file_id),  # type: ignore[arg-type]
            lambda: b.files.delete(batch.input_file_id),
            lambda: b.batches.retrieve(batch.id),
            lambda: b.batches.cancel(batch.id),
            lambda: b.batches.create(
                input_file_id=batch.input_file_id, endpoint=CHAT, completion_window="24h"
            ),
        ):
            status, error = refusal(call)
            assert (status, error["code"], error["type"]) == (404, "not_found", "not_found_error")
        assert list(b.batches.list()) == []
        assert list(b.files.list()) == []
        assert a.batches.retrieve(batch.id).status == "completed"
        assert a.files.retrieve(batch.input_file_id).id == batch.input_file_id
        assert len(file_lines(a, batch.output_file_id)) == 1


def test_another_tenants_id_as_a_cursor_is_an_unknown_one(tmp_path: Path) -> None:
    """Tenant B listing ``after`` tenant A's batch or file id gets what an unknown id gets (an
    empty page), so B cannot learn that A's id exists or when it was created."""
    with batch_stack(tmp_path) as live:
        a, b = client(live, KEY_A), client(live, KEY_B)
        start_batch(b, [chat_line("b-old")])
        theirs = start_batch(a, [chat_line("a")])
        start_batch(b, [chat_line("b-new")])
        assert [x.id for x in b.batches.list(after="batch_unknown")] == []
        assert [x.id for x in b.files.list(after="file-unknown")] == []
        assert [x.id for x in b.batches.list(after=theirs.id)] == []
        assert [x.id for x in b.files.list(after=theirs.input_file_id)] == []


def test_a_rate_limited_tenant_defers_lines_but_finishes(tmp_path: Path) -> None:
    """A tenant whose tokens_per_min admits only a few lines at a time: its lines are refused
    (429 inside the gateway) and run again later, not counted as attempts; the batch completes
    with every line exactly once."""
    tenants = (
        TENANTS + "  - {name: slowpoke, api_key_env: KEY_S, tokens_per_min: 1800,"
        " burst_tokens: 40}\n"
    )
    environ = {"KEY_A": KEY_A, "KEY_B": KEY_B, "KEY_S": "sk-slowpoke-canary"}
    with batch_stack(tmp_path, tenants=tenants, environ=environ) as live:
        sdk = client(live, "sk-slowpoke-canary")
        lines = [chat_line(f"r{i}", "hi", max_tokens=4) for i in range(12)]
        batch = wait_batch(sdk, start_batch(sdk, lines).id, within_s=120)
        assert batch.status == "completed", batch
        assert batch.request_counts is not None
        assert (batch.request_counts.completed, batch.request_counts.failed) == (12, 0)
        assert set(by_custom_id(file_lines(sdk, batch.output_file_id))) == {
            f"r{i}" for i in range(12)
        }
        deferred = metric(
            live.base_url, "sluicegate_batch_line_runs_total", model=MODEL, outcome="deferred"
        )
        assert deferred is not None
        assert deferred > 0
        usage = _tenant_usage(live.base_url, "slowpoke")
        assert usage is not None
        assert usage["requests"] == 12


def test_the_lane_header_picks_the_lane(tmp_path: Path) -> None:
    """``X-Sluicegate-Lane: batch`` on create runs every line in the ``batch`` lane (none in
    the default ``best_effort``); a lane the tenant may not use is 403 ``lane_not_allowed``;
    a lane no model has is 400 ``invalid_lane``."""
    tenants = TENANTS + "  - {name: c, api_key_env: KEY_C, allowed_lanes: [interactive]}\n"
    environ = {"KEY_A": KEY_A, "KEY_B": KEY_B, "KEY_C": "sk-lane-c-canary"}
    with batch_stack(tmp_path, tenants=tenants, environ=environ) as live:
        sdk = client(live)
        lines = [chat_line(f"l{i}") for i in range(5)]
        batch = start_batch(sdk, lines, extra_headers={"X-Sluicegate-Lane": "batch"})
        assert wait_batch(sdk, batch.id).status == "completed"
        served = metric(
            live.base_url,
            "sluicegate_requests_total",
            model=MODEL,
            lane="batch",
            outcome="completed",
        )
        assert served == 5
        assert (
            metric(
                live.base_url,
                "sluicegate_requests_total",
                model=MODEL,
                lane="best_effort",
                outcome="completed",
            )
            is None
        )
        status, error = refusal(
            lambda: start_batch(sdk, lines, extra_headers={"X-Sluicegate-Lane": "nowhere"})
        )
        assert (status, error["code"]) == (400, "invalid_lane")
        restricted = client(live, "sk-lane-c-canary")
        status, error = refusal(lambda: start_batch(restricted, lines))
        assert (status, error["code"], error["type"]) == (
            403,
            "lane_not_allowed",
            "permission_error",
        )
        allowed = start_batch(restricted, lines, extra_headers={"X-Sluicegate-Lane": "interactive"})
        assert wait_batch(restricted, allowed.id).status == "completed"
