"""The distributed tests' own arithmetic (no processes): percentiles and window endpoints."""

from __future__ import annotations

import itertools
import math

from hypothesis import given
from hypothesis import strategies as st

from tests.distributed.cluster import ClusterSpec, ModelSetup, gateway_config
from tests.distributed.load import percentile, quiet_moment

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@given(st.lists(finite, min_size=1, max_size=200), st.floats(min_value=0.01, max_value=1.0))
def test_percentile_is_the_nearest_rank(values: list[float], q: float) -> None:
    """The result is one of the values, with at least ⌈q·n⌉ values at or below it and
    fewer than ⌈q·n⌉ strictly below it."""
    result = percentile(values, q)
    rank = max(1, math.ceil(q * len(values)))
    assert result in values
    assert sum(v <= result for v in values) >= rank
    assert sum(v < result for v in values) < rank


@given(
    st.lists(st.floats(min_value=0.0, max_value=10.0), max_size=50),
    st.floats(min_value=0.0, max_value=5.0),
    st.floats(min_value=0.01, max_value=5.0),
)
def test_quiet_moment_is_the_middle_of_the_widest_gap(
    times: list[float], low: float, width: float
) -> None:
    """The endpoint lies in [low, high] and is at least half the widest gap (between
    consecutive times in the range, or the range's ends) away from every time in it."""
    high = low + width
    moment = quiet_moment(times, low, high)
    inside = sorted(t for t in times if low <= t <= high)
    points = [low, *inside, high]
    widest = max(b - a for a, b in itertools.pairwise(points))
    assert low <= moment <= high
    assert all(abs(moment - t) >= widest / 2 - 1e-9 for t in inside)


def test_each_gateway_config_names_its_own_replica_and_the_shared_store() -> None:
    """Gateways share models, tenants and store; only the port and replica id differ.
    The memory store gets no ``distributed`` block (the config refuses one)."""
    spec = ClusterSpec(models=(ModelSetup("m", {"max_concurrency": 8}),), tenants=({"name": "t"},))
    store = "redis://127.0.0.1:7000/0"
    one = gateway_config(spec, port=1, replica="gw1", engines={"m": 9}, store=store)
    two = gateway_config(spec, port=2, replica="gw2", engines={"m": 9}, store=store)
    assert one["distributed"] == {
        "on_store_failure": "fail_open",
        "lease_ttl_s": 2.0,
        "timeout_ms": 250,
        "replica_id": "gw1",
    }
    assert two["distributed"]["replica_id"] == "gw2"
    assert {k: v for k, v in one.items() if k not in ("server", "distributed")} == {
        k: v for k, v in two.items() if k not in ("server", "distributed")
    }
    assert one["models"][0]["backends"][0]["url"] == "http://127.0.0.1:9"
    assert one["tenants"] == [{"name": "t", "api_key_env": "SG_KEY_0"}]
    memory = gateway_config(spec, port=1, replica="gw1", engines={"m": 9}, store="memory")
    assert "distributed" not in memory
