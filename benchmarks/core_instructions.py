"""Instructions per ticket of the core benchmark's steady state, counted by callgrind.

Wall-clock medians of ``bench_core.py`` vary by ±30% between identical runs on a
shared VM; instruction counts do not. For each policy, runs ``bench_core.run_once``
(10,000 queued, 64 running, 100 tenants) under ``valgrind --tool=callgrind`` with
200 and 2,200 iterations and prints the difference ÷ 2,000. ``--src`` picks the
tree whose ``src/`` is measured (e.g. a ``git worktree`` of an older commit).

    python benchmarks/core_instructions.py [--src DIR] [--policy fifo --policy slack ...]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import sys
sys.path[:0] = [{src!r}, {bench!r}]
import bench_core
bench_core.run_once({policy!r}, queued=10000, running=64, iterations={n}, tenants=100, seed=1)
"""


def instructions(src: Path, policy: str, iterations: int) -> int:
    """Instructions callgrind counts for one run of ``iterations`` tickets (setup included)."""
    code = CHILD.format(src=str(src / "src"), bench=str(ROOT / "benchmarks"), policy=policy,
                        n=iterations)  # fmt: skip
    run = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
         "-c", code],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    found = re.search(r"Collected : (\d+)", run.stderr)
    if found is None:
        raise SystemExit(f"callgrind printed no count:\n{run.stderr[-2000:]}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    """Print instructions per ticket for each policy."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--src", type=Path, default=ROOT, help="tree whose src/ is measured")
    parser.add_argument("--policy", action="append", default=None)
    args = parser.parse_args(argv)
    for policy in args.policy or ["fifo", "slack", "fair"]:
        per_ticket = instructions(args.src, policy, 2200) - instructions(args.src, policy, 200)
        print(f"{policy}: {per_ticket // 2000:,} instructions per ticket")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
