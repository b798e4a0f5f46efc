"""The demo's picture: latency CDFs per lane, pass-through against sluicegate."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from sluicegate.bench.records import RequestRecord

COLORS = {"pass-through": "tab:red", "sluicegate": "tab:blue"}


def plot_demo(results: Mapping[str, Sequence[RequestRecord]], path: Path) -> Path:
    """Interactive TTFT and batch end-to-end CDFs for each phase; rejections in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    panels = (("interactive", "time to first token (s)"), ("batch", "end-to-end latency (s)"))
    for ax, (lane, label) in zip(axes, panels, strict=True):
        for name, records in results.items():
            rows = [r for r in records if r.lane == lane]
            ok = [r for r in rows if r.ok]
            values = np.sort(
                [r.ttft_s if lane == "interactive" else r.e2e_s for r in ok], kind="stable"
            )
            values = values[~np.isnan(values.astype(float))] if values.size else values
            rejected = sum(r.status in (429, 503) for r in rows)
            if values.size:
                ax.step(
                    values, np.arange(1, values.size + 1) / len(rows), where="post",
                    color=COLORS.get(name), label=f"{name} ({rejected} rejected with retry)",
                )  # fmt: skip
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{lane} lane")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle("Same overload, two front ends: pass-through vs sluicegate")
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path
