"""Request parsing and fake text, without a server."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.emulator import FakeText
from sluicegate.emulator.openai_wire import DEFAULT_MAX_TOKENS, ApiError, parse_request


@given(st.text(max_size=200))
def test_prompt_tokens_are_chars_over_four_rounded_up(prompt: str) -> None:
    """A completions prompt of c characters counts as max(1, ceil(c / 4)) tokens."""
    parsed = parse_request(orjson.dumps({"prompt": prompt}), chat=False, model="m")
    assert parsed.prompt_tokens == max(1, -(-len(prompt) // 4))


def test_chat_prompt_sums_every_message() -> None:
    """Chat prompt size sums string contents and text parts of all messages."""
    messages = [
        {"role": "system", "content": "s" * 10},
        {"role": "user", "content": [{"type": "text", "text": "u" * 7}, {"type": "image_url"}]},
        {"role": "assistant", "content": None},
    ]
    parsed = parse_request(orjson.dumps({"messages": messages}), chat=True, model="m")
    assert parsed.prompt_tokens == 5


def test_token_id_prompt_counts_one_token_per_id() -> None:
    """A completions prompt given as token ids counts one token per id."""
    assert parse_request(b'{"prompt": [1, 2, 3]}', chat=False, model="m").prompt_tokens == 3


def test_max_tokens_defaults_and_alias() -> None:
    """max_tokens defaults to 256; max_completion_tokens is accepted in its place."""
    assert parse_request(b'{"prompt": "a"}', chat=False, model="m").max_tokens == (
        DEFAULT_MAX_TOKENS
    )
    parsed = parse_request(b'{"prompt": "a", "max_completion_tokens": 9}', chat=False, model="m")
    assert parsed.max_tokens == 9


def test_stream_options_and_ignore_eos_are_read() -> None:
    """stream, stream_options.include_usage and ignore_eos are parsed as booleans."""
    raw = b'{"prompt": "a", "stream": true, "stream_options": {"include_usage": true},' \
        b' "ignore_eos": true}'  # fmt: skip
    parsed = parse_request(raw, chat=False, model="m")
    assert (parsed.stream, parsed.include_usage, parsed.ignore_eos) == (True, True, True)


def test_other_model_is_404() -> None:
    """A body naming another model is refused with 404 model_not_found."""
    with pytest.raises(ApiError) as info:
        parse_request(b'{"model": "x", "prompt": "a"}', chat=False, model="m")
    assert (info.value.status, info.value.code) == (404, "model_not_found")


@pytest.mark.parametrize(
    "body",
    [
        {"messages": []},
        {"messages": "hi"},
        {"messages": [{"role": "user", "content": 3}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
        {"messages": [{"role": "user", "content": "a"}], "max_tokens": True},
    ],
)
def test_malformed_chat_is_400(body: dict[str, object]) -> None:
    """Malformed chat messages or mistyped fields are 400 invalid_request."""
    with pytest.raises(ApiError) as info:
        parse_request(orjson.dumps(body), chat=True, model="m")
    assert (info.value.status, info.value.code) == (400, "invalid_request")


def test_fake_text_is_deterministic_per_request_id() -> None:
    """The same id and seed give the same words; another id gives other words."""

    def words(req_id: str, seed: int = 0) -> list[str]:
        text = FakeText(req_id, seed)
        return [text.next_token() for _ in range(30)]

    assert words("a") == words("a")
    assert words("a") != words("b")
    assert words("a") != words("a", seed=1)
    assert all(w.startswith(" ") and w[1:].isascii() and w[1:].isalpha() for w in words("a"))
