"""The tables every benchmark script prints and writes: a ``Grid`` (title, headers, rows),
rendered as a rich table on the console and as Markdown for ``docs/BENCHMARKS.md``, the
bars table, and the cell formats they share."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from rich.console import Console
from rich.table import Table

Grid = tuple[str, list[str], list[list[str]]]
"""A titled table: (title, headers, rows), rendered to the console and to Markdown."""

BAR_HEADERS = ["bar", "measured", "limit", "meets", "margin"]


def cells(text: str) -> list[str]:
    """Split a ``|``-separated row into its cells."""
    return text.split("|")


def render(console: Console, grid: Grid) -> None:
    """Print a grid as a rich table."""
    title, headers, rows = grid
    table = Table(title=title)
    for i, header in enumerate(headers):
        table.add_column(header, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)


def markdown(grid: Grid) -> list[str]:
    """A grid as a Markdown table under a bold title."""
    title, headers, rows = grid
    align = ["---"] + ["---:"] * (len(headers) - 1)
    lines = [f"**{title}**", "", "| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows] + [""]


def percentile_ms(values_s: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of ``values_s`` (seconds) in milliseconds; NaN if empty."""
    if not values_s:
        return math.nan
    return float(np.percentile(np.asarray(values_s, dtype=np.float64), q)) * 1000.0


def ms(value: float, digits: int = 1) -> str:
    """A millisecond figure for a table, ``—`` for NaN."""
    return "—" if math.isnan(value) else f"{value:.{digits}f}"


def us(value: float) -> str:
    """A microsecond figure for a table, whole, ``—`` for NaN."""
    return "—" if math.isnan(value) else f"{value:.0f}"


def pct(share: float) -> str:
    """A share (0.42) as a whole percentage for a table (``42%``), ``—`` for NaN."""
    return "—" if math.isnan(share) else f"{share * 100:.0f}%"


def bar_row(
    label: str, value: float, limit: float, unit: str, *, upper: bool, digits: int = 2
) -> list[str]:
    """One row of a bars table: measured, limit, whether it holds and by what margin."""
    bound = f"{'≤' if upper else '≥'} {limit:g} {unit}".rstrip()
    if math.isnan(value):
        return [label, "—", bound, "NO", "not measured"]
    ok = value <= limit if upper else value >= limit
    word = "holds with" if ok else "FAILS by"
    return [
        label,
        f"{value:.{digits}f} {unit}".rstrip(),
        bound,
        "yes" if ok else "NO",
        f"{word} {abs(limit - value):.{digits}f} {unit}".rstrip(),
    ]


def bars_grid(rows: list[list[str]], title: str) -> Grid:
    """A bars table from ``bar_row`` rows."""
    return title, BAR_HEADERS, rows
