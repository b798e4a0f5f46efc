"""The ``precise_prefix`` router: sticky to the longest cached prefix until saturated.

Router-level tests drive ``PrecisePrefixRouter`` over real ``BackendState``s (their
``kv_index`` filled as KV events would); the scheduler-level ones check the prefill
backlog it reads and the prefill rate backends learn, through ``Scheduler``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.core.backend_state import BackendState
from sluicegate.core.decisions import Admit
from sluicegate.core.kv_index import BlockIndex, BlockStored
from sluicegate.core.prefix_blocks import block_hashes, leading_run
from sluicegate.core.routing import LeastInflightRouter, PrecisePrefixRouter
from sluicegate.core.routing.least_inflight import inflight_per_weight
from sluicegate.core.routing.recent_routes import RecentRoutes
from sluicegate.core.scheduler import Scheduler
from sluicegate.core.spec import PrefixRoutingSpec
from sluicegate.core.ticket import Ticket, TicketId, Usage
from tests.core.backend_pool import NOW, SERVICE_S, backend, backends
from tests.core.conftest import build_lane, build_spec, build_ticket

BLOCK_TOKENS = 16
PROMPT = "".join(f"line {i}: the shared system prompt of this test\n" for i in range(60))
HASHES = block_hashes(PROMPT, BLOCK_TOKENS)  # 4 characters a token: 64 a block
OTHER = block_hashes("x" + PROMPT, BLOCK_TOKENS)  # shares no block with HASHES


def prompt_ticket(
    n: int, hashes: Sequence[int] = HASHES, prompt_tokens: int | None = None
) -> Ticket:
    """Ticket ``p<n>`` whose prompt's blocks are ``hashes`` (its tokens: those blocks')."""
    tokens = len(hashes) * BLOCK_TOKENS if prompt_tokens is None else prompt_tokens
    return Ticket(
        id=TicketId(f"p{n}"),
        model="m",
        tenant="acme",
        lane="interactive",
        priority=2,
        prompt_tokens=tokens,
        max_tokens=64,
        arrival=0.0,
        block_hashes=tuple(hashes),
    )


def holding(b: BackendState, blocks: Sequence[int]) -> BackendState:
    """``b`` with its engine announcing ``blocks`` (a ``BlockStored`` event)."""
    if b.kv_index is None:
        b.kv_index = BlockIndex()
    b.kv_index.apply([BlockStored(tuple(blocks))])
    return b


def router(pool: Sequence[BackendState], **spec: float | None) -> PrecisePrefixRouter:
    """A router with block size ``BLOCK_TOKENS`` and ``spec``'s other settings."""
    settings_ = PrefixRoutingSpec(block_tokens=BLOCK_TOKENS, **spec)
    return PrecisePrefixRouter(pool, settings_)


def test_the_prompt_spans_many_blocks() -> None:
    """The tests' prompt is long enough to have a prefix worth routing for."""
    assert len(HASHES) >= 30
    assert not set(HASHES) & set(OTHER)


# ---------------------------------------------------------------------------- longest prefix


