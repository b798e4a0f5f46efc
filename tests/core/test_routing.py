"""Routing strategies: each one's own rule (the contract every router keeps is in
test_conformance.py)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.core.backend_state import BackendState
from sluicegate.core.routing import (
    LeastExpectedTimeRouter,
    LeastInflightRouter,
    PrefixAffinityRouter,
    RandomRouter,
    RoundRobinRouter,
    Router,
    make_router,
    router_names,
)
from tests.core.backend_pool import NOW, SERVICE_S, backend, backends, pick, ticket


def pick_and_run(router: Router, pool: Sequence[BackendState], keys: Sequence[int | None]) -> None:
    """Route one ticket per key, counting each as in flight on its backend as the scheduler does."""
    for n, key in enumerate(keys):
        chosen = router.choose(ticket(key, n), SERVICE_S, pool, NOW)
        assert chosen is not None
        chosen.inflight += 1
        chosen.predicted_work_s += SERVICE_S


def test_registry_lists_the_six_strategies() -> None:
    """The registry lists every strategy under its documented name."""
    assert router_names() == {
        "round_robin",
        "least_inflight",
        "least_expected_time",
        "prefix_affinity",
        "precise_prefix",
        "random",
    }


def test_make_router_rejects_unknown_name() -> None:
    """An unknown strategy name is a KeyError that lists the choices."""
    with pytest.raises(KeyError, match="least_inflight"):
        make_router("weighted_random", backends(2))


def test_round_robin_honours_weights_exactly() -> None:
    """Weights 1:3 give exactly 25% / 75% of every multiple of 4 picks."""
    pool = [backend("light", 1.0), backend("heavy", 3.0)]
    router = RoundRobinRouter(pool)
    counts = Counter(pick(router, pool) for _ in range(400))
    assert counts == {"light": 100, "heavy": 300}


def test_round_robin_is_smooth() -> None:
    """Weights 5:1:1 interleave as nginx's ``a a b a c a a`` rather than ``a a a a a b c``."""
    pool = [backend("a", 5.0), backend("b"), backend("c")]
    router = RoundRobinRouter(pool)
    period = ["a", "a", "b", "a", "c", "a", "a"]
    assert [pick(router, pool) for _ in range(21)] == period * 3


def test_round_robin_skips_unavailable_backend() -> None:
    """An unhealthy backend's share goes to the others, which keep their mutual ratio."""
    pool = [backend("a"), backend("b", 2.0), backend("c", 5.0)]
    pool[2].circuit.trip(0.0)
    router = RoundRobinRouter(pool)
    assert Counter(pick(router, pool) for _ in range(30)) == {"a": 10, "b": 20}


def test_least_inflight_picks_smallest_per_weight() -> None:
    """The backend with the smallest ``inflight / weight`` wins, not the smallest ``inflight``."""
    pool = [backend("small"), backend("big", 4.0)]
    pool[0].inflight = 2
    pool[1].inflight = 4
    assert pick(LeastInflightRouter(pool), pool) == "big"


def test_least_inflight_alternates_equal_backends() -> None:
    """Equally loaded backends take turns even if nobody updates their in-flight counts."""
    pool = backends(3)
    router = LeastInflightRouter(pool)
    assert [pick(router, pool) for _ in range(6)] == ["b0", "b1", "b2", "b0", "b1", "b2"]


def test_least_inflight_balances_by_weight() -> None:
    """Counting each pick as in flight, loads end proportional to weight."""
    pool = [backend("a"), backend("b", 2.0), backend("c", 3.0)]
    pick_and_run(LeastInflightRouter(pool), pool, [None] * 60)
    assert [b.inflight for b in pool] == [10, 20, 30]


def test_random_draws_in_proportion_to_weight() -> None:
    """Weights 1:3 give the heavy backend 3/4 of 4,000 draws, within four binomial
    standard deviations (sqrt(4000 * 0.25 * 0.75) ~ 27)."""
    pool = [backend("light", 1.0), backend("heavy", 3.0)]
    router = RandomRouter(pool)
    counts = Counter(pick(router, pool) for _ in range(4000))
    assert abs(counts["heavy"] - 3000) <= 4 * 27
    assert counts["light"] + counts["heavy"] == 4000


def test_random_draws_only_among_available_backends_by_their_weights() -> None:
    """A tripped heavy backend is never drawn; the two equal ones left split 2,000 draws
    evenly, within four standard deviations (sqrt(2000 / 4) ~ 22)."""
    pool = [backend("a"), backend("b"), backend("heavy", 2.0)]
    pool[2].circuit.trip(0.0)
    router = RandomRouter(pool)
    counts = Counter(pick(router, pool) for _ in range(2000))
    assert set(counts) == {"a", "b"}
    assert abs(counts["a"] - 1000) <= 4 * 22


def test_random_is_reproducible_per_seed() -> None:
    """Two routers with one seed draw the same 50 backends; another seed, another sequence."""
    pool = backends(4)

    def draws(seed: int) -> list[str | None]:
        router = RandomRouter(pool, seed=seed)
        return [pick(router, pool) for _ in range(50)]

    assert draws(0) == draws(0)
    assert draws(0) != draws(1)


def test_least_expected_time_avoids_large_predicted_work() -> None:
    """A backend with long predicted work loses to one with less, at equal in-flight count."""
    pool = backends(2)
    for b, work in zip(pool, (40.0, 5.0), strict=True):
        b.inflight = 2
        b.predicted_work_s = work
    assert pick(LeastExpectedTimeRouter(pool), pool) == "b1"


