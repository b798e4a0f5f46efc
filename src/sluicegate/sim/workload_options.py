"""Building the workload of ``sluicegate simulate`` from its command-line options."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sluicegate.config import Config, parse_config
from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.workloads import (
    MaxTokensPolicy,
    apply_mix,
    gamma_bursts,
    load_workload,
    parse_mix,
    poisson,
    scale_rate,
    window,
)
from sluicegate.sim.workloads.b2b import b2b, parse_b2b_workload
from sluicegate.sim.workloads.fields import load_mapped, parse_fields
from sluicegate.sim.workloads.prefix import parse_prefix_workload, shared_prefix
from sluicegate.sim.workloads.tenants import parse_tenant_load, tenant_loads

DEFAULT_CONFIG = """\
models:
  - name: default
simulation:
  preset: llama-3.1-8b-h100
  replicas: 1
"""
DEFAULT_LENGTHS_TRACE = Path("data/traces/AzureLLMInferenceTrace_conv.csv")
"""Where ``--tenant-load`` samples lengths without ``--trace`` (the shipped trace, from the
repository root)."""
DEFAULT_POLICIES = ("config",)
"""``simulate`` without ``--policy``: the config's own per-lane policies and fairness."""


@dataclass(frozen=True)
class WorkloadOptions:
    """Where requests come from and how they are reshaped."""

    trace: Path | None = None
    poisson_rate: float | None = None
    gamma: tuple[float, float] | None = None
    duration_s: float = 600.0
    window: tuple[float, float] | None = None
    rate_scale: float = 1.0
    mix: str | None = None
    seed: int = 0
    max_tokens: str = "exact"
    fields: tuple[str, ...] = ()
    prefix_workload: str | None = None
    tenant_loads: tuple[str, ...] = ()
    b2b_workload: str | None = None


def workload_options(
    *,
    trace: Path | None,
    poisson_rate: float | None,
    gamma: str | None,
    duration_s: float,
    window: str | None,
    rate_scale: float,
    mix: str | None,
    seed: int,
    max_tokens: str = "exact",
    fields: tuple[str, ...] = (),
    prefix_workload: str | None = None,
    tenant_load: tuple[str, ...] = (),
    b2b_workload: str | None = None,
) -> WorkloadOptions:
    """Options from the CLI's strings (``RATE:CV``, ``START:DURATION``), checked."""
    return WorkloadOptions(
        trace=trace,
        poisson_rate=poisson_rate,
        gamma=parse_pair(gamma, "--gamma") if gamma else None,
        duration_s=duration_s,
        window=parse_pair(window, "--window") if window else None,
        rate_scale=rate_scale,
        mix=mix,
        seed=seed,
        max_tokens=max_tokens,
        fields=fields,
        prefix_workload=prefix_workload,
        tenant_loads=tenant_load,
        b2b_workload=b2b_workload,
    )


def default_config() -> Config:
    """One model with the default lanes, the 8B preset, one replica."""
    return parse_config(DEFAULT_CONFIG, source="<built-in>", simulation=True)


def build_workload(options: WorkloadOptions) -> list[WorkloadRequest]:
    """The workload the options describe; ``ValueError`` with a clear message otherwise."""
    if options.tenant_loads:
        return _tenant_workload(options)
    sources = [
        options.trace is not None,
        options.poisson_rate is not None,
        options.gamma is not None,
        options.prefix_workload is not None,
        options.b2b_workload is not None,
    ]
    if sum(sources) != 1:
        raise ValueError(
            "give exactly one of --trace, --poisson RATE, --gamma RATE:CV, --prefix-workload"
            " or --b2b-workload"
        )
    if options.fields and options.trace is None:
        raise ValueError("--field applies only to --trace")
    cap = _max_tokens_policy(options.max_tokens)
    if options.trace is not None and options.fields:
        requests = load_mapped(options.trace, parse_fields(options.fields), max_tokens=cap)
    elif options.trace is not None:
        requests = load_workload(options.trace, max_tokens=cap)
    elif options.prefix_workload is not None:
        rate, count, blocks, zipf = parse_prefix_workload(options.prefix_workload)
        requests = shared_prefix(
            rate, options.duration_s, seed=options.seed, prompts=count, blocks=blocks, zipf=zipf
        )
    elif options.b2b_workload is not None:
        rate, customers, context, zipf, burst = parse_b2b_workload(options.b2b_workload)
        requests = b2b(
            rate, options.duration_s, seed=options.seed, customers=customers,
            context_tokens=context, zipf=zipf, burst=burst,
        )  # fmt: skip
    elif options.poisson_rate is not None:
        requests = poisson(options.poisson_rate, options.duration_s, seed=options.seed)
    else:
        assert options.gamma is not None
        rate, cv = options.gamma
        requests = gamma_bursts(rate, cv, options.duration_s, seed=options.seed)
    if options.window is not None:
        requests = window(requests, *options.window)
    if options.rate_scale != 1.0:
        requests = scale_rate(requests, options.rate_scale)
    if options.mix:
        requests = apply_mix(requests, parse_mix(options.mix), seed=options.seed)
    if not requests:
        raise ValueError("the workload is empty")
    return requests


def _tenant_workload(options: WorkloadOptions) -> list[WorkloadRequest]:
    """``--tenant-load``: per-tenant arrivals, lengths sampled from ``--trace`` (or the
    shipped conversation trace)."""
    others = [
        options.poisson_rate, options.gamma, options.prefix_workload, options.b2b_workload,
        options.window,
    ]  # fmt: skip
    if any(other is not None for other in others) or options.fields or options.mix:
        raise ValueError(
            "--tenant-load combines only with --trace (the lengths), --duration, --seed,"
            " --max-tokens and --rate-scale"
        )
    source = options.trace if options.trace is not None else DEFAULT_LENGTHS_TRACE
    if options.trace is None and not source.is_file():
        raise ValueError(f"--tenant-load samples lengths from --trace (default {source}: missing)")
    lengths = load_workload(source, max_tokens=_max_tokens_policy(options.max_tokens))
    loads = [parse_tenant_load(text) for text in options.tenant_loads]
    requests = tenant_loads(loads, lengths, options.duration_s, seed=options.seed)
    if options.rate_scale != 1.0:
        requests = scale_rate(requests, options.rate_scale)
    if not requests:
        raise ValueError("the workload is empty")
    return requests


def _max_tokens_policy(text: str) -> MaxTokensPolicy:
    if text in ("exact", "pow2"):
        return "exact" if text == "exact" else "pow2"
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise ValueError(f"--max-tokens must be exact, pow2 or a positive integer, got {text!r}")


def parse_pair(text: str, name: str) -> tuple[float, float]:
    """``A:B`` as two floats; ``ValueError`` naming the option otherwise."""
    try:
        first, second = (float(part) for part in text.split(":"))
    except ValueError:
        raise ValueError(f"{name} must look like A:B (two numbers), got {text!r}") from None
    return first, second
