"""Per-tenant loads: Poisson arrivals per tenant, optional periodic bursts, trace lengths.

``sluicegate simulate --tenant-load SPEC`` (repeatable) builds one stream per
tenant. A spec is ``TENANT:RATE`` followed by optional ``:key=value`` parts:

* ``burst=KxDs/Ps[@Os]``: for ``D`` seconds of every ``P`` seconds, starting at
  ``O`` [0] within each period, the tenant's rate is ``K × RATE`` (``K`` > 1:
  the total rate during a burst, not an extra on top of it);
* ``lane=NAME``: the lane its requests go to [``interactive``, as ``--poisson``];
* ``priority=N``: 0–5 [2].

Example: ``quiet:3`` and ``noisy:3:burst=10x20s/200s`` give two tenants at
3 req/s, the second at 30 req/s for the first 20 s of every 200 s.

Prompt and output lengths are drawn, as pairs and with replacement, from a
trace's requests (the rows of ``--trace``; the shipped Azure conversation trace
by default), so the lengths keep their joint distribution. Tenant ``i`` (in the
order given) uses the numpy streams of ``SeedSequence([seed, i])``: one for
arrivals, one for lengths, so the same seed gives the same workload and adding a
tenant at the end leaves the others unchanged.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.workloads.synthetic import merge

__all__ = ["Burst", "TenantLoad", "parse_tenant_load", "tenant_loads"]

_BURST = re.compile(r"^(?P<k>[0-9.]+)x(?P<d>[0-9.]+)s/(?P<p>[0-9.]+)s(?:@(?P<o>[0-9.]+)s)?$")
_Floats = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Burst:
    """Periodic bursts: the rate is ``factor ×`` the base for ``duration_s`` of every
    ``period_s``, starting ``offset_s`` into each period."""

    factor: float
    duration_s: float
    period_s: float
    offset_s: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.factor) and self.factor > 1.0):
            raise ValueError(f"burst factor must be a finite number > 1, got {self.factor!r}")
        if not (self.duration_s > 0.0 and math.isfinite(self.period_s)):
            raise ValueError(f"burst duration must be > 0, got {self.duration_s!r}")
        if not (self.offset_s >= 0.0 and self.offset_s + self.duration_s <= self.period_s):
            raise ValueError(
                f"a burst ({self.offset_s:g}s + {self.duration_s:g}s) must fit its period"
                f" ({self.period_s:g}s)"
            )


@dataclass(frozen=True, slots=True)
class TenantLoad:
    """One tenant's arrivals: Poisson at ``rate_per_s``, with optional ``burst``."""

    tenant: str
    rate_per_s: float
    burst: Burst | None = None
    lane: str = "interactive"
    priority: int = 2

    def __post_init__(self) -> None:
        if not self.tenant or not self.lane:
            raise ValueError("tenant and lane must be non-empty")
        if not (math.isfinite(self.rate_per_s) and self.rate_per_s > 0.0):
            raise ValueError(f"rate must be a finite number > 0, got {self.rate_per_s!r}")
        if not 0 <= self.priority <= 5:
            raise ValueError(f"priority must be in [0, 5], got {self.priority}")


def parse_tenant_load(text: str) -> TenantLoad:
    """``TENANT:RATE[:burst=KxDs/Ps[@Os]][:lane=NAME][:priority=N]``; ``ValueError`` if not."""
    usage = "--tenant-load must look like TENANT:RATE[:burst=KxDs/Ps][:lane=NAME][:priority=N]"
    parts = text.split(":")
    if len(parts) < 2:
        raise ValueError(f"{usage}, got {text!r}")
    try:
        rate = float(parts[1])
    except ValueError:
        raise ValueError(f"{usage}, got {text!r} (RATE is not a number)") from None
    options: dict[str, str] = {}
    for part in parts[2:]:
        key, sep, value = part.partition("=")
        if not sep or key not in ("burst", "lane", "priority") or key in options:
            raise ValueError(f"{usage}, got {text!r} (bad or repeated option {part!r})")
        options[key] = value
    burst = None
    if "burst" in options:
        match = _BURST.match(options["burst"])
        if match is None:
            raise ValueError(f"burst must look like 10x20s/200s or 10x20s/200s@100s, got {text!r}")
        try:
            k, d, p = (float(match[g]) for g in "kdp")
            offset = float(match["o"]) if match["o"] else 0.0
        except ValueError:
            raise ValueError(f"burst numbers are not numbers in {text!r}") from None
        burst = Burst(k, d, p, offset)
    priority = options.get("priority", "2")
    if not priority.isdigit():
        raise ValueError(f"priority must be an integer 0-5, got {text!r}")
    return TenantLoad(parts[0], rate, burst, options.get("lane", "interactive"), int(priority))


def tenant_loads(
    loads: Sequence[TenantLoad],
    lengths: Sequence[WorkloadRequest],
    duration_s: float,
    *,
    seed: int,
) -> list[WorkloadRequest]:
    """The merged workload of ``loads`` over ``[0, duration_s)``, sorted by arrival.

    Each request's ``prompt_tokens``, ``output_tokens`` and ``max_tokens`` are
    those of a request of ``lengths`` drawn uniformly with replacement.
    """
    if not (math.isfinite(duration_s) and duration_s > 0.0):
        raise ValueError(f"duration must be a finite number > 0, got {duration_s!r}")
    if not loads:
        raise ValueError("no tenant loads given")
    if not lengths:
        raise ValueError("the length source has no requests")
    names = [load.tenant for load in loads]
    if len(set(names)) != len(names):
        raise ValueError(f"each tenant may have one --tenant-load, got {names}")
    streams = []
    for index, load in enumerate(loads):
        arrivals_seq, lengths_seq = np.random.SeedSequence([seed, index]).spawn(2)
        times = _arrivals(load, duration_s, np.random.default_rng(arrivals_seq))
        picks = np.random.default_rng(lengths_seq).integers(0, len(lengths), len(times))
        streams.append(
            [
                WorkloadRequest(
                    arrival,
                    lengths[pick].prompt_tokens,
                    lengths[pick].output_tokens,
                    lengths[pick].max_tokens,
                    tenant=load.tenant,
                    lane=load.lane,
                    priority=load.priority,
                )
                for arrival, pick in zip(times.tolist(), picks.tolist(), strict=True)
            ]
        )
    return merge(*streams)


def _poisson(rng: np.random.Generator, rate: float, span: float) -> _Floats:
    """Sorted Poisson points in ``[0, span)``: a Poisson count, then uniform positions."""
    count = int(rng.poisson(rate * span))
    return np.sort(rng.uniform(0.0, span, count))


def _arrivals(load: TenantLoad, duration_s: float, rng: np.random.Generator) -> _Floats:
    """Base Poisson arrivals plus, inside burst windows, ``(factor − 1) × rate`` more."""
    base = _poisson(rng, load.rate_per_s, duration_s)
    burst = load.burst
    if burst is None:
        return base
    periods = math.ceil(duration_s / burst.period_s)
    extra = _poisson(rng, (burst.factor - 1.0) * load.rate_per_s, periods * burst.duration_s)
    # Fold the concatenated burst time onto the windows [k·P + O, k·P + O + D).
    window = np.floor(extra / burst.duration_s)
    times = window * burst.period_s + burst.offset_s + np.mod(extra, burst.duration_s)
    return np.sort(np.concatenate([base, times[times < duration_s]]))
