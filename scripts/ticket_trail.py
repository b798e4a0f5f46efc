"""Follow one ticket from the gateway's driver into the core and count the module hops.

Drives one ticket down the real path: the gateway's asyncio driver
(``gateway/asyncio_driver.py``, ``SchedulerDriver``) submits it to a
``core.Scheduler`` built from a small config (one model, one lane, one backend),
the scheduler admits it at once, and the driver completes it. ``sys.setprofile``
records every Python call and return meanwhile, with its function's module; only
``sluicegate`` modules count (asyncio, the standard library and the code Python
generates for named tuples are left out).

From the calls and returns the tool builds the call tree, then reads it three ways.
In each, consecutive events in one module collapse into one *stay*, and a stay in
a module that had a stay earlier in the sequence, with another module in between,
is a *return to a module already left* (so returns = stays − distinct modules):

- **hand-offs** (the count this tool is for): the modules control is handed to.
  A call is a hand-off when it crosses into another module and goes on from there
  into a third. A call that stays inside its own module until it returns (a
  question or a command on that module's state: ``len(queue)``,
  ``ModelRuntime.cap()``, ``CircuitBreaker.on_success()``) is the caller asking
  or telling, not handing control over; a call within one module is that module's
  own business. A return hands nothing over: decisions flow down by calls and
  events flow up by returns, and a module handed control again is ping-pong.
- **calls and returns**: the module of every call and every return, with the
  self-contained calls above left out. A function that handed control down and
  then returns counts as a return to its module, so this also counts depth.
- **raw**: the module of every call and every return, nothing left out.

    python scripts/ticket_trail.py [--functions] [--max-returns N]

Prints the hand-off trail, then the counts of the three readings. ``--functions``
lists the functions of each stay; ``--max-returns N`` exits 1 when the hand-off
trail has more than ``N`` returns. Profiling needs the core as plain Python (the
editable install, or ``PYTHONPATH=src``): functions compiled with mypyc make no
profile events.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from sluicegate.core import (
    Admit,
    BackendSpec,
    LaneSpec,
    ModelSpec,
    Scheduler,
    SchedulerSpec,
    TenantSpec,
    Ticket,
    TicketId,
    Usage,
)
from sluicegate.gateway.asyncio_driver import SchedulerDriver

PACKAGE = "sluicegate"


@dataclass(eq=False)
class Call:
    """One call of a ``sluicegate`` function and what it called in turn."""

    module: str
    function: str
    parent: Call | None
    modules: set[str] = field(default_factory=set)  # every module of its subtree

    @property
    def self_contained(self) -> bool:
        """Whether it stayed in its own module until it returned."""
        return self.modules == {self.module}

    @property
    def hand_off(self) -> bool:
        """Whether it crossed into another module and went on from there."""
        return not self.self_contained and (
            self.parent is None or self.parent.module != self.module
        )


@dataclass
class Stay:
    """Consecutive events in one module, and the functions called there."""

    module: str
    functions: list[str] = field(default_factory=list)


@dataclass
class Trail:
    """A sequence of stays and the counts derived from it."""

    stays: list[Stay]

    @property
    def modules(self) -> list[str]:
        """The distinct modules, in order of first stay."""
        return list(dict.fromkeys(stay.module for stay in self.stays))

    @property
    def returns(self) -> int:
        """Stays in a module that had an earlier stay (another module in between)."""
        return len(self.stays) - len(self.modules)


def _module(frame: FrameType) -> str | None:
    name = frame.f_globals.get("__name__")
    if isinstance(name, str) and (name == PACKAGE or name.startswith(PACKAGE + ".")):
        return name
    return None


class Recorder:
    """A ``sys.setprofile`` hook: the ``sluicegate`` calls and returns, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Call]] = []
        self._stack: list[Call | None] = []  # one item per Python frame entered

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        """Note a Python call or return."""
        if event == "call":
            module = _module(frame)
            parent = next((c for c in reversed(self._stack) if c is not None), None)
            call = None if module is None else Call(module, frame.f_code.co_qualname, parent)
            self._stack.append(call)
            if call is not None:
                self.events.append(("call", call))
        elif event == "return" and self._stack:
            call = self._stack.pop()
            if call is not None:
                call.modules.add(call.module)
                if call.parent is not None:
                    call.parent.modules |= call.modules
                self.events.append(("return", call))


