"""The official openai SDK through sluicegate to llama.cpp's own server (``llama-server
--parallel 4``, ``engine: llama-server``): chat and completions, streamed and not, relay
exactly what the engine generates, with its usage, finish_reason, ``n`` choices, stop
sequences and logprobs, and the gateway accounts the engine's own token counts; what
llama-server does differently from OpenAI (usage placement, completion logprobs, ``n``
choices in slots of their own, connections it closes) is pinned here, each with its row
in the README's engine table."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.gateway.gateway_harness import MODEL, Stack, http_call, metric, wait_until
from tests.realengine.llama_cpp_server import LlamaCppServer, MetricsWatch
from tests.realengine.realengine_client import sdk_client
from tests.realengine.realengine_stack import GatewayFactory

pytestmark = pytest.mark.realengine

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me a story."}]
PROMPT = "Once upon a time"
MAX_TOKENS = 24
GREEDY: dict[str, Any] = {"model": MODEL, "max_tokens": MAX_TOKENS, "temperature": 0.0}
WITH_USAGE: dict[str, Any] = {"stream_options": {"include_usage": True}}


def _ask(base_url: str, endpoint: str, **extra: Any) -> Any:
    """A greedy answer of ``endpoint`` (``chat`` or ``completions``), as the SDK returns it
    (a list of chunks when ``stream=True``)."""
    fields = {**GREEDY, **extra}
    with sdk_client(base_url) as client:
        if endpoint == "chat":
            answer: Any = client.chat.completions.create(messages=MESSAGES, **fields)
        else:
            answer = client.completions.create(prompt=PROMPT, **fields)
        return list(answer) if fields.get("stream") else answer


def _text(endpoint: str, choice: Any) -> str:
    """The text of a whole choice or of one streamed chunk's choice."""
    if endpoint == "completions":
        return str(choice.text or "")
    part = choice.delta if hasattr(choice, "delta") else choice.message
    return str(part.content or "")


def _streamed(endpoint: str, chunks: list[Any]) -> tuple[str, str | None]:
    """(text, finish_reason) of choice 0 of a stream."""
    choices = [c for chunk in chunks for c in chunk.choices if c.index == 0]
    finishes = [c.finish_reason for c in choices if c.finish_reason is not None]
    assert len(finishes) <= 1, finishes
    return "".join(_text(endpoint, c) for c in choices), (finishes or [None])[0]


@pytest.fixture
def gateway(gateway_for_llama_cpp: GatewayFactory) -> Iterator[Stack]:
    """A gateway in front of llama-server, no scraping (these tests are about the relay)."""
    with gateway_for_llama_cpp(scrape=False) as stack:
        yield stack


def _accounted(gateway: Stack, kind: str) -> float | None:
    return metric(gateway.base_url, "sluicegate_tokens_total", model=MODEL, kind=kind)


def _settled(gateway: Stack, completion_tokens: int) -> bool:
    """Whether the gateway has accounted ``completion_tokens`` (it does so as a stream ends)."""
    return wait_until(lambda: _accounted(gateway, "completion") == completion_tokens, 2.0)


ENDPOINTS = pytest.mark.parametrize("endpoint", ["chat", "completions"])
STREAMED = pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])


@ENDPOINTS
@STREAMED
def test_answer_is_what_the_engine_generates(
    llama_cpp: LlamaCppServer, gateway: Stack, endpoint: str, stream: bool
) -> None:
    """A greedy answer through the gateway is the engine's own, to max_tokens (``length``)."""
    expected = _ask(llama_cpp.url, endpoint)
    if stream:
        text, finish = _streamed(endpoint, _ask(gateway.base_url, endpoint, stream=True))
    else:
        answer = _ask(gateway.base_url, endpoint)
        text, finish = _text(endpoint, answer.choices[0]), answer.choices[0].finish_reason
    assert text == _text(endpoint, expected.choices[0])
    assert finish == "length"


@ENDPOINTS
def test_unary_usage_is_the_engines_and_is_accounted(
    llama_cpp: LlamaCppServer, gateway: Stack, endpoint: str
) -> None:
    """A non-streamed answer's usage through the gateway is the engine's (max_tokens
    completion tokens), and the gateway accounts exactly those counts."""
    expected = _ask(llama_cpp.url, endpoint).usage
    usage = _ask(gateway.base_url, endpoint).usage
    assert usage is not None
    assert expected is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
        expected.prompt_tokens, MAX_TOKENS, expected.prompt_tokens + MAX_TOKENS,
    )  # fmt: skip
    assert _settled(gateway, MAX_TOKENS), _accounted(gateway, "completion")
    assert _accounted(gateway, "prompt") == expected.prompt_tokens


