"""``pool_width``: enough workers that the last round of runs fills the cores."""

from __future__ import annotations

import pytest

from sluicegate.sim.comparison import pool_width


@pytest.mark.parametrize(
    ("jobs", "cpus", "width"),
    [(1, 2, 1), (2, 2, 2), (3, 2, 3), (4, 2, 2), (5, 2, 3), (10, 2, 2), (11, 2, 3), (5, 8, 5)],
)
def test_pool_width_is_the_fewest_workers_for_the_fewest_full_rounds(
    jobs: int, cpus: int, width: int
) -> None:
    """⌈jobs / ⌊jobs / cpus⌋⌉ workers, or one per run when the runs are no more than the
    cores: 5 runs on 2 cores take 3 workers (rounds of 3 and 2 runs keep both cores busy)."""
    assert pool_width(jobs, cpus) == width
