"""The verdict on a ticket: submit it, then wait, interruptibly, for ``Admit``, ``Reject``
or ``Expire``.

A client that leaves while its ticket waits is dropped at once (the ticket
leaves its queue, counted ``cancelled``); a ``Reject`` or an ``Expire`` becomes
the error the client is answered with, retry headers included.
"""

from __future__ import annotations

import asyncio

from sluicegate.core.decisions import Admit, ErrorCode, Expire, Reject
from sluicegate.core.ticket import Outcome
from sluicegate.gateway.asyncio_driver import SchedulerDriver, Verdict
from sluicegate.gateway.http_errors import GatewayError
from sluicegate.gateway.request.exchange import Exchange
from sluicegate.gateway.request.interrupts import WaitInterruptedError

_EXPIRE_MESSAGES = {
    ErrorCode.OVERLOADED: "deadline cannot be met",
    ErrorCode.STORE_UNAVAILABLE: "the shared store is unavailable",
    ErrorCode.NO_HEALTHY_BACKEND: "no healthy backend",
}


def refusal(exchange: Exchange, verdict: Reject | Expire) -> GatewayError:
    """End a refused ticket (counted with the refusal's outcome); the error to answer with."""
    if isinstance(verdict, Reject):
        exchange.finish(verdict.outcome)
        return GatewayError(
            verdict.status, verdict.code.value, verdict.message, retry_after_s=verdict.retry_after_s
        )
    exchange.finish(verdict.outcome)
    message = _EXPIRE_MESSAGES.get(verdict.code, "request waited too long in the queue")
    return GatewayError(503, verdict.code.value, message, retry_after_s=verdict.retry_after_s)


def submit(exchange: Exchange, driver: SchedulerDriver) -> asyncio.Future[Verdict]:
    """Hand the exchange's ticket to the scheduler; the future of its verdict. A ticket
    refused at once raises its refusal here, before anything is set up to wait."""
    waiting = driver.submit(exchange.ticket)
    if waiting.done():
        verdict = waiting.result()
        if not isinstance(verdict, Admit):
            raise refusal(exchange, verdict)
    return waiting


async def admission(exchange: Exchange, waiting: asyncio.Future[Verdict]) -> bool:
    """Wait for the ticket's verdict.

    True once admitted (``exchange.admit`` is set); False if the client left or the
    scheduler dropped the ticket meanwhile (the exchange is then finished as
    ``cancelled``); raises the refusal's ``GatewayError`` for a ``Reject`` or ``Expire``.
    """
    if waiting.cancelled():
        exchange.finish(Outcome.CANCELLED)
        return False
    if waiting.done():
        verdict = waiting.result()
    else:
        try:
            with exchange.interrupts.waiting():
                verdict = await waiting
        except WaitInterruptedError:
            exchange.finish(Outcome.CANCELLED)
            return False
    if not isinstance(verdict, Admit):
        raise refusal(exchange, verdict)
    exchange.admitted(verdict)
    return True
