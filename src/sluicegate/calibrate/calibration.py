"""One calibration run: find out what the engine is, probe it, fit, build the preset.

``calibrate`` ties the parts together; the capacity fields of the preset come from the
engine where it publishes them (``engine_facts.py``) and from the settings otherwise,
and a field neither gives is refused with the option that would give it.
"""

from __future__ import annotations

import datetime
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from sluicegate.calibrate.engine_client import ENGINE_KINDS
from sluicegate.calibrate.engine_facts import EngineFacts, detect_kind, read_facts
from sluicegate.calibrate.fit import Fit, fit_samples, group_errors
from sluicegate.calibrate.probe_plan import ProbePlan, plan_probes, request_count
from sluicegate.calibrate.probes import Measurements, ProbeRunner, run_probes
from sluicegate.engine.engine_config import COEFFICIENTS, EngineConfig
from sluicegate.errors import SluicegateError

LLAMA_SERVER_BATCH = 2048
"""llama-server's default ``-b`` (logical batch): the most tokens one of its steps takes."""
SMALLEST_BASE_S = 1e-7
"""``base_s`` when the fit finds none: ``EngineConfig`` needs every step to take time."""
SIGNIFICANT = 4


class CalibrationError(SluicegateError, ValueError):
    """A calibration that cannot run: a setting missing or out of range (named)."""


@dataclass(frozen=True, slots=True)
class CalibrationSettings:
    """What to calibrate and how (the options of ``sluicegate calibrate``).

    Attributes:
        url: the engine's base URL.
        model: the model name it serves.
        engine: ``auto`` or one of ``ENGINE_KINDS``.
        repeats: rounds of every probe (the medians are over them).
        slots: the engine's concurrent sequences; None: read from the engine.
        max_num_batched_tokens: its per-step token budget; None: read or its default.
        context_tokens: the most a request may hold (prompt + output); None: read from
            the engine (needed when ``url`` is a gateway, which publishes no engine facts).
        timeout_s: the longest one request may take.
    """

    url: str
    model: str
    engine: str = "auto"
    repeats: int = 3
    slots: int | None = None
    max_num_batched_tokens: int | None = None
    context_tokens: int | None = None
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.engine != "auto" and self.engine not in ENGINE_KINDS:
            raise CalibrationError(f"--engine must be auto or one of {list(ENGINE_KINDS)}")
        counts = {"--repeats": self.repeats, "--slots": self.slots,
                  "--max-num-batched-tokens": self.max_num_batched_tokens,
                  "--context": self.context_tokens}  # fmt: skip
        for option, value in counts.items():
            if value is not None and value < 1:
                raise CalibrationError(f"{option} must be at least 1, got {value}")


@dataclass(frozen=True, slots=True)
class Calibration:
    """A run's outcome: what the engine said, what was probed and measured, the fit,
    and the preset with its provenance."""

    facts: EngineFacts
    plan: ProbePlan
    measurements: Measurements
    fit: Fit
    config: EngineConfig
    provenance: dict[str, Any]


def _capacity(settings: CalibrationSettings, facts: EngineFacts) -> tuple[int, int, int, int]:
    """(slots, context per request, KV tokens, step budget), or the option to pass."""
    slots = settings.slots or facts.slots
    if slots is None:
        raise CalibrationError(f"--slots: {facts.kind} does not publish how many it runs at once")
    context = settings.context_tokens or facts.context_tokens
    if context is None:
        raise CalibrationError(
            f"--context: {facts.kind} at {settings.url} publishes no context length"
        )
    budget = settings.max_num_batched_tokens
    if budget is None and facts.kind == "llama-server":
        budget = LLAMA_SERVER_BATCH
    if budget is None:
        raise CalibrationError(
            f"--max-num-batched-tokens: {facts.kind} does not publish its step budget"
        )
    return slots, context, facts.kv_capacity_tokens or slots * context, budget


def _rounded(value: float) -> float:
    return float(f"{value:.{SIGNIFICANT}g}")


async def calibrate(
    settings: CalibrationSettings,
    started: Callable[[int], None],
    advance: Callable[[int], None],
) -> Calibration:
    """Probe the engine and fit its preset; ``started(total)`` once the number of requests
    is known, ``advance(n)`` as they finish.

    Raises:
        CalibrationError: a capacity neither the engine nor the settings give.
        EngineRequestError: the engine refused or broke a request.
        aiohttp.ClientError: the engine is unreachable.
    """
    begun = time.monotonic()
    url = settings.url.rstrip("/")
    timeout = aiohttp.ClientTimeout(total=settings.timeout_s)
    # A connection per request: llama-server's HTTP library closes an idle kept-alive one
    # under the pool, and the next request on it fails to send.
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        kind = settings.engine
        if kind == "auto":
            kind = await detect_kind(session, url)
        facts = await read_facts(session, url, kind, settings.model)
        slots, context, kv, budget = _capacity(settings, facts)
        plan = plan_probes(
            slots=slots, context_tokens=context, kv_capacity_tokens=kv, budget_tokens=budget
        )
        started(request_count(plan, settings.repeats) + 1 + plan.batch_sizes[-1])
        runner = ProbeRunner(session, url, settings.model, kind, advance)
        measurements = await run_probes(runner, plan, settings.repeats)
    tail_s = statistics.median(measurements.tails_s)
    fit = fit_samples(measurements.samples, fixed={"response_overhead_s": tail_s})
    coefficients = {name: _rounded(value) for name, value in fit.coefficients.items()}
    coefficients["base_s"] = max(coefficients["base_s"], SMALLEST_BASE_S)
    c = coefficients
    config = EngineConfig(
        max_num_seqs=slots, max_num_batched_tokens=budget, kv_capacity_tokens=kv,
        block_size=facts.block_size or 16, base_s=c["base_s"],
        per_prefill_token_s=c["per_prefill_token_s"], per_decode_seq_s=c["per_decode_seq_s"],
        per_kv_token_s=c["per_kv_token_s"], per_prefill_attn_s=c["per_prefill_attn_s"],
        request_overhead_s=c["request_overhead_s"], response_overhead_s=c["response_overhead_s"],
    )  # fmt: skip
    kept = config_coefficients(config)
    fit = Fit(kept, fit.samples, group_errors(fit.samples, kept))
    provenance = {
        "url": url, "model": settings.model, "engine": kind,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "repeats": settings.repeats, "server_timings": measurements.server_timings,
        "seconds": round(time.monotonic() - begun, 1),
        "capacity": {"slots": "flag" if settings.slots else "engine",
                     "max_num_batched_tokens": "flag" if settings.max_num_batched_tokens
                     else "llama-server's default -b"},
        "errors": {g.group: {"median": round(g.median, 4), "max": round(g.largest, 4)}
                   for g in fit.groups},
        "probes": [{"group": s.group, "probe": s.label, "measured_s": s.measured_s,
                    "fitted_s": s.predicted_s(kept), "count": s.count}
                   for s in fit.samples],
    }  # fmt: skip
    return Calibration(facts, plan, measurements, fit, config, provenance)


def config_coefficients(config: EngineConfig) -> dict[str, float]:
    """``config``'s timing coefficients by name."""
    return {name: float(getattr(config, name)) for name in COEFFICIENTS}
