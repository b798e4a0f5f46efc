"""Workloads for the simulator: trace loaders, synthetic generators, mixes and transforms.

Everything produces a ``list[WorkloadRequest]`` sorted by ``arrival_s``; functions
are pure, and random ones are deterministic for a seed.

* :mod:`~sluicegate.sim.workloads.traces`: Azure / BurstGPT CSV files, format detection;
  :mod:`~sluicegate.sim.workloads.jsonl`: our JSONL; ``errors``: ``WorkloadError``.
* :mod:`~sluicegate.sim.workloads.synthetic`: Poisson, gamma bursts, on/off tenants.
* :mod:`~sluicegate.sim.workloads.mix`: assign tenant/lane/priority by share.
* :mod:`~sluicegate.sim.workloads.tenants`: per-tenant Poisson loads with periodic bursts,
  lengths sampled from a trace (``--tenant-load``).
* :mod:`~sluicegate.sim.workloads.transform`: rate scaling, windows, max_tokens caps.
"""

from __future__ import annotations

from sluicegate.sim.workloads.jsonl import load_jsonl, write_jsonl
from sluicegate.sim.workloads.mix import SHARE_TOLERANCE, MixEntry, MixError, apply_mix, parse_mix
from sluicegate.sim.workloads.synthetic import (
    DEFAULT_OUTPUT,
    DEFAULT_PROMPT,
    LengthDist,
    gamma_bursts,
    merge,
    on_off,
    poisson,
)
from sluicegate.sim.workloads.tenants import (
    Burst,
    TenantLoad,
    parse_tenant_load,
    tenant_loads,
)
from sluicegate.sim.workloads.traces import load_azure_csv, load_burstgpt_csv, load_workload
from sluicegate.sim.workloads.transform import (
    MaxTokensPolicy,
    check_max_tokens_policy,
    head,
    resolve_max_tokens,
    scale_rate,
    shift,
    window,
)
from sluicegate.sim.workloads.workload_errors import WorkloadError

__all__ = [
    "DEFAULT_OUTPUT",
    "DEFAULT_PROMPT",
    "SHARE_TOLERANCE",
    "Burst",
    "LengthDist",
    "MaxTokensPolicy",
    "MixEntry",
    "MixError",
    "TenantLoad",
    "WorkloadError",
    "apply_mix",
    "check_max_tokens_policy",
    "gamma_bursts",
    "head",
    "load_azure_csv",
    "load_burstgpt_csv",
    "load_jsonl",
    "load_workload",
    "merge",
    "on_off",
    "parse_mix",
    "parse_tenant_load",
    "poisson",
    "resolve_max_tokens",
    "scale_rate",
    "shift",
    "tenant_loads",
    "window",
    "write_jsonl",
]
