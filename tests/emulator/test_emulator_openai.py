"""The emulator against the official ``openai`` SDK: bodies, streams and usage."""

from __future__ import annotations

import openai
import pytest

from sluicegate.engine import Engine
from tests.emulator.emulator_harness import MODEL, LiveEmulator

MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [
    {"role": "user", "content": "Tell me about continuous batching, briefly."}
]


def test_chat_with_ignore_eos_returns_exactly_max_tokens(client: openai.OpenAI) -> None:
    """ignore_eos makes a chat completion generate exactly max_tokens tokens, reason length."""
    reply = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=17, extra_body={"ignore_eos": True}
    )
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 17
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].message.role == "assistant"
    assert len((reply.choices[0].message.content or "").split()) == 17


def test_chat_usage_counts_prompt_as_chars_over_four(client: openai.OpenAI) -> None:
    """Usage reports prompt tokens as ceil(chars / 4) and total = prompt + completion."""
    reply = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_completion_tokens=5, extra_body={"ignore_eos": True}
    )
    assert reply.usage is not None
    chars = len(str(MESSAGES[0]["content"]))
    assert reply.usage.prompt_tokens == -(-chars // 4)
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 5


def test_completion_length_is_the_engine_seeded_draw(
    client: openai.OpenAI, emulator: LiveEmulator
) -> None:
    """Without ignore_eos the output length is the engine's seeded draw for the request id."""
    prompt = "x" * 400
    reply = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=300, extra_headers={"X-Request-Id": "req-a"}
    )
    expected = Engine(emulator.config).planned_output_tokens("req-a", 100, 300)
    assert reply.usage is not None
    assert reply.usage.completion_tokens == expected
    assert reply.choices[0].finish_reason == ("length" if expected == 300 else "stop")
    assert len(reply.choices[0].text.split()) == expected


def test_chat_stream_sends_one_chunk_per_token_then_usage(client: openai.OpenAI) -> None:
    """A chat stream carries one content chunk per token, the role first, then a finish
    chunk with finish_reason, then a usage chunk with no choices."""
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=12, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    with stream:
        chunks = list(stream)
    contents = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(contents) == 12
    assert contents[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12


def test_completion_stream_without_usage_option_has_no_usage_chunk(
    client: openai.OpenAI,
) -> None:
    """A completions stream without include_usage ends with the finish chunk, no usage."""
    stream = client.completions.create(
        model=MODEL, prompt="hello", max_tokens=6, stream=True, extra_body={"ignore_eos": True}
    )
    with stream:
        chunks = list(stream)
    assert sum(1 for c in chunks if c.choices[0].text) == 6
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks)


def test_completion_stream_usage_matches_tokens_streamed(client: openai.OpenAI) -> None:
    """The usage chunk of a completions stream counts the tokens actually streamed."""
    stream = client.completions.create(
        model=MODEL, prompt="abcdefgh", max_tokens=9, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    with stream:
        chunks = list(stream)
    texts = [c for c in chunks if c.choices and c.choices[0].text]
    usage = chunks[-1].usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (2, len(texts))


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    """/v1/models lists exactly the one served model."""
    assert [m.id for m in client.models.list()] == [MODEL]


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    """Naming a model the emulator does not serve is a 404 model_not_found."""
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="other", messages=MESSAGES, max_tokens=2)
    assert info.value.code == "model_not_found"


def test_too_long_prompt_is_context_length_exceeded(
    client: openai.OpenAI, emulator: LiveEmulator
) -> None:
    """A prompt beyond the engine's KV capacity is a 400 context_length_exceeded."""
    capacity = emulator.config.kv_capacity_tokens
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="y" * (4 * capacity), max_tokens=4)
    assert info.value.code == "context_length_exceeded"
    assert emulator.stats()["admitted_total"] == 0
