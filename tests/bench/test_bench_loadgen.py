"""Tests for the open-loop load generator against a loopback stub server."""

from __future__ import annotations

import asyncio
import math
import socket

import numpy as np
import pytest

from sluicegate.bench import (
    LoadResult,
    RequestRecord,
    build_body,
    build_headers,
    endpoint_url,
    run_load,
    synthetic_prompt,
)
from sluicegate.bench.response_parsing import StreamStats, error_code
from sluicegate.outcomes import WorkloadRequest
from tests.bench.stub_server import LIMITED_KEY, Stub

KEYS = {"a": "key-a", "limited": LIMITED_KEY}


def _req(arrival_s: float = 0.0, **kwargs: object) -> WorkloadRequest:
    fields: dict[str, object] = {"prompt_tokens": 10, "output_tokens": 5, "max_tokens": 5}
    fields.update(kwargs)
    return WorkloadRequest(arrival_s, **fields)  # type: ignore[arg-type]


async def _run(stub: Stub, schedule: list[WorkloadRequest], **kwargs: object) -> LoadResult:
    return await run_load(schedule, base_url=stub.url, model="m", api_keys=KEYS, **kwargs)  # type: ignore[arg-type]


async def test_streamed_record_has_status_queue_wait_tokens_and_ordered_times(stub: Stub) -> None:
    """A streamed 200 records its status, queue header, usage tokens, and 0 < TTFT < e2e."""
    result = await _run(stub, [_req(0.0, tenant="a"), _req(0.01, tenant="a")])
    for record in result.records:
        assert (record.status, record.error, record.queue_ms) == (200, "", 12.5)
        assert record.output_tokens == 5
        assert record.finish_reason == "length"
        assert record.ttft_s is not None
        assert 0.0 < record.ttft_s < record.e2e_s
        assert record.itl_mean_s is not None
        assert record.itl_max_s is not None
        assert 0.0 < record.itl_mean_s <= record.itl_max_s


async def test_output_tokens_are_counted_from_chunks_without_usage(stub: Stub) -> None:
    """Without a usage chunk, output tokens are the content chunks counted."""
    stub.config.usage = False
    result = await _run(stub, [_req(max_tokens=7, output_tokens=7, tenant="a")])
    assert result.records[0].output_tokens == 7


async def test_rate_limited_tenant_records_429_code_and_retry_after(stub: Stub) -> None:
    """A 429 records its status, the OpenAI error code and Retry-After in seconds."""
    result = await _run(stub, [_req(tenant="limited"), _req(0.001, tenant="a")])
    limited, fine = result.records
    assert (limited.status, limited.error, limited.retry_after_s) == (
        429,
        "rate_limit_exceeded",
        2.0,
    )
    assert limited.ttft_s is None
    assert not limited.ok
    assert fine.ok


async def test_sse_events_split_across_reads_are_parsed(stub: Stub) -> None:
    """Events written in pieces (inside the prefix, the JSON and the blank line) still parse."""
    stub.config.split_events = True
    stub.config.usage = False
    result = await _run(stub, [_req(max_tokens=4, output_tokens=4, tenant="a")])
    record = result.records[0]
    assert (record.status, record.error, record.output_tokens) == (200, "", 4)
    assert record.finish_reason == "length"


async def test_slow_responses_do_not_delay_later_launches(stub: Stub) -> None:
    """Open loop: with 1 s responses, every launch still happens on schedule."""
    stub.config.delay_before_s = 1.0
    schedule = [_req(i * 0.02, tenant="a") for i in range(20)]
    result = await _run(stub, schedule)
    assert all(r.ok for r in result.records)
    assert result.launch_lag_max_s < 0.1
    last_launch = max(r.launched_s for r in result.records)
    first_end = min(r.finished_s for r in result.records)
    assert last_launch < first_end


