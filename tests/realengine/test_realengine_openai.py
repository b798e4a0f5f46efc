"""The official openai SDK through sluicegate to llama.cpp: chat and completions, streamed
and not, relay exactly what the engine generates, and the gateway accounts the engine's
own token counts."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.gateway.gateway_harness import MODEL, Stack, metric, wait_until
from tests.realengine.gaps import STREAM_PROMPT_TOKENS
from tests.realengine.llama_server import LlamaServer, require_llama_cpp
from tests.realengine.realengine_client import sdk_client, token_count
from tests.realengine.realengine_stack import GatewayFactory

require_llama_cpp()
pytestmark = pytest.mark.realengine

from tests.realengine.tiny_gguf import chatml  # noqa: E402

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me a story."}]
PROMPT = "Once upon a time"
MAX_TOKENS = 24


def _chat(base_url: str, *, stream: bool) -> tuple[str, str | None]:
    """(text, finish_reason) of a greedy chat answer from ``base_url``."""
    with sdk_client(base_url) as client:
        if not stream:
            answer = client.chat.completions.create(
                model=MODEL, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0.0
            )
            return answer.choices[0].message.content or "", answer.choices[0].finish_reason
        chunks = list(
            client.chat.completions.create(
                model=MODEL, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0.0,
                stream=True,
            )
        )  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks[-1].choices[0].finish_reason


def _completion(base_url: str, *, stream: bool) -> tuple[str, str | None]:
    """(text, finish_reason) of a greedy text completion from ``base_url``."""
    with sdk_client(base_url) as client:
        if not stream:
            answer = client.completions.create(
                model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.0
            )
            return answer.choices[0].text, answer.choices[0].finish_reason
        chunks = list(
            client.completions.create(
                model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.0, stream=True
            )
        )
    return "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason


@pytest.fixture
def gateway(gateway_for: GatewayFactory) -> Iterator[Stack]:
    """A gateway in front of the engine, no scraping (these tests are about the relay)."""
    with gateway_for(scrape=False) as stack:
        yield stack


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
@pytest.mark.parametrize("ask", [_chat, _completion], ids=["chat", "completion"])
def test_relays_what_the_engine_generates(
    llama_engine: LlamaServer,
    gateway: Stack,
    ask: Callable[..., tuple[str, str | None]],
    stream: bool,
) -> None:
    """A greedy chat answer or text completion through the gateway is the engine's own
    answer, to max_tokens."""
    expected, _ = ask(llama_engine.url, stream=False)
    text, finish = ask(gateway.base_url, stream=stream)
    assert text == expected
    assert finish == "length"


def _accounted(gateway: Stack, kind: str) -> float | None:
    return metric(gateway.base_url, "sluicegate_tokens_total", model=MODEL, kind=kind)


def _settled(gateway: Stack, completion_tokens: int) -> bool:
    """Whether the gateway has accounted the request (it does so as the stream ends)."""
    return wait_until(lambda: _accounted(gateway, "completion") == completion_tokens, 2.0)


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_completion_tokens_are_accounted_as_the_engine_generated_them(
    gateway: Stack, stream: bool
) -> None:
    """Completion tokens accounted equal the engine's: from its usage, or counted from the
    chunks of a stream (which carries no usage)."""
    _chat(gateway.base_url, stream=stream)
    assert _settled(gateway, MAX_TOKENS), _accounted(gateway, "completion")


@STREAM_PROMPT_TOKENS
def test_unary_prompt_tokens_are_the_engines_count(
    llama_engine: LlamaServer, gateway: Stack
) -> None:
    """A unary chat's prompt tokens accounted are the engine's count of the rendered
    template (its /extras/tokenize/count)."""
    _chat(gateway.base_url, stream=False)
    assert _settled(gateway, MAX_TOKENS)
    assert _accounted(gateway, "prompt") == token_count(llama_engine.url, chatml(MESSAGES))


@STREAM_PROMPT_TOKENS
def test_streamed_prompt_tokens_are_the_engines_count(
    llama_engine: LlamaServer, gateway: Stack
) -> None:
    """A streamed completion's prompt tokens accounted are the engine's count of the prompt."""
    _completion(gateway.base_url, stream=True)
    assert _settled(gateway, MAX_TOKENS)
    assert _accounted(gateway, "prompt") == token_count(llama_engine.url, PROMPT)


@STREAM_PROMPT_TOKENS
def test_unary_answer_streamed_upstream_reports_the_engines_usage(
    llama_engine: LlamaServer, gateway: Stack
) -> None:
    """A unary completion in a lane that preempts with ``abort`` (which the gateway streams
    from the engine and reassembles) is the engine's own text, with the engine's usage."""
    expected, _ = _completion(llama_engine.url, stream=False)
    with sdk_client(gateway.base_url) as client:
        answer = client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.0,
            extra_headers={"X-Sluicegate-Lane": "batch"},
        )  # fmt: skip
    assert answer.choices[0].text == expected
    assert answer.usage is not None
    assert answer.usage.completion_tokens == MAX_TOKENS
    assert answer.usage.prompt_tokens == token_count(llama_engine.url, PROMPT)
