"""A model's global counts with its running tickets per tenant: ``counts.lua``'s arguments
and answer (``RedisStore.counts``).

The per-tenant counts come from the live replicas' leases (each lease's lane and tenant,
the first two fields of its msgpack tuple), so reading them costs Redis O(running tickets)
of the model: they are read for the operator (``/admin/state``, ``/metrics``), never per
request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sluicegate.store.types import GlobalCounts, ModelLimits


@dataclass(frozen=True, slots=True)
class ModelCounts(GlobalCounts):
    """``GlobalCounts`` with the running tickets per tenant.

    Attributes:
        tenants_running: running tickets per (tenant, lane), summed over the live
            replicas' leases; a ticket counts once whatever its ``n``. Only pairs with
            running tickets are listed.
    """

    tenants_running: dict[tuple[str, str], int] = field(default_factory=dict)


def counts_args(limits: ModelLimits) -> list[str | int | float]:
    """``counts.lua``'s arguments: the lanes whose waiting tickets it counts."""
    args: list[str | int | float] = [len(limits.lanes)]
    for lane in limits.lanes:
        args += [lane.name, int(lane.fair)]
    return args


def parse_counts(limits: ModelLimits, reply: list[Any]) -> ModelCounts:
    """``counts.lua``'s answer. Every lane of ``limits`` is listed (0 when idle), and so is
    any other lane with running tickets; ``waiting`` counts the lanes of ``limits``."""
    lanes_running = dict.fromkeys((lane.name for lane in limits.lanes), 0)
    lanes_waiting = dict(lanes_running)
    for pairs, target in ((reply[4], lanes_running), (reply[5], lanes_waiting)):
        for index in range(0, len(pairs), 2):
            target[str(pairs[index])] = int(pairs[index + 1])
    triples = reply[6]
    tenants = {
        (str(triples[i]), str(triples[i + 1])): int(triples[i + 2])
        for i in range(0, len(triples), 3)
    }
    return ModelCounts(
        running=int(reply[0]),
        inflight_tokens=int(reply[1]),
        waiting=int(reply[2]),
        replicas=int(reply[3]),
        lanes_running=lanes_running,
        lanes_waiting=lanes_waiting,
        tenants_running=tenants,
    )
