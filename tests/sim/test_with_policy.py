"""``simulate --policy NAME`` (sim/comparison.py ``with_policy``): every lane of the model runs
NAME as a config naming only that policy would."""

from __future__ import annotations

import pytest

from sluicegate.core.spec import LaneSpec, ModelSpec, SchedulerSpec
from sluicegate.sim.comparison import with_policy

MODEL = "m"


def _spec() -> SchedulerSpec:
    lanes = (
        LaneSpec(name="a", max_concurrency=4, policy="fifo", fairness="none"),
        LaneSpec(name="b", max_concurrency=4, policy="slack", fairness="vtc"),
        LaneSpec(name="c", max_concurrency=4, policy="fair"),
    )
    return SchedulerSpec(models=(ModelSpec(name=MODEL, max_concurrency=8, lanes=lanes),))


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("fair", ("slack", "vtc")), ("fifo", ("fifo", "none")), ("sjf", ("sjf", "none"))],
)
def test_every_lane_takes_the_policy_and_its_own_fairness(
    policy: str, expected: tuple[str, str]
) -> None:
    """``fair`` gives slack + vtc on every lane, even one configured ``fairness: none``;
    any other name gives that ordering with no fairness, even on a ``vtc`` lane."""
    (model,) = with_policy(_spec(), MODEL, policy).models
    assert [lane.queue_policy for lane in model.lanes] == [expected] * 3
