"""PNG plots of simulation runs: latency CDFs, p99 against offered load, queue depth over time.

Figures are drawn with ``matplotlib.figure.Figure`` and the Agg canvas
directly, never through ``pyplot``: no global figure state and no GUI backend,
so plotting is safe in servers and tests. PNGs carry no software or date
metadata, so identical inputs give identical files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from sluicegate.outcomes import RequestOutcome
from sluicegate.sim.result import SimResult
from sluicegate.sim.run_summary import Summary

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

_DPI = 100
_Loc = Literal["upper left", "upper right", "lower right"]
_METRICS: tuple[tuple[str, str], ...] = (
    ("queue wait", "queue_wait"),
    ("TTFT", "ttft"),
    ("end-to-end", "e2e"),
)


def _figure(width: float, height: float) -> Figure:
    """A new figure; matplotlib is imported on first use, so the simulator's worker
    processes, which only simulate, never import it."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))


def _save(figure: Figure, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    figure.savefig(path, format="png", dpi=_DPI, metadata={"Software": None})
    return path


def _latency(rec: RequestOutcome, metric: str) -> float | None:
    if metric == "queue_wait":
        return rec.queue_wait_s
    return rec.ttft_s if metric == "ttft" else rec.e2e_s


def _legend(ax: Axes, loc: _Loc) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc=loc)


def _cdf(ax: Axes, values: Sequence[float], label: str) -> None:
    xs = np.sort(np.asarray(values, dtype=np.float64))
    ys = np.arange(1, len(xs) + 1) / len(xs)
    ax.step(xs, ys, where="post", label=label)


def plot_latency_cdfs(results: Mapping[str, SimResult], out_dir: Path) -> list[Path]:
    """One PNG per lane, ``latency-cdf-<lane>.png``: CDFs of queue wait, TTFT and e2e.

    Args:
        results: policy label → its run (all on the same workload).
        out_dir: where to write.

    Returns:
        The files written, in lane order; lanes no request used are skipped.
    """
    lanes = list(dict.fromkeys(lane for r in results.values() for lane in r.policies))
    paths = []
    for lane in lanes:
        by_policy = {
            label: [rec for rec in r.records if rec.lane == lane] for label, r in results.items()
        }
        if not any(by_policy.values()):
            continue
        figure = _figure(13, 4)
        axes = figure.subplots(1, len(_METRICS))
        for ax, (title, metric) in zip(axes, _METRICS, strict=True):
            for label, records in by_policy.items():
                values = [v for rec in records if (v := _latency(rec, metric)) is not None]
                if values:
                    _cdf(ax, values, label)
            ax.set_title(f"{title} — lane {lane}")
            ax.set_xlabel("seconds")
            ax.set_ylabel("fraction of requests")
            ax.set_ylim(0.0, 1.0)
            ax.grid(alpha=0.3)
        _legend(axes[0], "lower right")
        figure.tight_layout()
        paths.append(_save(figure, out_dir / f"latency-cdf-{lane}.png"))
    return paths


def plot_p99_vs_load(sweep: Mapping[str, Sequence[Summary]], path: Path) -> Path:
    """p99 end-to-end latency against load, one panel per lane, one line per policy.

    The x axis is load ρ (offered ÷ capacity) when every run has a capacity,
    else offered requests/s. The knee of each curve is the cliff near ρ = 1:
    past it, waiting time grows without bound.

    Args:
        sweep: policy label → its summaries at increasing rate multipliers.
        path: the PNG to write.
    """
    lanes = list(dict.fromkeys(lane for runs in sweep.values() for s in runs for lane in s.lanes))
    lanes = [
        lane
        for lane in lanes
        if any(s.lanes[lane].requests for runs in sweep.values() for s in runs if lane in s.lanes)
    ]
    by_load = all(s.load is not None for runs in sweep.values() for s in runs)
    figure = _figure(5 * max(1, len(lanes)), 4)
    axes = figure.subplots(1, max(1, len(lanes)), squeeze=False)[0]
    for ax, lane in zip(axes, lanes, strict=False):
        values: list[float] = []
        for label, runs in sweep.items():
            points = sorted(
                (_load_axis(s, by_load), p99)
                for s in runs
                if lane in s.lanes and (p99 := s.lanes[lane].e2e.p99) is not None and p99 > 0
            )
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o", label=label)
                values.extend(ys)
        # Past the cliff p99 grows by orders of magnitude; only then is a log axis clearer.
        log = bool(values) and max(values) > 10 * min(values)
        if log:
            ax.set_yscale("log")
        ax.set_title(f"p99 end-to-end — lane {lane}")
        ax.set_xlabel("load ρ = offered ÷ capacity" if by_load else "offered load (requests/s)")
        ax.set_ylabel("seconds (log scale)" if log else "seconds")
        ax.grid(alpha=0.3, which="both")
        _legend(ax, "upper left")
    figure.tight_layout()
    return _save(figure, path)


def _load_axis(summary: Summary, by_load: bool) -> float:
    load = summary.load
    return load if by_load and load is not None else summary.offered_rps


def plot_queue_depth(results: Mapping[str, SimResult], path: Path) -> Path:
    """Scheduler queue depth over time, one panel per lane, one line per policy.

    Args:
        results: policy label → its run.
        path: the PNG to write.
    """
    lanes = list(dict.fromkeys(lane for r in results.values() for lane in r.samples.queued))
    lanes = [
        lane for lane in lanes if any(any(r.samples.queued.get(lane, ())) for r in results.values())
    ] or lanes[:1]
    figure = _figure(12, 2.8 * max(1, len(lanes)))
    axes = figure.subplots(max(1, len(lanes)), 1, squeeze=False)[:, 0]
    for ax, lane in zip(axes, lanes, strict=False):
        for label, r in results.items():
            depth = r.samples.queued.get(lane, ())
            if depth:
                ax.plot(r.samples.times, depth, label=label, linewidth=0.8)
        ax.set_title(f"queued requests — lane {lane}")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("queued")
        ax.grid(alpha=0.3)
        _legend(ax, "upper right")
    figure.tight_layout()
    return _save(figure, path)
