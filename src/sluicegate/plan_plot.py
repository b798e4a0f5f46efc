"""Presentation of a capacity plan: a rich table and a p99-wait-versus-utilization PNG."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from sluicegate.plan import PlanResult, allen_cunneen_wait

__all__ = ["plot_wait_vs_utilization", "render_plan", "wait_curve"]

_CURVE_POINTS = 160
_MAX_CURVE_RHO = 0.995


def _fmt_s(seconds: float) -> str:
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