def test_least_expected_time_avoids_engine_queue() -> None:
    """The engine's own waiting queue counts, even when our in-flight counts are equal."""
    pool = backends(2)
    pool[0].num_requests_waiting = 10
    pool[1].num_requests_waiting = 1
    assert pick(LeastExpectedTimeRouter(pool), pool) == "b1"


def test_least_expected_time_penalises_kv_pressure() -> None:
    """Equal work on a nearly full KV cache is expected to take longer."""
    pool = backends(2)
    for b, usage in zip(pool, (0.9, 0.2), strict=True):
        b.inflight = 1
        b.predicted_work_s = 4.0
        b.kv_cache_usage = usage
    assert pick(LeastExpectedTimeRouter(pool), pool) == "b1"


def test_least_expected_time_alternates_idle_backends() -> None:
    """Idle backends tie on expected time and take turns."""
    pool = backends(2)
    router = LeastExpectedTimeRouter(pool)
    assert [pick(router, pool) for _ in range(4)] == ["b0", "b1", "b0", "b1"]


def test_prefix_affinity_sticks_while_under_bound() -> None:
    """The same prefix_key keeps going to one backend while its load is within the bound."""
    pool = backends(4)
    for b in pool:
        b.inflight = 4
    router = PrefixAffinityRouter(pool)
    for key in range(20):
        assert len({pick(router, pool, key) for _ in range(10)}) == 1


def test_prefix_affinity_spills_over_bound() -> None:
    """A key whose home backend is at the bound goes elsewhere, and back once it drains."""
    pool = backends(4)
    router = PrefixAffinityRouter(pool)
    home = next(b for b in pool if b.name == pick(router, pool, 42))
    home.inflight = 2  # bound is ceil(1.25 * 3 / 4) = 1
    assert pick(router, pool, 42) not in {home.name, None}
    home.inflight = 0
    assert pick(router, pool, 42) == home.name


def test_prefix_affinity_spreads_distinct_keys() -> None:
    """Different keys land on every backend, roughly by weight: each backend's count is
    within 20% of its weighted share. (The ring gives each backend 100 points per unit of
    weight, so the arcs it owns, hence its share, are off by ~10% typically; on this fixed
    ring and these keys the shares are 1064, 849 and 2087 of 1000, 1000 and 2000.)"""
    pool = [backend("a"), backend("b"), backend("c", 2.0)]
    router = PrefixAffinityRouter(pool)
    counts = Counter(pick(router, pool, key) for key in range(4000))
    share = {"a": 1000, "b": 1000, "c": 2000}
    assert set(counts) == set(share)
    for name, expected in share.items():
        assert abs(counts[name] - expected) <= 0.2 * expected, counts


def test_prefix_affinity_without_key_uses_least_inflight() -> None:
    """A ticket with no prefix_key goes to the least-loaded backend."""
    pool = backends(3)
    pool[0].inflight = 3
    pool[2].inflight = 1
    assert pick(PrefixAffinityRouter(pool), pool, None) == "b1"


def test_prefix_affinity_ring_is_stable_across_instances() -> None:
    """Two routers over the same backends map keys identically (no salted ``hash``)."""
    pool = backends(5)
    first, second = PrefixAffinityRouter(pool), PrefixAffinityRouter(pool)
    assert [pick(first, pool, k) for k in range(300)] == [pick(second, pool, k) for k in range(300)]


def test_prefix_affinity_rejects_load_factor_below_one() -> None:
    """A bound below the mean load could leave no backend eligible."""
    with pytest.raises(ValueError, match="load_factor"):
        PrefixAffinityRouter(backends(2), load_factor=0.9)


def test_prefix_affinity_remaps_only_keys_of_a_removed_backend() -> None:
    """At low load, taking one backend out moves only the keys that lived on it."""
    pool = backends(5)
    router = PrefixAffinityRouter(pool)
    before = {key: pick(router, pool, key) for key in range(1000)}
    pool[2].circuit.trip(0.0)
    after = {key: pick(router, pool, key) for key in range(1000)}
    moved = {key for key in before if before[key] != after[key]}
    assert moved == {key for key, name in before.items() if name == "b2"}
    assert moved


def test_prefix_affinity_adapts_ring_to_new_backends() -> None:
    """A backend added after construction gets keys, and only takes them from others."""
    pool = backends(3)
    router = PrefixAffinityRouter(pool)
    before = {key: pick(router, pool, key) for key in range(1000)}
    grown = [*pool, backend("b3")]
    after = {key: pick(router, grown, key) for key in range(1000)}
    assert {after[k] for k in before if before[k] != after[k]} == {"b3"}


skewed_keys = st.one_of(
    st.lists(st.just(1), min_size=1, max_size=150),
    st.lists(st.sampled_from([1, 2, 3]), min_size=1, max_size=150),
    st.lists(st.integers(min_value=-(2**70), max_value=2**70), min_size=1, max_size=150),
)


@settings(max_examples=60, deadline=None)
@given(
    weights=st.lists(st.sampled_from([0.5, 1.0, 2.0, 5.0]), min_size=1, max_size=6),
    keys=skewed_keys,
)
def test_prefix_affinity_load_stays_bounded(weights: list[float], keys: list[int]) -> None:
    """However skewed the keys, no backend exceeds ``ceil(1.25 * total / n) + 1`` in flight."""
    pool = [backend(f"b{i}", w) for i, w in enumerate(weights)]
    pick_and_run(PrefixAffinityRouter(pool, vnodes_per_weight=20), pool, keys)
    total = sum(b.inflight for b in pool)
    assert total == len(keys)
    assert max(b.inflight for b in pool) <= math.ceil(1.25 * total / len(pool)) + 1