async def test_headers_carry_the_tenant_key_and_lane_fields(stub: Stub) -> None:
    """Authorization carries the tenant's key; lane, priority and deadline headers are sent."""
    await _run(stub, [_req(tenant="a", lane="batch", priority=4, deadline_ms=1500.4)])
    headers, _ = stub.received[0]
    assert headers["Authorization"] == "Bearer key-a"
    assert headers["X-Sluicegate-Lane"] == "batch"
    assert headers["X-Sluicegate-Priority"] == "4"
    assert headers["X-Sluicegate-Deadline-Ms"] == "1500"


def test_headers_omit_key_for_unknown_tenant_and_lane_fields_when_disabled() -> None:
    """A tenant without a key gets no Authorization; lane headers can be turned off."""
    headers = build_headers(_req(tenant="nobody"), api_keys=KEYS, send_lane_headers=False)
    assert "Authorization" not in headers
    assert not any(name.startswith("X-Sluicegate") for name in headers)


def test_chat_body_has_prompt_of_four_chars_per_token_and_vllm_fields() -> None:
    """The chat body carries a ~4 chars/token prompt, max_tokens, ignore_eos and usage option."""
    body = build_body(
        _req(prompt_tokens=50, max_tokens=9),
        3,
        model="m",
        endpoint="chat",
        stream=True,
        ignore_eos=True,
    )
    messages = body["messages"]
    assert isinstance(messages, list)
    assert len(messages[0]["content"]) == 200
    assert (body["max_tokens"], body["ignore_eos"], body["stream"]) == (9, True, True)
    assert body["stream_options"] == {"include_usage": True}


def test_completions_body_uses_prompt_and_omits_stream_options_when_not_streaming() -> None:
    """The completions body sends ``prompt``; non-streamed bodies have no stream_options."""
    body = build_body(_req(), 0, model="m", endpoint="completions", stream=False, ignore_eos=False)
    assert "prompt" in body
    assert "messages" not in body
    assert "stream_options" not in body
    assert "ignore_eos" not in body


def test_synthetic_prompts_are_deterministic_and_differ_by_request() -> None:
    """Same index gives the same prompt; different requests differ from the start."""
    assert synthetic_prompt(1, 30) == synthetic_prompt(1, 30)
    assert synthetic_prompt(1, 30)[:12] != synthetic_prompt(2, 30)[:12]


@pytest.mark.parametrize("base", ["http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/"])
def test_endpoint_url_accepts_base_with_or_without_v1(base: str) -> None:
    """``/v1`` is appended unless the base already ends with it."""
    assert endpoint_url(base, "chat") == "http://h:1/v1/chat/completions"


async def test_non_streamed_ttft_equals_e2e(stub: Stub) -> None:
    """Without streaming, TTFT is the end-to-end time and tokens come from usage."""
    result = await _run(stub, [_req(tenant="a")], stream=False, endpoint="completions")
    record = result.records[0]
    assert record.ttft_s == record.e2e_s
    assert (record.status, record.output_tokens, record.finish_reason) == (200, 5, "length")


async def test_completions_stream_counts_text_chunks(stub: Stub) -> None:
    """A completions stream's ``text`` chunks count as content."""
    stub.config.usage = False
    result = await _run(stub, [_req(tenant="a")], endpoint="completions")
    assert result.records[0].output_tokens == 5


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_connection_refused_records_status_zero() -> None:
    """A request that never gets a response has status 0 and error connection_error."""
    result = await run_load(
        [_req()], base_url=f"http://127.0.0.1:{_closed_port()}", model="m", api_keys={}
    )
    assert (result.records[0].status, result.records[0].error) == (0, "connection_error")


async def test_request_past_timeout_records_timeout(stub: Stub) -> None:
    """A request past ``timeout_s`` is recorded with error ``timeout``."""
    stub.config.delay_before_s = 1.0
    result = await _run(stub, [_req(tenant="a")], timeout_s=0.1)
    assert (result.records[0].status, result.records[0].error) == (0, "timeout")


