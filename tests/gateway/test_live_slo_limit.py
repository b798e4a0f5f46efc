"""The ``slo`` adaptive limit over real HTTP (DESIGN §5): the gateway reports each answer's
time to first token and time per output token the way the simulator does, so the limit
judges the live engine's decode steps against ``tpot_ms`` and its first tokens against
``ttft_ms``.

The engine is the emulator with the ``tiny`` preset (~2 ms decode steps)."""

from __future__ import annotations

import aiohttp
import pytest

from tests.gateway.gateway_harness import (
    FAST_PRIORS,
    MODEL,
    Stack,
    metric,
    model_state,
    read_events,
    stack,
)

CAP = 8
NEVER_MS = 3_600_000


def _config(tpot_ms: float, ttft_ms: float) -> str:
    # preemptible: never, so a non-streamed request reaches the engine unstreamed and whole.
    return f"""    max_concurrency: {CAP}
    adaptive: {{mode: slo, floor: 1, window: 4, tpot_ms: {tpot_ms}, ttft_ms: {ttft_ms}}}
{FAST_PRIORS}    lanes:
      - {{name: interactive, max_concurrency: {CAP}, preemptible: never}}
"""


def _cap(gateway: Stack) -> int:
    return int(model_state(gateway.base_url)["cap"])


async def _request(session: aiohttp.ClientSession, gateway: Stack, *, stream: bool) -> None:
    body = {
        "model": MODEL, "prompt": "slo", "max_tokens": 20, "ignore_eos": True, "stream": stream,
    }  # fmt: skip
    async with session.post(gateway.base_url + "/v1/completions", json=body) as reply:
        assert reply.status == 200
        if stream:
            assert (await read_events(reply))[-1] == b"[DONE]"
        else:
            await reply.read()


async def _caps_after_windows(config: str, *, stream: bool) -> list[int]:
    """The model's cap after each of two windows of four one-at-a-time requests."""
    caps = []
    with stack(config) as gateway:
        async with aiohttp.ClientSession() as session:
            for _ in range(2):
                for _ in range(4):
                    await _request(session, gateway, stream=stream)
                caps.append(_cap(gateway))
            limit = metric(
                gateway.base_url, "sluicegate_concurrency_limit", model=MODEL, lane="interactive"
            )
    assert limit == caps[-1]
    return caps


@pytest.mark.parametrize("stream", [True, False])
async def test_decode_slower_than_tpot_target_lowers_the_limit(stream: bool) -> None:
    """A TPOT target of 0.5 ms, below the engine's ~2 ms steps (and no TTFT target): each
    window of four answers is slow, streamed (TPOT after the first token) or not (the whole
    answer per output token), and takes the cap down one step: 8 → 7 → 6."""
    caps = await _caps_after_windows(_config(0.5, NEVER_MS), stream=stream)
    assert caps == [7, 6]


@pytest.mark.parametrize("stream", [True, False])
async def test_answers_meeting_both_targets_leave_the_limit_at_its_cap(stream: bool) -> None:
    """With targets far above what the engine takes (1 s per token, an hour to the first),
    the same answers never lower the cap."""
    caps = await _caps_after_windows(_config(1000, NEVER_MS), stream=stream)
    assert caps == [CAP, CAP]


async def test_first_token_slower_than_ttft_target_lowers_the_limit() -> None:
    """Streams whose first token comes later than a 0.01 ms TTFT target lower the cap even
    though their decoding meets its 1 s target."""
    caps = await _caps_after_windows(_config(1000, 0.01), stream=True)
    assert caps == [7, 6]
