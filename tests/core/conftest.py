"""Shared builders for the core scheduler tests: lanes, one-model specs and tickets.

The fixtures are session-scoped and return plain functions, so they also work
inside hypothesis tests. Builders default to what makes behaviour observable:
one backend ``b0``, model ``m``, lane ``main`` with ``max_concurrency`` 1,
``fifo``, ``preemptible: never``, and hour-long timeouts and SLOs so nothing
expires or turns urgent unless a test asks for it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from sluicegate.core.decisions import Admit, Decision
from sluicegate.core.entry import Entry
from sluicegate.core.spec import BackendSpec, LaneSpec, ModelSpec, SchedulerSpec, TenantSpec
from sluicegate.core.ticket import Ticket, TicketId

MODEL = "m"
LANE = "main"

LaneFactory = Callable[..., LaneSpec]
SpecFactory = Callable[..., SchedulerSpec]
TicketFactory = Callable[..., Ticket]


def build_lane(name: str = LANE, **overrides: Any) -> LaneSpec:
    """A lane with test-friendly defaults; ``overrides`` are ``LaneSpec`` fields."""
    fields: dict[str, Any] = {
        "name": name,
        "max_concurrency": 1,
        "policy": "fifo",
        "preemptible": "never",
        "queue_timeout_s": 3600.0,
        "slo_ms": 3_600_000.0,
    }
    fields.update(overrides)
    return LaneSpec(**fields)


def build_spec(
    *lanes: LaneSpec,
    tenants: Sequence[TenantSpec] = (),
    backends: Sequence[str] = ("b0",),
    **model_overrides: Any,
) -> SchedulerSpec:
    """A scheduler spec with one model ``m`` holding ``lanes`` (default: one ``main`` lane)."""
    model = ModelSpec(
        name=MODEL,
        backends=tuple(BackendSpec(name=name) for name in backends),
        lanes=lanes or (build_lane(),),
        **model_overrides,
    )
    return SchedulerSpec(models=(model,), tenants=tuple(tenants))


def build_ticket(
    name: str,
    *,
    tenant: str = "t",
    lane: str = LANE,
    priority: int = 2,
    prompt_tokens: int = 100,
    max_tokens: int = 100,
    arrival: float = 0.0,
    deadline: float | None = None,
    predicted: int | None = None,
    true_output: int | None = None,
    streaming: bool = False,
    units: int = 1,
) -> Ticket:
    """A ticket for model ``m`` with id ``name``."""
    return Ticket(
        id=TicketId(name),
        model=MODEL,
        tenant=tenant,
        lane=lane,
        priority=priority,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        arrival=arrival,
        deadline=deadline,
        predicted_output_tokens=predicted,
        true_output_tokens=true_output,
        streaming=streaming,
        units=units,
    )


def build_entry(
    seq: int, service_s: float, *, tenant: str = "t", deadline: float = 100.0, priority: int = 2
) -> Entry:
    """A queue entry of ticket ``e<seq>`` (arrival ``seq``) predicted to take ``service_s``,
    for driving the queues directly."""
    ticket = build_ticket(
        f"e{seq}",
        tenant=tenant,
        priority=priority,
        prompt_tokens=10,
        max_tokens=10,
        arrival=float(seq),
    )
    return Entry(
        ticket=ticket,
        seq=seq,
        deadline=deadline,
        predicted_output_tokens=10,
        prefill_s=0.0,
        decode_s_per_token=service_s / 10,
        service_s=service_s,
        cost_tokens=20,
    )


def machine_settings(max_examples: int) -> settings:
    """How the core's hypothesis state machines run: ``max_examples`` runs of up to 40
    steps each, no deadline, slow examples allowed."""
    return settings(
        max_examples=max_examples,
        stateful_step_count=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


def admitted_ids(decisions: Sequence[Decision]) -> list[str]:
    """Ids of the tickets ``decisions`` admit, in order."""
    return [d.ticket.id for d in decisions if isinstance(d, Admit)]


@pytest.fixture(scope="session")
def make_lane() -> LaneFactory:
    """``build_lane``: a ``LaneSpec`` with test-friendly defaults."""
    return build_lane


@pytest.fixture(scope="session")
def make_spec() -> SpecFactory:
    """``build_spec``: a one-model ``SchedulerSpec``."""
    return build_spec


@pytest.fixture(scope="session")
def make_ticket() -> TicketFactory:
    """``build_ticket``: a ``Ticket`` for model ``m``."""
    return build_ticket


@pytest.fixture(scope="session")
def admitted() -> Callable[[Sequence[Decision]], list[str]]:
    """``admitted_ids``: ids of the admitted tickets in a decision list."""
    return admitted_ids
