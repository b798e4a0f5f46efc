"""``benchmarks/noisy_neighbour.py --smoke`` runs and prints its table (no bar is checked)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_prints_both_runs_of_each_setup() -> None:
    """Two set-ups (fifo, fair) × without and with bursts: four rows of finite figures, a
    ratio on each bursty row, and the command it ran."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "noisy_neighbour.py"), "--smoke"],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=240,
    )
    assert done.stdout.startswith("Command: `python benchmarks/noisy_neighbour.py --duration 120")
    rows = [line for line in done.stdout.splitlines() if line.startswith(("| fifo", "| fair"))]
    assert [row.split(" | ")[1] for row in rows] == ["no", "yes", "no", "yes"]
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        figures = [float(cell) for cell in cells[2:6]]
        assert all(math.isfinite(x) and x >= 0.0 for x in figures), row
        assert cells[6].endswith("%"), row
        assert cells[8].startswith("×") == (cells[1] == "yes"), row
