"""The real-time runner on its own (no HTTP): delivery, finish reasons, abort, stop."""

from __future__ import annotations

import asyncio

import pytest

from sluicegate.emulator import EmulatorMetrics, EngineRunner, FinishReason, RequestStream
from sluicegate.emulator.runner import Finish, Token
from sluicegate.engine import Engine, EngineConfig


def _runner(config: EngineConfig) -> tuple[Engine, EngineRunner]:
    engine = Engine(config)
    return engine, EngineRunner(engine, EmulatorMetrics("m", engine))


async def _drain(stream: RequestStream) -> tuple[list[str], FinishReason]:
    texts: list[str] = []
    while True:
        event = await stream.next_event()
        if isinstance(event, Finish):
            return texts, event.reason
        texts.append(event.text)


async def test_ignore_eos_delivers_max_tokens_then_length(tiny: EngineConfig) -> None:
    """With ignore_eos a request yields exactly max_tokens tokens, then finish 'length'."""
    engine, runner = _runner(tiny)
    runner.start()
    try:
        texts, reason = await _drain(runner.submit("a", 10, 25, ignore_eos=True))
    finally:
        await runner.stop()
    assert (len(texts), reason) == (25, FinishReason.LENGTH)
    assert engine.is_idle


async def test_early_eos_finishes_with_stop(tiny: EngineConfig) -> None:
    """A request whose seeded length is below max_tokens finishes with 'stop'."""
    engine, runner = _runner(tiny)
    req_id = next(
        f"r{i}" for i in range(1000) if engine.planned_output_tokens(f"r{i}", 10, 400) < 400
    )
    runner.start()
    try:
        texts, reason = await _drain(runner.submit(req_id, 10, 400))
    finally:
        await runner.stop()
    assert reason is FinishReason.STOP
    assert len(texts) == engine.planned_output_tokens(req_id, 10, 400)


async def test_abort_frees_kv_at_once_and_drops_pending_tokens(tiny: EngineConfig) -> None:
    """Aborting mid-stream frees the request's KV immediately; its stream ends with
    'abort' and no token of the step in flight is delivered after it."""
    engine, runner = _runner(tiny)
    runner.start()
    try:
        stream = runner.submit("a", 500, 1000, ignore_eos=True)
        assert isinstance(await stream.next_event(), Token)
        assert runner.abort("a")
        assert engine.kv_cache_usage == 0.0
        assert engine.num_requests_running == 0
        while isinstance(event := await stream.next_event(), Token):
            pass  # tokens delivered before the abort may still sit in the queue
        assert event == Finish(FinishReason.ABORT)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(stream.next_event(), timeout=10 * tiny.base_s)
        assert runner.stats().aborted_total == 1
    finally:
        await runner.stop()


async def test_abort_of_a_finished_request_is_a_no_op(tiny: EngineConfig) -> None:
    """Abort returns False and counts nothing once the request has finished."""
    _, runner = _runner(tiny)
    runner.start()
    try:
        await _drain(runner.submit("a", 4, 3, ignore_eos=True))
        assert not runner.abort("a")
    finally:
        await runner.stop()
    assert runner.stats().aborted_total == 0


async def test_stop_aborts_live_requests(tiny: EngineConfig) -> None:
    """Stopping the runner ends every live stream with 'abort'."""
    _, runner = _runner(tiny)
    runner.start()
    stream = runner.submit("a", 4, 5000, ignore_eos=True)
    await runner.stop()
    _, reason = await _drain(stream)
    assert reason is FinishReason.ABORT


async def test_refused_request_raises_value_error(tiny: EngineConfig) -> None:
    """A request the engine could never hold is refused with ValueError, not queued."""
    _, runner = _runner(tiny)
    with pytest.raises(ValueError, match="KV capacity"):
        runner.submit("a", tiny.kv_capacity_tokens, 10)
    assert runner.stats().admitted_total == 0
