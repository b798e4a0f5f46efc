"""The emulator applies the engine's two fixed overheads: ``request_overhead_s`` before a
request enters the engine, ``response_overhead_s`` on every token's way out, so a lone
request takes ``EngineConfig.solo_latency_s`` from the client's send to its last token."""

from __future__ import annotations

import aiohttp

from sluicegate.calibrate.engine_client import completion_body, time_completion
from sluicegate.engine import EngineConfig
from tests.emulator.emulator_harness import MODEL, run_emulator

# Overheads much larger than the machine's timer and scheduling noise (~ms), so that
# leaving either out, or applying the response overhead once per token, is seen.
SLOW = EngineConfig(
    max_num_seqs=4, max_num_batched_tokens=512, kv_capacity_tokens=4096,
    base_s=0.004, per_decode_seq_s=0.001, request_overhead_s=0.06, response_overhead_s=0.04,
)  # fmt: skip
PROMPT, OUTPUT = 16, 10
SLACK_S = 0.035  # the client, the loop and the other core's load; below response_overhead_s


async def test_a_lone_request_takes_its_solo_latency() -> None:
    """First token after request + prefill + response overhead; last token after
    ``solo_latency_s``; the tokens between keep the steps' gaps (the response overhead
    is paid once per token, not accumulated)."""
    prefill_s = SLOW.solo_service_s(PROMPT, 1)
    with run_emulator(SLOW) as live:
        async with aiohttp.ClientSession() as session:
            body = completion_body("emulator", MODEL, list(range(40, 40 + PROMPT)), OUTPUT)
            record = await time_completion(session, live.base_url, body)
    first = SLOW.request_overhead_s + prefill_s + SLOW.response_overhead_s
    assert first - 0.002 <= record.first_token_s <= first + SLACK_S
    last = record.token_s[-1] - record.sent_s
    solo = SLOW.solo_latency_s(PROMPT, OUTPUT)
    assert solo - 0.002 <= last <= solo + SLACK_S
    decode_s = SLOW.solo_service_s(PROMPT, OUTPUT) - prefill_s
    assert decode_s - 0.002 <= record.token_s[-1] - record.token_s[0] <= decode_s + SLACK_S
    assert record.tail_s < 0.01  # the end follows the last token, both delayed alike
    assert len(record.token_s) == OUTPUT
