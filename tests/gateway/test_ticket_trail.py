"""Issue 28: a ticket followed from the gateway's driver into the core comes back to a
module it already left at most 6 times (``scripts/ticket_trail.py``, hand-off trail)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ticket_trail.py"


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ticket_trail", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while defined
    spec.loader.exec_module(module)
    return module


def test_a_ticket_hands_control_back_to_at_most_six_modules_it_left() -> None:
    """Submitted through the asyncio driver, admitted and completed, the ticket passes
    through the core's modules (plain Python, so the profiler sees them) with at most
    6 returns to a module already left."""
    tool = _tool()
    trail = tool.hand_offs(tool.record())
    modules = [stay.module for stay in trail.stays]
    assert modules[0] == "sluicegate.gateway.asyncio_driver"
    for module in ("scheduler", "intake", "admission", "runtime", "preemption"):
        assert f"sluicegate.core.{module}" in modules, modules
    assert trail.returns <= 6, modules


def test_the_trail_counts_a_module_handed_control_again() -> None:
    """The count can fail: a module that hands control to B, then C, then B again has one
    return (B); a call that stays inside its module is no hand-off and no stay."""
    tool = _tool()
    a = tool.Call("a", "f", None, {"a", "b", "c"})
    b1 = tool.Call("b", "g", a, {"b", "x"})
    inside = tool.Call("x", "len", b1, {"x"})
    c = tool.Call("c", "h", a, {"c", "x"})
    b2 = tool.Call("b", "g", a, {"b", "x"})
    events = [("call", call) for call in (a, b1, inside, c, b2)]
    trail = tool.hand_offs(events)
    assert [stay.module for stay in trail.stays] == ["a", "b", "c", "b"]
    assert trail.returns == 1
