"""The gateway through the official ``openai`` SDK: bodies, streams, usage and its headers."""

from __future__ import annotations

import math
from collections.abc import Iterator

import openai
import pytest

from tests.gateway.gateway_harness import MODEL, Stack, http_call, openai_error, stack

KEY = "sk-openai-tests-key"
BODY = """    lanes:
      - {name: interactive}
      - {name: batch}
tenants:
  - {name: a, api_key_env: KEY_A}
"""
MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [
    {"role": "user", "content": "Explain admission control for inference, briefly."}
]
EXACT = {"ignore_eos": True}


@pytest.fixture(scope="module")
def gateway() -> Iterator[Stack]:
    """One gateway with a tenant key, in front of one ``tiny`` emulator."""
    with stack(BODY, environ={"KEY_A": KEY}) as live:
        yield live


@pytest.fixture
def client(gateway: Stack) -> Iterator[openai.OpenAI]:
    """An SDK client of the gateway that never retries, closed after the test."""
    with openai.OpenAI(
        base_url=gateway.base_url + "/v1", api_key=KEY, max_retries=0, timeout=10
    ) as sdk:
        yield sdk


def test_chat_reports_the_engines_usage(client: openai.OpenAI) -> None:
    """A non-streamed chat answer carries the engine's usage: prompt = ceil(chars / 4),
    completion = max_tokens under ignore_eos, total = their sum."""
    reply = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=9, extra_body=EXACT
    )
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == math.ceil(len(str(MESSAGES[0]["content"])) / 4)
    assert reply.usage.completion_tokens == 9
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 9


def test_completion_with_ignore_eos_generates_exactly_max_tokens(client: openai.OpenAI) -> None:
    """``ignore_eos`` passes through the gateway untouched: exactly max_tokens, reason length."""
    reply = client.completions.create(
        model=MODEL, prompt="abcd" * 10, max_tokens=13, extra_body=EXACT
    )
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 13
    assert reply.choices[0].finish_reason == "length"
    assert len(reply.choices[0].text.split()) == 13


def test_chat_stream_relays_every_token_then_usage(client: openai.OpenAI) -> None:
    """A chat stream reaches the client whole: one content chunk per token, finish_reason
    ``length`` and, with include_usage, a final usage chunk."""
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=11, stream=True,
        stream_options={"include_usage": True}, extra_body=EXACT,
    )  # fmt: skip
    with stream:
        chunks = list(stream)
    contents = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(contents) == 11
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 11


def test_completion_stream_relays_every_token_then_usage(client: openai.OpenAI) -> None:
    """A completions stream carries one text chunk per token and the usage chunk last."""
    stream = client.completions.create(
        model=MODEL, prompt="hello there", max_tokens=7, stream=True,
        stream_options={"include_usage": True}, extra_body=EXACT,
    )  # fmt: skip
    with stream:
        chunks = list(stream)
    assert len([c for c in chunks if c.choices and c.choices[0].text]) == 7
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 7
    assert chunks[-1].usage.prompt_tokens == math.ceil(len("hello there") / 4)


def test_answer_carries_queue_ms_and_lane_headers(client: openai.OpenAI) -> None:
    """Every admitted answer says how long it queued (ms, a non-negative number) and in
    which lane; without a lane header that is the tenant's default lane."""
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=3, extra_body=EXACT
    )
    assert float(raw.headers["X-Sluicegate-Queue-Ms"]) >= 0.0
    assert raw.headers["X-Sluicegate-Lane"] == "interactive"
    usage = raw.parse().usage
    assert usage is not None
    assert usage.completion_tokens == 3


def test_stream_carries_the_requested_lane_header(client: openai.OpenAI) -> None:
    """A stream's response headers name the lane asked for with X-Sluicegate-Lane."""
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt="hi", max_tokens=3, stream=True, extra_body=EXACT,
        extra_headers={"X-Sluicegate-Lane": "batch"},
    )  # fmt: skip
    with raw.parse() as stream:
        texts = [c.choices[0].text for c in stream if c.choices]
    assert raw.headers["X-Sluicegate-Lane"] == "batch"
    assert float(raw.headers["X-Sluicegate-Queue-Ms"]) >= 0.0
    assert len([t for t in texts if t]) == 3


def test_models_lists_the_configured_model(client: openai.OpenAI) -> None:
    """``GET /v1/models`` lists exactly the configured models in OpenAI's list shape."""
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert all(m.object == "model" for m in models.data)


def test_embeddings_are_scheduled_and_relayed(client: openai.OpenAI) -> None:
    """An embeddings request through the gateway gets the engine's vectors (the emulator's:
    16 numbers) and usage, and its response carries the gateway's lane header."""
    raw = client.embeddings.with_raw_response.create(model=MODEL, input=["embed me", "and me"])
    reply = raw.parse()
    assert [item.index for item in reply.data] == [0, 1]
    assert all(len(item.embedding) == 16 for item in reply.data)
    assert reply.usage.prompt_tokens == 2 + 2
    assert raw.headers["X-Sluicegate-Lane"] == "interactive"


def test_an_engines_embeddings_refusal_has_exactly_the_openai_fields(gateway: Stack) -> None:
    """The engine's 400 for a bad ``dimensions`` is relayed with its status as
    ``{"error": {message, type, code, param}}`` and nothing else."""
    body = {"model": MODEL, "input": "x", "dimensions": 0}
    reply = http_call(gateway.base_url, "POST", "/v1/embeddings", json=body, key=KEY)
    assert reply.status == 400
    error = openai_error(reply)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "dimensions"