@settings(max_examples=150, deadline=None)
@given(
    pool_state=st.lists(
        st.tuples(
            st.sets(st.integers(0, len(HASHES) - 1), max_size=len(HASHES)),
            st.integers(0, 4),
            st.sampled_from([0.5, 1.0, 2.0]),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_longest_cached_prefix_wins(pool_state: list[tuple[set[int], int, float]]) -> None:
    """Whatever blocks each engine holds (holes included) and however loaded it is, with no
    penalty bound reachable the ticket goes to a backend holding the longest leading run
    of its blocks, the least loaded of those; with no run anywhere, to the least loaded."""
    pool = []
    for i, (held, inflight, weight) in enumerate(pool_state):
        b = holding(backend(f"b{i}", weight), [HASHES[k] for k in sorted(held)])
        b.inflight = inflight
        pool.append(b)
    chosen = router(pool).choose(prompt_ticket(0), SERVICE_S, pool, NOW)
    assert chosen is not None
    runs = {b.name: leading_run(HASHES, b.kv_index or ()) for b in pool}
    longest = max(runs.values())
    if longest:
        assert runs[chosen.name] == longest
        tied = [b for b in pool if runs[b.name] == longest]
    else:
        tied = pool
    assert inflight_per_weight(chosen) == min(inflight_per_weight(b) for b in tied)


def test_an_unavailable_holder_is_never_chosen() -> None:
    """Engines holding the whole prompt but down, tripped or full lose it to an available
    one holding nothing; with none available there is no choice."""
    pool = [holding(backend(name, max_concurrency=1), HASHES) for name in ("down", "open", "full")]
    pool[0].probe_healthy = False
    pool[1].circuit.trip(0.0)
    pool[2].inflight = 1
    cold = backend("cold")
    r = router([*pool, cold])
    assert r.choose(prompt_ticket(1), SERVICE_S, [*pool, cold], NOW) is cold
    assert r.choose(prompt_ticket(2), SERVICE_S, pool, NOW) is None


def test_a_longer_prefix_beats_a_lighter_load() -> None:
    """Stickiness: the backend holding 30 blocks takes the ticket over an idle one holding
    10, though it already runs 3 requests."""
    pool = [holding(backend("short"), HASHES[:10]), holding(backend("long"), HASHES[:30])]
    pool[1].inflight = 3
    assert router(pool).choose(prompt_ticket(0), SERVICE_S, pool, NOW) is pool[1]


# ---------------------------------------------------------------------------- recent decisions


def _send_siblings(
    r: PrecisePrefixRouter | LeastInflightRouter, pool: list[BackendState]
) -> list[str]:
    """Five tickets of one prompt, 0.1 s apart, each counted in flight as the scheduler does."""
    names = []
    for n in range(5):
        chosen = r.choose(prompt_ticket(n), SERVICE_S, pool, NOW + 0.1 * n)
        assert chosen is not None
        chosen.inflight += 1
        names.append(chosen.name)
    return names


def test_siblings_land_together_before_the_engine_announces_anything() -> None:
    """No engine has announced a block yet: the router's own record sends the siblings of
    the first ticket where it went, though the others are idle (least in-flight would
    spread them over all three)."""
    pool = backends(3)
    names = _send_siblings(router(pool), pool)
    assert len(set(names)) == 1
    spread = backends(3)
    assert len(set(_send_siblings(LeastInflightRouter(spread), spread))) == 3


def test_recent_decisions_expire_after_their_ttl() -> None:
    """A decision counts for ``recent_ttl_s``: a sibling just before its expiry follows it
    (and renews it), one at the renewed expiry goes by load."""
    pool = backends(2)
    r = router(pool, recent_ttl_s=2.0)
    first = r.choose(prompt_ticket(0), SERVICE_S, pool, NOW)
    assert first is not None
    first.inflight += 1
    assert r.choose(prompt_ticket(1), SERVICE_S, pool, NOW + 1.99) is first
    assert r.choose(prompt_ticket(2), SERVICE_S, pool, NOW + 3.98) is first
    later = r.choose(prompt_ticket(3), SERVICE_S, pool, NOW + 3.98 + 2.0)
    assert later is not None
    assert later is not first


def test_a_zero_ttl_remembers_nothing() -> None:
    """``recent_ttl_s: 0``: siblings go by load until the engine's events arrive."""
    pool = backends(3)
    assert len(set(_send_siblings(router(pool, recent_ttl_s=0.0), pool))) == 3


def test_recent_routes_stay_bounded_and_expire() -> None:
    """The record holds at most ``max_blocks`` (the newest), and nothing past its expiry."""
    recent = RecentRoutes(ttl_s=1.0, max_blocks=10)
    recent.record(range(25), "a", 0.0)
    assert len(recent) == 10
    assert not recent.holds(14, "a", 0.5)
    assert recent.holds(15, "a", 0.5)
    assert recent.holds(24, "a", 0.5)
    assert not recent.holds(24, "b", 0.5)
    assert not recent.holds(24, "a", 1.0)
    recent.record([99], "b", 1.0)
    assert len(recent) == 1
    with pytest.raises(ValueError, match="ttl_s"):
        RecentRoutes(ttl_s=-1.0)


# ---------------------------------------------------------------------------- saturation


def test_a_saturated_backend_spills_to_the_least_loaded() -> None:
    """At 1000 prefill tokens/s and a 500 ms bound, the holder of the whole prompt keeps
    it while its backlog plus the ticket's 40 uncached tokens stays within 500 tokens, and
    past that the ticket goes to the least loaded backend."""
    pool = [holding(backend("holder"), HASHES), backend("busy"), backend("idle")]
    pool[0].inflight, pool[1].inflight, pool[2].inflight = 2, 2, 1
    ticket = prompt_ticket(0, prompt_tokens=len(HASHES) * BLOCK_TOKENS + 40)
    pool[0].prefill_backlog_tokens = 460
    r = router(pool, prefill_tokens_per_s=1000.0, max_ttft_penalty_ms=500.0)
    assert r.choose(ticket, SERVICE_S, pool, NOW) is pool[0]
    pool[0].prefill_backlog_tokens = 461
    assert (
        r.choose(dataclasses.replace(ticket, block_hashes=HASHES), SERVICE_S, pool, NOW)
        is (pool[2])
    )


def test_a_spill_prefers_the_longer_cached_run_among_equally_loaded() -> None:
    """Spilling by load, equal loads go to the backend holding more of the prompt."""
    pool = [
        holding(backend("holder"), HASHES),
        backend("cold"),
        holding(backend("warm"), HASHES[:3]),
    ]
    pool[0].prefill_backlog_tokens = 10_000
    pool[0].inflight = 1
    r = router(pool, prefill_tokens_per_s=1000.0)
    assert r.choose(prompt_ticket(0), SERVICE_S, pool, NOW) is pool[2]


def test_without_a_penalty_bound_the_prefix_is_always_followed() -> None:
    """``max_ttft_penalty_ms: null``: however deep the holder's backlog, it keeps the prompt."""
    pool = [holding(backend("holder"), HASHES), backend("idle")]
    pool[0].prefill_backlog_tokens = 10**9
    r = router(pool, prefill_tokens_per_s=1000.0, max_ttft_penalty_ms=None)
    assert r.choose(prompt_ticket(0), SERVICE_S, pool, NOW) is pool[0]


def test_the_learned_rate_counts_when_the_spec_gives_none() -> None:
    """With no configured rate, the holder's learned rate decides: unknown, it is followed;
    learned at 100 tokens/s, a backlog of 100 tokens (over 1 s) makes the ticket spill."""
    pool = [holding(backend("holder"), HASHES), backend("idle")]
    pool[0].prefill_backlog_tokens = 100
    pool[0].inflight = 1
    r = router(pool, max_ttft_penalty_ms=500.0)
    assert r.choose(prompt_ticket(0), SERVICE_S, pool, NOW) is pool[0]
    pool[0].learn_prefill_rate(100, 1.0)
    assert r.choose(prompt_ticket(1), SERVICE_S, pool, NOW) is pool[1]


# ---------------------------------------------------------------------------- nothing cached

_loads = st.lists(
    st.tuples(st.sampled_from([0.5, 1.0, 3.0]), st.integers(0, 4), st.sampled_from([None, 2])),
    min_size=1,
    max_size=5,
)


@settings(max_examples=100, deadline=None)
@given(loads=_loads, count=st.integers(1, 12))
def test_never_worse_than_least_inflight_when_nothing_is_cached(
    loads: list[tuple[float, int, int | None]], count: int
) -> None:
    """Tickets of prompts no engine holds and the router never sent: each goes to a backend
    as lightly loaded (``inflight / weight``) as least in-flight's choice, or to none when
    every backend is full."""
    pool = []
    for i, (weight, inflight, cap) in enumerate(loads):
        b = backend(f"b{i}", weight, max_concurrency=cap)
        b.inflight = inflight
        pool.append(b)
    r = router(pool)
    for n in range(count):
        hashes = block_hashes(f"prompt {n} " * 40, BLOCK_TOKENS)
        available = [b for b in pool if b.available(NOW)]
        chosen = r.choose(prompt_ticket(n, hashes), SERVICE_S, pool, NOW)
        if not available:
            assert chosen is None
            continue
        assert chosen is not None
        assert chosen in available
        assert inflight_per_weight(chosen) == min(inflight_per_weight(b) for b in available)
        chosen.inflight += 1


def test_a_ticket_without_block_hashes_goes_to_least_inflight() -> None:
    """No block hashes (another endpoint, or a prompt shorter than a block): the choices are
    exactly least in-flight's, tie rotation included."""
    pools = [backends(3), backends(3)]
    for pool in pools:
        holding(pool[0], HASHES)
        pool[1].inflight = 1
    precise, least = router(pools[0]), LeastInflightRouter(pools[1])
    for n in range(9):
        plain = prompt_ticket(n, ())
        a = precise.choose(plain, SERVICE_S, pools[0], NOW)
        b = least.choose(plain, SERVICE_S, pools[1], NOW)
        assert a is not None
        assert b is not None
        assert a.name == b.name
        a.inflight += 1
        b.inflight += 1


# ---------------------------------------------------------------------------- through the scheduler


def _scheduler(backend_names: Sequence[str] = ("b0",), **prefix: float | None) -> Scheduler:
    spec = build_spec(
        build_lane(max_concurrency=8),
        backends=backend_names,
        max_concurrency=8,
        router="precise_prefix",
        prefix_routing=PrefixRoutingSpec(block_tokens=BLOCK_TOKENS, **prefix),
    )
    return Scheduler(spec)


def _ticket(name: str, prompt_tokens: int, hashes: Sequence[int] = HASHES) -> Ticket:
    return dataclasses.replace(
        build_ticket(name, prompt_tokens=prompt_tokens), block_hashes=tuple(hashes)
    )


def test_the_backlog_holds_uncached_tokens_until_the_first_token() -> None:
    """Dispatch charges the prompt less the blocks the engine announced; the first token (or
    the end, for a ticket that streams nothing) takes the charge off."""
    sched = _scheduler()
    sched.observe_kv_events("m", "b0", [BlockStored(HASHES[:5])], max_blocks=1000)
    state = sched._model("m").backend("b0")
    sched.submit(_ticket("a", 200), 0.0)
    assert state.prefill_backlog_tokens == 200 - 5 * BLOCK_TOKENS
    sched.submit(_ticket("b", 300, OTHER), 0.0)
    assert state.prefill_backlog_tokens == 120 + 300
    sched.progress(TicketId("a"), 1)
    assert state.prefill_backlog_tokens == 300
    sched.progress(TicketId("a"), 2)
    assert state.prefill_backlog_tokens == 300
    sched.complete(TicketId("b"), Usage(300, 0, ttft_s=None), 1.0)
    assert state.prefill_backlog_tokens == 0
    sched.complete(TicketId("a"), Usage(200, 5), 1.0)
    assert state.prefill_backlog_tokens == 0


def test_the_prefill_rate_is_learned_from_times_to_first_token() -> None:
    """A completed ticket teaches its backend ``(backlog at dispatch + its own uncached
    tokens) / ttft``, smoothed 0.2: 2000 tokens/s, then 2000 + 0.2·(500 − 2000)."""
    sched = _scheduler()
    state = sched._model("m").backend("b0")
    sched.submit(_ticket("a", 200), 0.0)
    sched.complete(TicketId("a"), Usage(200, 5, ttft_s=0.1), 1.0)
    assert state.prefill_tokens_per_s == pytest.approx(2000.0)
    sched.submit(_ticket("b", 100, OTHER), 1.0)
    sched.submit(_ticket("c", 100), 1.0)  # 100 ahead of it at dispatch: 200 in all
    sched.complete(TicketId("b"), Usage(100, 5, ttft_s=None), 2.0)  # no first token: no sample
    assert state.prefill_tokens_per_s == pytest.approx(2000.0)
    sched.complete(TicketId("c"), Usage(100, 5, ttft_s=0.4), 2.0)
    assert state.prefill_tokens_per_s == pytest.approx(1700.0)


def test_a_failed_answer_teaches_no_prefill_rate() -> None:
    """Only an answer the engine gave in full is a sample."""
    sched = _scheduler()
    sched.submit(_ticket("a", 200), 0.0)
    sched.complete(TicketId("a"), Usage(200, 0, ttft_s=0.1, ok=False), 1.0)
    assert sched._model("m").backend("b0").prefill_tokens_per_s is None


def test_the_scheduler_routes_to_the_backend_its_events_name() -> None:
    """End to end in the core: after b1's engine announces the prompt's blocks, tickets of
    that prompt run on b1 and another prompt's on the idle b0."""
    sched = _scheduler(("b0", "b1"))
    sched.observe_kv_events("m", "b1", [BlockStored(HASHES)], max_blocks=1000)
    admits = [*sched.submit(_ticket("a", 500), 0.0), *sched.submit(_ticket("b", 500), 0.0)]
    admits += sched.submit(_ticket("c", 500, OTHER), 0.0)
    placed = [(d.ticket.id, d.backend) for d in admits if isinstance(d, Admit)]
    assert placed == [("a", "b1"), ("b", "b1"), ("c", "b0")]
