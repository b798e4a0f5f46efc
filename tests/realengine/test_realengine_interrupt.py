"""llama-cpp-python's ``--interrupt_requests`` (on by default): a request that arrives while
a stream is generated cuts that stream short, ending it with ``[DONE]`` and no
``finish_reason``. A backend ``max_concurrency: 1`` keeps the gateway from ever sending that
second request; without it, a cut-short stream must not pass for a complete answer."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.gateway.gateway_harness import finish_reason, read_events
from tests.realengine.gaps import CUT_SHORT_STREAM
from tests.realengine.llama_server import LlamaServer, llama_server, require_llama_cpp
from tests.realengine.realengine_client import completion_body, error_of
from tests.realengine.realengine_stack import gateway_on

require_llama_cpp()
pytestmark = pytest.mark.realengine

LONG = 3000
FULL = 300


@pytest.fixture(scope="module")
def interrupting_engine(tiny_model: Path) -> Iterator[LlamaServer]:
    """An engine started with ``--interrupt_requests true``."""
    log = tiny_model.with_name("interrupting.log")
    with llama_server(tiny_model, log, interrupt_requests=True) as server:
        yield server


async def _first_then_second(
    base_url: str, first_tokens: int
) -> tuple[list[bytes], int, list[bytes]]:
    """Stream a first completion; once it generates, send a second; return the first's
    payloads, the second's status and its payloads."""
    url = base_url + "/v1/completions"
    first = completion_body("first", first_tokens, stream=True)
    async with aiohttp.ClientSession() as session:

        async def second() -> tuple[int, list[bytes]]:
            body = completion_body("second", 4, stream=True)
            async with session.post(url, json=body) as reply:
                return reply.status, await read_events(reply)

        async with session.post(url, json=first) as a:
            assert a.status == 200
            head = await a.content.readline()
            later = asyncio.ensure_future(second())
            rest = await read_events(a)
        status, payloads = await asyncio.wait_for(later, 30)
    assert head.startswith(b"data:")
    return [head[5:].strip(), *rest], status, payloads


def _texts(payloads: list[bytes]) -> int:
    """How many chunks carry generated text."""
    events = [orjson.loads(p) for p in payloads if p != b"[DONE]"]
    return sum(1 for e in events if e.get("choices") and e["choices"][0].get("text"))


async def test_a_second_request_cuts_a_running_stream_short(
    interrupting_engine: LlamaServer,
) -> None:
    """Sent straight to the engine: the first stream ends with [DONE], far short of its
    max_tokens and with no finish_reason; the second is served."""
    first, status, second = await _first_then_second(interrupting_engine.url, LONG)
    assert first[-1] == b"[DONE]"
    assert _texts(first) < LONG
    assert all(finish_reason(p) is None for p in first[:-1])
    assert status == 200
    assert second[-1] == b"[DONE]"


async def test_with_one_slot_the_gateway_never_cuts_a_stream_short(
    interrupting_engine: LlamaServer,
) -> None:
    """Through a gateway whose backend has ``max_concurrency: 1``, the second request waits
    in the gateway, and the first stream runs to its max_tokens."""
    with gateway_on(interrupting_engine.port, scrape=False) as gateway:
        first, status, second = await _first_then_second(gateway.base_url, FULL)
    assert _texts(first) == FULL
    assert finish_reason(first[-2]) == "length"
    assert status == 200
    assert second[-1] == b"[DONE]"


@CUT_SHORT_STREAM
async def test_without_a_cap_a_cut_short_stream_ends_with_an_error_event(
    interrupting_engine: LlamaServer,
) -> None:
    """With no backend cap the gateway forwards the second request and the engine cuts the
    first stream short; its client gets an error event, not a silent end."""
    with gateway_on(interrupting_engine.port, max_concurrency=None, scrape=False) as gateway:
        first, _, _ = await _first_then_second(gateway.base_url, LONG)
    assert _texts(first) < LONG
    assert error_of(first) is not None