def test_streamed_chat_usage_when_asked_is_the_engines_and_is_accounted(
    llama_cpp: LlamaCppServer, gateway: Stack
) -> None:
    """With ``stream_options.include_usage`` a chat stream ends with the engine's usage in a
    chunk without choices, as OpenAI's does, and the gateway accounts those counts."""
    expected = _ask(llama_cpp.url, "chat").usage
    chunks = _ask(gateway.base_url, "chat", stream=True, **WITH_USAGE)
    assert [chunk.usage is not None for chunk in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1].choices == []
    usage = chunks[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (expected.prompt_tokens, MAX_TOKENS)
    assert _settled(gateway, MAX_TOKENS), _accounted(gateway, "completion")
    assert _accounted(gateway, "prompt") == expected.prompt_tokens


def test_streamed_chat_without_usage_asked_has_none(gateway: Stack) -> None:
    """A chat stream that does not ask for usage carries none (as OpenAI's); the gateway
    still accounts the completion tokens, counted from the chunks."""
    chunks = _ask(gateway.base_url, "chat", stream=True)
    assert all(chunk.usage is None for chunk in chunks)
    assert _settled(gateway, MAX_TOKENS), _accounted(gateway, "completion")


@pytest.mark.parametrize("asked", [False, True], ids=["unasked", "asked"])
def test_streamed_completion_usage_rides_on_the_finish_chunk(
    llama_cpp: LlamaCppServer, gateway: Stack, asked: bool
) -> None:
    """llama-server puts ``usage`` in the last chunk of every completions stream, asked for
    or not, beside that chunk's finish_reason (OpenAI: only when asked, in a chunk of its
    own without choices): relayed as is, and accounted."""
    expected = _ask(llama_cpp.url, "completions").usage
    chunks = _ask(gateway.base_url, "completions", stream=True, **(WITH_USAGE if asked else {}))
    assert [chunk.usage is not None for chunk in chunks] == [False] * (len(chunks) - 1) + [True]
    last = chunks[-1]
    assert last.choices[0].finish_reason == "length"
    assert last.usage.prompt_tokens == expected.prompt_tokens
    assert _settled(gateway, MAX_TOKENS), _accounted(gateway, "completion")
    assert _accounted(gateway, "prompt") == expected.prompt_tokens


@ENDPOINTS
@STREAMED
def test_n_choices_are_each_the_greedy_answer(
    llama_cpp: LlamaCppServer, gateway: Stack, endpoint: str, stream: bool
) -> None:
    """``n: 2`` gives two whole choices, indexes 0 and 1, each the greedy answer (each
    choice is generated in a slot of its own)."""
    expected = _text(endpoint, _ask(llama_cpp.url, endpoint).choices[0])
    answer = _ask(gateway.base_url, endpoint, n=2, stream=stream)
    if stream:
        texts = {i: _streamed_choice(endpoint, answer, i) for i in (0, 1)}
    else:
        texts = {c.index: _text(endpoint, c) for c in answer.choices}
    assert texts == {0: expected, 1: expected}


def _streamed_choice(endpoint: str, chunks: list[Any], index: int) -> str:
    return "".join(
        _text(endpoint, c) for chunk in chunks for c in chunk.choices if c.index == index
    )


@pytest.mark.parametrize(
    ("endpoint", "fields"),
    [
        pytest.param("chat", {}, id="chat-unary"),
        pytest.param("completions", {}, id="completions-unary"),
        pytest.param("chat", {"stream": True}, id="chat-stream"),
        pytest.param("chat", {"stream": True, **WITH_USAGE}, id="chat-stream-usage"),
        pytest.param("completions", {"stream": True}, id="completions-stream"),
    ],
)
def test_n_choices_are_all_accounted(gateway: Stack, endpoint: str, fields: dict[str, Any]) -> None:
    """The gateway accounts the completion tokens of both choices of an ``n: 2`` answer."""
    _ask(gateway.base_url, endpoint, n=2, **fields)
    assert _settled(gateway, 2 * MAX_TOKENS), _accounted(gateway, "completion")


@ENDPOINTS
@STREAMED
def test_stop_sequence_ends_the_answer_before_it(
    llama_cpp: LlamaCppServer, gateway: Stack, endpoint: str, stream: bool
) -> None:
    """A stop sequence taken from the middle of the greedy answer ends the answer just
    before it, with finish_reason ``stop``."""
    whole = _text(endpoint, _ask(llama_cpp.url, endpoint).choices[0])
    stop = whole[10:13]
    before = whole[: whole.index(stop)]
    if stream:
        text, finish = _streamed(
            endpoint, _ask(gateway.base_url, endpoint, stop=[stop], stream=True)
        )
    else:
        answer = _ask(gateway.base_url, endpoint, stop=[stop])
        text, finish = _text(endpoint, answer.choices[0]), answer.choices[0].finish_reason
    assert (text, finish) == (before, "stop")


def test_chat_logprobs_are_relayed(gateway: Stack) -> None:
    """Chat logprobs (``logprobs: true, top_logprobs: 2``) come back in OpenAI's shape: one
    entry per generated token, each with two alternatives."""
    answer = _ask(gateway.base_url, "chat", logprobs=True, top_logprobs=2)
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.content is not None
    assert len(logprobs.content) == MAX_TOKENS
    assert all(len(entry.top_logprobs) == 2 for entry in logprobs.content)


def test_completion_logprobs_come_in_the_chat_shape(gateway: Stack) -> None:
    """llama-server answers a completion's ``logprobs: 2`` in the chat shape
    (``logprobs.content``, one entry per token) instead of OpenAI's ``tokens`` /
    ``token_logprobs`` / ``top_logprobs`` lists: the gateway relays it as is."""
    reply = http_call(
        gateway.base_url,
        "POST",
        "/v1/completions",
        json={**GREEDY, "prompt": PROMPT, "logprobs": 2},
    )
    assert reply.status == 200, reply
    logprobs = reply.json()["choices"][0]["logprobs"]
    assert "tokens" not in logprobs
    assert "token_logprobs" not in logprobs
    assert len(logprobs["content"]) == MAX_TOKENS
    assert all(len(entry["top_logprobs"]) == 2 for entry in logprobs["content"])


def test_models_are_the_gateways_own_list(llama_cpp: LlamaCppServer, gateway: Stack) -> None:
    """``/v1/models`` is the gateway's OpenAI list of its configured models; the engine's
    own (with an extra ``models`` array) is never relayed."""
    assert "models" in llama_cpp.get_json("/v1/models")
    with sdk_client(gateway.base_url) as client:
        models = client.models.list()
    assert [model.id for model in models.data] == [MODEL]
    assert "models" not in http_call(gateway.base_url, "GET", "/v1/models").json()


# cpp-httplib closes a connection after 100 requests on it, after 5 s idle, and after every
# error answer (``Keep-Alive: timeout=5, max=100``; ``Connection: close``).
KEEP_ALIVE_MAX = 100
KEEP_ALIVE_IDLE_S = 5.0


def test_pooled_connections_outlive_the_engines_closing_them(gateway: Stack) -> None:
    """Requests one after another through the gateway's pooled connections are all
    served: past the engine's 100 requests a connection, after one of its error answers
    (which close the connection), and after the connection sat idle past its 5 s."""
    body = {**GREEDY, "prompt": PROMPT, "max_tokens": 2}
    # The engine's 400 (more choices than slots, n: 5, is now the gateway's own 400).
    bad = {**body, "grammar": "root ::= ("}
    statuses = [
        http_call(
            gateway.base_url, "POST", "/v1/completions", json=bad if i % 40 == 39 else body
        ).status
        for i in range(KEEP_ALIVE_MAX + 20)
    ]
    assert statuses == [400 if i % 40 == 39 else 200 for i in range(KEEP_ALIVE_MAX + 20)]
    time.sleep(KEEP_ALIVE_IDLE_S + 0.5)
    assert http_call(gateway.base_url, "POST", "/v1/completions", json=body).status == 200


def test_n_choices_never_overflow_the_slots(llama_cpp: LlamaCppServer, gateway: Stack) -> None:
    """Four concurrent ``n: 2`` streams with the gateway's cap at the engine's four slots:
    nothing waits in the engine's own queue."""
    body = {**GREEDY, "prompt": PROMPT, "max_tokens": 1500, "n": 2, "stream": True}

    def stream() -> int:
        return http_call(gateway.base_url, "POST", "/v1/completions", json=body, timeout=60).status

    with MetricsWatch(llama_cpp) as watch, ThreadPoolExecutor(4) as pool:
        statuses = list(pool.map(lambda _: stream(), range(4)))
    assert statuses == [200] * 4
    assert watch.polls > 0
    assert watch.peak.get("llamacpp:requests_deferred") == 0.0, watch.peak
