"""``Interruptible.waiting`` and ``LazyTimer``: how a request's network waits are interrupted.

Real tasks on a real event loop; deadlines of tens of milliseconds on the loop's clock.
"""

from __future__ import annotations

import asyncio

import pytest

from sluicegate.core.decisions import Preempt, PreemptAction
from sluicegate.core.ticket import Ticket, TicketId
from sluicegate.gateway.asyncio_driver import RunningHandle
from sluicegate.gateway.request.interrupts import Interrupt, Interruptible, WaitInterruptedError
from sluicegate.gateway.timer import LazyTimer


async def _wait_with(interrupts: Interruptible, seconds: float = 5.0) -> None:
    with interrupts.waiting():
        await asyncio.sleep(seconds)


async def test_an_interrupt_during_a_wait_ends_it_with_the_reason() -> None:
    """Firing while the task waits cancels the wait, which raises WaitInterruptedError with
    that reason; the task is not left cancelled."""
    interrupts = Interruptible()
    asyncio.get_running_loop().call_later(0.01, interrupts.fire, Interrupt.DISCONNECTED)
    with pytest.raises(WaitInterruptedError) as raised:
        await _wait_with(interrupts)
    assert raised.value.reason is Interrupt.DISCONNECTED
    assert interrupts.gone
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0
    await asyncio.sleep(0)  # still runs: no cancellation is pending


async def test_an_interrupt_outside_a_wait_is_raised_by_the_next_wait_at_once() -> None:
    """An interrupt that comes while nothing waits is only recorded; the next wait raises it
    before waiting; ``reset`` forgets it (a preemption), but not a disconnect."""
    interrupts = Interruptible()
    interrupts.fire(Interrupt.PREEMPTED)
    with pytest.raises(WaitInterruptedError) as raised:
        await _wait_with(interrupts, 60.0)
    assert raised.value.reason is Interrupt.PREEMPTED
    interrupts.reset()
    await _wait_with(interrupts, 0.0)
    interrupts.fire(Interrupt.DISCONNECTED)
    interrupts.reset()
    with pytest.raises(WaitInterruptedError):
        await _wait_with(interrupts, 60.0)


async def test_a_foreign_cancellation_stays_a_cancellation() -> None:
    """Cancelling the task for any other reason (shutdown) is not turned into an interrupt."""

    async def serve() -> None:
        await _wait_with(Interruptible())

    task = asyncio.create_task(serve())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_following_a_handle_turns_its_preemption_into_an_interrupt() -> None:
    """A followed running handle's preemption interrupts the wait; one preempted before it
    was followed interrupts the next wait at once."""
    ticket = Ticket(TicketId("0" * 32), "m", "t", "l", 2, 1, 1, 0.0)
    preempt = Preempt(ticket, "e0", PreemptAction.ABORT)
    interrupts = Interruptible()
    handle = RunningHandle()
    interrupts.follow(handle)
    assert handle.on_preempt is not None
    asyncio.get_running_loop().call_later(0.01, handle.on_preempt, preempt)
    with pytest.raises(WaitInterruptedError) as raised:
        await _wait_with(interrupts)
    assert raised.value.reason is Interrupt.PREEMPTED

    late, already = Interruptible(), RunningHandle()
    already.preempt = preempt
    late.follow(already)
    with pytest.raises(WaitInterruptedError):
        await _wait_with(late, 60.0)


def recording_timer() -> tuple[LazyTimer, list[float], float]:
    """A ``LazyTimer`` on the running loop, the loop times at which it fired (appended as it
    fires), and the loop time now."""
    loop = asyncio.get_running_loop()
    fired: list[float] = []
    return LazyTimer(loop, lambda: fired.append(loop.time())), fired, loop.time()


async def test_lazy_timer_fires_once_at_its_latest_deadline() -> None:
    """Moving a pending deadline later delays the firing to the new deadline (not the first
    one), it fires once, and ``clear`` keeps it from firing at all."""
    timer, fired, start = recording_timer()
    timer.after(0.02)
    timer.after(0.08)
    await asyncio.sleep(0.05)
    assert fired == []
    await asyncio.sleep(0.1)
    assert len(fired) == 1
    assert fired[0] - start >= 0.08
    timer.after(0.02)
    timer.clear()
    await asyncio.sleep(0.05)
    assert len(fired) == 1


async def test_lazy_timer_moved_earlier_fires_early() -> None:
    """Moving a pending deadline earlier fires at the earlier time."""
    timer, fired, start = recording_timer()
    timer.after(10.0)
    timer.after(0.02)
    await asyncio.sleep(0.2)
    assert len(fired) == 1
    assert fired[0] - start < 1.0
    timer.cancel()