async def test_on_record_sees_each_request_and_records_keep_schedule_order(stub: Stub) -> None:
    """``on_record`` is called once per request; records follow the schedule as given."""
    seen: list[RequestRecord] = []
    schedule = [_req(0.02, tenant="a"), _req(0.0, tenant="a"), _req(0.01, tenant="a")]
    result = await _run(stub, schedule, on_record=seen.append)
    assert sorted(r.index for r in seen) == [0, 1, 2]
    assert [r.scheduled_s for r in result.records] == [0.02, 0.0, 0.01]


async def test_negative_arrival_is_rejected() -> None:
    """A schedule with a negative arrival is refused."""
    with pytest.raises(ValueError, match="arrival_s"):
        await run_load([_req(-1.0)], base_url="http://127.0.0.1:1", model="m", api_keys={})


def _record(index: int, scheduled_s: float, lag_s: float) -> RequestRecord:
    return RequestRecord(
        index,
        "t",
        "l",
        2,
        1,
        1,
        None,
        scheduled_s,
        lag_s,
        200,
        "",
        None,
        None,
        0.1,
        0.1,
        1,
        None,
        None,
        "",
    )


def test_load_result_rates_and_lag_percentiles() -> None:
    """Offered and launch rates are (n − 1) / span; lag percentiles are numpy's."""
    lags = [0.001, 0.0, 0.002, 0.0, 0.1]
    records = [_record(i, i * 0.5, lag) for i, lag in enumerate(lags)]
    result = LoadResult.of(records, duration_s=3.0)
    assert result.offered_rps == pytest.approx(4 / 2.0)
    assert result.launch_rps == pytest.approx(4 / (2.0 + 0.1 - 0.001))
    assert result.launch_lag_p99_s == pytest.approx(float(np.percentile(lags, 99)))
    assert result.launch_lag_max_s == 0.1
    assert not result.keeping_up()


def test_sse_parser_joins_multiline_data_and_ignores_comments() -> None:
    """An event's data lines join with newlines; comments and [DONE] are handled."""
    stats = StreamStats()
    lines = [b": keep-alive\n", b'data: {"choices": [{"delta":\n', b'data: {"content": "a"}}]}\n']
    lines += [b"\n", b"data: [DONE]\n", b"\n"]
    for now, line in enumerate(lines):
        stats.feed_line(line, float(now))
    assert (stats.chunks, stats.first_s, stats.done_s) == (1, 3.0, 5.0)


def test_sse_error_event_sets_the_error_code() -> None:
    """An error event mid-stream records its code."""
    stats = StreamStats()
    stats.feed_line(b'data: {"error": {"code": "overloaded"}}\n', 0.0)
    stats.feed_line(b"\n", 0.0)
    assert stats.error == "overloaded"


def test_error_code_reads_openai_and_bare_shapes() -> None:
    """``error.code`` is read, falling back to ``type``; non-JSON gives ""."""
    assert error_code(b'{"error": {"code": "queue_full", "type": "x"}}') == "queue_full"
    assert (
        error_code(b'{"object": "error", "type": "BadRequestError", "code": null}')
        == "BadRequestError"
    )
    assert error_code(b"<html>") == ""


async def test_cancelling_the_run_cancels_requests_in_flight(stub: Stub) -> None:
    """Cancelling ``run_load`` ends it promptly, with its requests cancelled and session closed."""
    stub.config.delay_before_s = 5.0
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(_run(stub, [_req(tenant="a"), _req(0.01, tenant="a")]))
    await asyncio.sleep(0.1)
    started = loop.time()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert loop.time() - started < 1.0


async def test_empty_schedule_gives_an_empty_result(stub: Stub) -> None:
    """An empty schedule sends nothing and reports no rates."""
    result = await _run(stub, [])
    assert result.records == ()
    assert math.isnan(result.offered_rps)
    assert stub.received == []
