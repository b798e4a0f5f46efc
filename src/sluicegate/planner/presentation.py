"""Presentation of a capacity plan: rich tables (capacity, warm buffer, KEDA) and a PNG."""

from __future__ import annotations

import math
from pathlib import Path

from rich.console import Group
from rich.table import Table

from sluicegate.planner.keda import KedaPlan
from sluicegate.planner.queueing import PlanResult, allen_cunneen_wait
from sluicegate.planner.warm_buffer import (
    BURST_ASSUMPTIONS,
    RULE_OF_THUMB_ACTIVE,
    RULE_OF_THUMB_IDLE,
    WarmPlan,
)

__all__ = ["plot_wait_vs_utilization", "render_keda", "render_plan", "render_warm", "wait_curve"]

_CURVE_POINTS = 160
_MAX_CURVE_RHO = 0.995


def _fmt_s(seconds: float) -> str:
    if seconds == math.inf:
        return "∞"
    if seconds < 1.0:
        return f"{seconds * 1000.0:.1f} ms"
    return f"{seconds:.3f} s"


def render_plan(result: PlanResult) -> Table:
    """Render the operating point as a rich table: G/G/c next to M/M/c, then recommendations.

    Args:
        result: The plan to show.
    """
    inp = result.input
    table = Table(
        title=(
            f"Capacity plan: λ={inp.arrival_rate:g} req/s, E[S]={inp.mean_service_s:g} s, "
            f"c_s={inp.cv_service:g}, c_a={inp.cv_arrival:g}, "
            f"{inp.slots_per_replica} slots/replica, p99 wait SLO {_fmt_s(inp.p99_wait_slo_s)}"
        ),
        caption=result.assumptions,
    )
    table.add_column("quantity")
    table.add_column("G/G/c (Allen–Cunneen)", justify="right")
    table.add_column("M/M/c", justify="right")
    gg, mm = result.gg, result.mm
    table.add_row("replicas", str(result.replicas), str(result.replicas), style="bold")
    table.add_row("slots c", str(result.servers), str(result.servers))
    table.add_row("utilization ρ", f"{gg.utilization:.1%}", f"{mm.utilization:.1%}")
    table.add_row("P(wait)", f"{gg.p_wait:.4f}", f"{mm.p_wait:.4f}")
    table.add_row("mean wait", _fmt_s(gg.mean_wait_s), _fmt_s(mm.mean_wait_s))
    table.add_row("p99 wait", _fmt_s(gg.p99_wait_s), _fmt_s(mm.p99_wait_s))
    table.add_row("mean queue length", f"{gg.mean_queue_len:.2f}", f"{mm.mean_queue_len:.2f}")
    table.add_section()
    table.add_row("replicas just to keep up (ρ<1)", str(result.stable_replicas), "")
    table.add_row("recommended max_queue", str(result.max_queue), "", style="bold")
    table.add_row("recommended queue_timeout", _fmt_s(result.queue_timeout_s), "", style="bold")
    table.add_row("share cut by that timeout", f"{result.timeout_drop_fraction:.2e}", "")
    return table


def render_warm(warm: WarmPlan) -> Group:
    """Render the warm-buffer plan: the burst p99 at a few warm counts, then the choice.

    Args:
        warm: The warm-buffer plan.
    """
    burst = warm.burst
    slo = warm.capacity.input.p99_wait_slo_s
    rows = Table(
        title=(
            f"Warm buffer: rate ×{burst.factor:g} for {burst.window_s:g} s (detect "
            f"{burst.detect_s:g} s + scale-up {burst.scale_up_s:g} s), p99 SLO {_fmt_s(slo)}"
        ),
    )
    for column in ("warm", "replicas up", "burst ρ", "p99 wait", "from", "meets SLO"):
        rows.add_column(column, justify="left" if column in ("warm", "from") else "right")
    base = warm.base_replicas
    for row in warm.rows:
        extra = row.replicas - base
        labels = []
        if extra == warm.warm:
            labels.append("plan")
        if extra == warm.rule_of_thumb_warm:
            labels.append(f"{RULE_OF_THUMB_IDLE} per {RULE_OF_THUMB_ACTIVE}")
        rows.add_row(
            f"{extra}" + (f" ({', '.join(labels)})" if labels else ""),
            str(row.replicas),
            f"{row.utilization:.1%}",
            _fmt_s(row.p99_wait_s),
            row.basis,
            "yes" if row.p99_wait_s <= slo else "no",
            style="bold" if extra == warm.warm else None,
        )
    summary = Table(caption=BURST_ASSUMPTIONS)
    summary.add_column("warm buffer")
    summary.add_column("replicas", justify="right")
    summary.add_row("recommended warm", str(warm.warm), style="bold")
    summary.add_row("keep up: base + warm", str(warm.min_replicas), style="bold")
    summary.add_row(
        f"rule of thumb, {RULE_OF_THUMB_IDLE} idle per {RULE_OF_THUMB_ACTIVE} active "
        f"(absorbs up to ×{warm.rule_of_thumb_max_factor:.3g})",
        str(warm.rule_of_thumb_warm),
    )
    burst_replicas = "> max_replicas" if warm.burst_replicas is None else warm.burst_replicas
    summary.add_row("meet the SLO at the burst rate for good", str(burst_replicas))
    return Group(rows, summary)