def _collapse(steps: Iterable[tuple[str, str | None]]) -> Trail:
    stays: list[Stay] = []
    for module, function in steps:
        if not stays or stays[-1].module != module:
            stays.append(Stay(module))
        if function is not None:
            stays[-1].functions.append(function)
    return Trail(stays)


def hand_offs(events: list[tuple[str, Call]]) -> Trail:
    """The modules control is handed to: calls into another module that go on from there."""
    return _collapse(
        (call.module, call.function) for kind, call in events if kind == "call" and call.hand_off
    )


def calls_and_returns(events: list[tuple[str, Call]], *, raw: bool = False) -> Trail:
    """Every call's and return's module; self-contained calls left out unless ``raw``."""
    return _collapse(
        (call.module, call.function if kind == "call" else None)
        for kind, call in events
        if raw or not call.self_contained or call.parent is None
    )


def _scheduler() -> Scheduler:
    lane = LaneSpec(name="main", max_concurrency=4, policy="fifo")
    model = ModelSpec(name="m", backends=(BackendSpec(name="b0"),), lanes=(lane,))
    return Scheduler(SchedulerSpec(models=(model,), tenants=(TenantSpec(name="t"),)))


async def _journey(recorder: Recorder) -> None:
    driver = SchedulerDriver(_scheduler())
    now = driver.now()
    ticket = Ticket(
        id=TicketId("trail"),
        model="m",
        tenant="t",
        lane="main",
        priority=2,
        prompt_tokens=100,
        max_tokens=100,
        arrival=now,
    )
    usage = Usage(prompt_tokens=100, completion_tokens=50, ttft_s=0.05)
    sys.setprofile(recorder)
    try:
        verdict = await driver.submit(ticket)
        driver.complete(ticket.id, usage, ran_to_end=True)
    finally:
        sys.setprofile(None)
    driver.close()
    assert isinstance(verdict, Admit), verdict
    assert driver.scheduler.live_tickets() == 0


def record() -> list[tuple[str, Call]]:
    """Drive one ticket through submit, admission and completion; its calls and returns."""
    recorder = Recorder()
    asyncio.run(_journey(recorder))
    return recorder.events


def _short(module: str) -> str:
    return module.removeprefix(PACKAGE + ".")


def main(argv: list[str] | None = None) -> int:
    """Print the hand-off trail and the counts of the three readings."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--functions", action="store_true", help="list each stay's functions")
    parser.add_argument("--max-returns", type=int, default=None, help="exit 1 above this")
    args = parser.parse_args(argv)
    events = record()
    trail = hand_offs(events)
    seen: set[str] = set()
    for number, stay in enumerate(trail.stays, 1):
        mark = "  (return)" if stay.module in seen else ""
        seen.add(stay.module)
        print(f"{number:3d}  {_short(stay.module)}{mark}")
        if args.functions:
            print("       " + ", ".join(dict.fromkeys(stay.functions)))
    touched = {call.module for _, call in events}
    print(f"modules touched: {len(touched)}")
    readings = (
        ("hand-offs", trail),
        ("calls and returns", calls_and_returns(events)),
        ("raw", calls_and_returns(events, raw=True)),
    )
    for name, reading in readings:
        print(
            f"{name}: stays: {len(reading.stays)}, distinct modules: {len(reading.modules)}, "
            f"returns to a module already left: {reading.returns}"
        )
    if args.max_returns is not None and trail.returns > args.max_returns:
        print(f"more than {args.max_returns} returns in the hand-off trail", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
