"""``n`` choices in the emulator, as vLLM serves them: ``n`` sequences side by side in the
engine, one choice per index (streamed interleaved), one usage covering every choice."""

from __future__ import annotations

import openai
import pytest

from tests.emulator.emulator_harness import MODEL, LiveEmulator

MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [
    {"role": "user", "content": "Three ways to say hello."}
]


def test_n_choices_unstreamed_each_their_own_and_usage_for_all(
    client: openai.OpenAI, emulator: LiveEmulator
) -> None:
    """n = 3 with ignore_eos: three choices (index 0, 1, 2), each max_tokens long; usage
    counts the prompt once and every choice's tokens; the engine ran three sequences."""
    before = emulator.stats()["admitted_total"]
    reply = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=6, n=3, extra_body={"ignore_eos": True}
    )
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert all(len((c.message.content or "").split()) == 6 for c in reply.choices)
    assert all(c.finish_reason == "length" for c in reply.choices)
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 18
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 18
    assert emulator.stats()["admitted_total"] - before == 3


def test_n_choices_stream_interleaved_with_one_usage_chunk(
    client: openai.OpenAI, emulator: LiveEmulator
) -> None:
    """Streamed n = 2: every chunk names its choice; each choice opens with the role, has
    max_tokens tokens and its own finish; one usage chunk at the end counts them all; and
    both sequences ran at once in the engine."""
    stream = client.completions.create(
        model=MODEL, prompt="p", max_tokens=40, n=2, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    tokens = {0: 0, 1: 0}
    finishes: dict[int, str | None] = {}
    usages = []
    running = []
    for chunk in stream:
        if len(running) < 1 and sum(tokens.values()) == 10:
            running.append(emulator.stats()["running"])
        if chunk.usage is not None:
            usages.append(chunk.usage)
        for choice in chunk.choices:
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
            elif choice.text:
                tokens[choice.index] += 1
    assert tokens == {0: 40, 1: 40}
    assert finishes == {0: "length", 1: "length"}
    assert [u.completion_tokens for u in usages] == [80]
    assert running == [2]


def test_n_of_zero_is_refused(client: openai.OpenAI) -> None:
    """n below 1 is a 400 naming n."""
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=MODEL, prompt="p", max_tokens=2, n=0)
    assert raised.value.body["param"] == "n"  # type: ignore[index]