def _fmt_depth(requests: float) -> str:
    return "< 0.01" if requests < 0.01 else f"{requests:.2f}"


def render_keda(keda: KedaPlan) -> Table:
    """Render the KEDA thresholds and replica bounds as a rich table.

    Args:
        keda: The KEDA plan.
    """
    table = Table(title=f"KEDA ScaledObject for model {keda.model}", caption=keda.note or None)
    table.add_column("setting")
    table.add_column("value", justify="right")
    table.add_column("why")
    quantile = f"p{keda.wait_quantile * 100:g}"
    table.add_row(
        f"queue-wait {quantile} threshold (Value)",
        _fmt_s(keda.wait_threshold_s),
        f"the {quantile} when {keda.min_replicas} replicas reach the p99 SLO "
        f"(at {keda.saturation_rate:.3g} req/s)",
    )
    table.add_row(
        "queue-depth target (AverageValue)",
        f"{keda.depth_per_replica}/replica",
        f"waiting requests that take the threshold to drain (mean at plan "
        f"{_fmt_depth(keda.mean_depth_per_replica)})",
    )
    table.add_row(
        "activationThreshold",
        "0",
        "one waiting request wakes the model"
        if keda.scale_to_zero
        else "unused: minReplicaCount > 0 keeps the model awake",
    )
    table.add_row("minReplicaCount", str(keda.min_replicas), "base + warm buffer")
    table.add_row("maxReplicaCount", str(keda.max_replicas), "meets the SLO at the burst rate")
    if keda.scale_to_zero:
        table.add_row(
            "idleReplicaCount",
            "0",
            f"from zero the first request waits about {keda.cold_start_s:g} s: set the "
            "lanes' queue_timeout_s above it and wait_for_backends: true, else 503",
        )
    return table


def wait_curve(result: PlanResult, points: int = _CURVE_POINTS) -> tuple[list[float], list[float]]:
    """Allen–Cunneen p99 wait against utilization at the plan's server count.

    The servers, service-time distribution and arrival variability are held at
    the plan's values while the arrival rate sweeps ``λ = ρ·c·μ`` for ρ evenly
    spaced in (0, 0.995].

    Args:
        result: The plan whose server count is used.
        points: Number of utilization values, >= 2.

    Returns:
        Utilizations and the matching p99 queue waits in seconds.
    """
    if points < 2:
        raise ValueError(f"points must be >= 2, got {points!r}")
    inp = result.input
    c = result.servers
    rhos = [_MAX_CURVE_RHO * (i + 1) / points for i in range(points)]
    waits = [
        allen_cunneen_wait(
            rho * c / inp.mean_service_s, inp.mean_service_s, inp.cv_arrival, inp.cv_service, c
        ).p99_wait_s
        for rho in rhos
    ]
    return rhos, waits


def plot_wait_vs_utilization(result: PlanResult, path: str | Path) -> Path:
    """Write a PNG of p99 queue wait against utilization for the chosen replica count.

    Shows the Allen–Cunneen curve (the utilization cliff), the SLO as a
    horizontal line and the planned operating point as a marker.

    Args:
        result: The plan to draw.
        path: Where to write the PNG; parent directories must exist.

    Returns:
        The path written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(path)
    inp = result.input
    rhos, waits = wait_curve(result)
    fig, ax = plt.subplots(figsize=(7.0, 4.5), dpi=110)
    try:
        ax.plot(rhos, waits, label=f"p99 wait, G/G/{result.servers} (Allen–Cunneen)")
        ax.axhline(inp.p99_wait_slo_s, color="tab:red", linestyle="--", label="p99 wait SLO")
        ax.plot(
            [result.gg.utilization],
            [result.gg.p99_wait_s],
            marker="o",
            color="black",
            linestyle="none",
            label=f"plan: {result.replicas} replicas, ρ={result.gg.utilization:.1%}",
        )
        ax.set_xlim(0.0, 1.0)
        ax.set_ylim(0.0, 3.0 * inp.p99_wait_slo_s)
        ax.set_xlabel("utilization ρ = λ / (c·μ)")
        ax.set_ylabel("p99 queue wait (s)")
        ax.set_title(
            f"{result.replicas} replicas × {inp.slots_per_replica} slots, "
            f"E[S]={inp.mean_service_s:g} s, c_s={inp.cv_service:g}, c_a={inp.cv_arrival:g}"
        )
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left")
        fig.tight_layout()
        fig.savefig(out, format="png")
    finally:
        plt.close(fig)
    return out
