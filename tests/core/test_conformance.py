"""The contract every plugin keeps, run over every registry entry.

Each test is parametrized from the registries themselves (``ORDERINGS`` ×
``FAIRNESS``, ``ROUTERS``, ``LIMITS``), so a new plugin is tested here as soon
as it is registered. Each plugin's own rule is tested in test_policies.py,
test_routing.py and test_limits.py; the sans-I/O rule in test_sans_io.py.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from sluicegate.core.backend_state import BackendState
from sluicegate.core.entry import Entry
from sluicegate.core.limits import LIMITS, Limit, SampleKind, make_limit
from sluicegate.core.policies import ORDERINGS, make_queue, queue_policies
from sluicegate.core.registry import Registry
from sluicegate.core.routing import ROUTERS, make_router
from sluicegate.core.spec import AdaptiveSpec, ModelSpec
from sluicegate.core.ticket import Ticket, TicketId
from tests.core.backend_pool import NOW, SERVICE_S, backend, backends, pick, snapshot, ticket

# ---------------------------------------------------------------------------- registries


@pytest.mark.parametrize(
    ("kind", "registry"),
    [("ordering", ORDERINGS), ("router", ROUTERS), ("limit", LIMITS)],
)
def test_every_factory_is_registered_under_its_own_name(kind: str, registry: Registry[Any]) -> None:
    """A registered class's ``name`` is the key it is registered under, so what a config
    names and what the plugin reports agree."""
    assert len(registry.names()) >= 3
    for name in registry:
        assert registry.get(name).name == name, f"{kind} {name!r}"


# ---------------------------------------------------------------------------- queue policies

AGING = 0.5
TENANTS = ("a", "b", "c")
WEIGHTS = {"a": 1.0, "b": 2.0, "c": 0.5}

_push = st.tuples(
    st.just("push"),
    st.sampled_from(TENANTS),
    st.integers(0, 5),  # priority
    st.integers(0, 20),  # arrival, on a coarse grid so keys tie
    st.integers(1, 60),  # SLO in seconds
    st.integers(1, 400),  # predicted output tokens
    st.integers(1, 400),  # true output tokens
)
_op = st.one_of(
    _push,
    st.tuples(st.just("pop")),
    st.tuples(st.just("remove"), st.integers(0, 1_000)),
    st.tuples(st.just("finish")),
)


def _entry(seq: int, push: tuple[object, ...]) -> Entry:
    """A queued entry with the fields every ordering reads (prefill from a 100-token prompt)."""
    _, tenant, priority, arrival, slo_s, predicted, true = push
    assert isinstance(tenant, str)
    assert isinstance(priority, int)
    assert isinstance(arrival, int)
    assert isinstance(slo_s, int)
    assert isinstance(predicted, int)
    assert isinstance(true, int)
    decode_s = 0.025
    prefill_s = 100 / 8000
    return Entry(
        ticket=Ticket(
            id=TicketId(f"e{seq}"),
            model="m",
            tenant=tenant,
            lane="main",
            priority=priority,
            prompt_tokens=100,
            max_tokens=400,
            arrival=float(arrival),
            true_output_tokens=true,
        ),
        seq=seq,
        deadline=float(arrival + slo_s),
        predicted_output_tokens=predicted,
        prefill_s=prefill_s,
        decode_s_per_token=decode_s,
        service_s=prefill_s + predicted * decode_s,
        cost_tokens=100 + predicted,
    )


@pytest.mark.parametrize(("ordering", "fairness"), queue_policies())
@settings(max_examples=40, deadline=None)
@given(ops=st.lists(_op, max_size=60))
def test_queue_serves_every_push_once_in_the_orderings_order(
    ordering: str, fairness: str, ops: list[tuple[object, ...]]
) -> None:
    """Under any pushes, pops, removals and finishes: ``len`` counts the queued entries,
    ``peek`` is what ``pop`` returns, an empty queue peeks ``None`` and refuses ``pop``,
    each pop is the smallest (key, submission) among its tenant's queued entries (among all
    queued entries without fairness), removed entries never come out, and what is popped
    or removed is exactly what was pushed, each once."""
    queue = make_queue(ordering, fairness, aging=AGING, weights=WEIGHTS)
    key = ORDERINGS.get(ordering)(AGING).key
    queued: list[Entry] = []
    running: list[Entry] = []
    pushed: list[str] = []
    left: list[str] = []

    def pop_and_check() -> None:
        head = queue.peek()
        entry = queue.pop()
        assert entry is head
        rivals = [e for e in queued if fairness == "none" or e.ticket.tenant == entry.ticket.tenant]
        assert (key(entry), entry.seq) == min((key(e), e.seq) for e in rivals)
        queued.remove(entry)
        left.append(entry.ticket.id)
        queue.on_admit(entry)
        running.append(entry)

    for seq, op in enumerate(ops):
        if op[0] == "push":
            entry = _entry(seq, op)
            queue.push(entry)
            queued.append(entry)
            pushed.append(entry.ticket.id)
        elif op[0] == "pop":
            if queued:
                pop_and_check()
            else:
                assert queue.peek() is None
                with pytest.raises(IndexError):
                    queue.pop()
        elif op[0] == "remove" and queued:
            index = op[1]
            assert isinstance(index, int)
            victim = queued.pop(index % len(queued))
            queue.remove(victim)
            left.append(victim.ticket.id)
        elif op[0] == "finish" and running:
            done = running.pop(0)
            queue.on_finish(done, done.ticket.prompt_tokens, done.ticket.true_output_tokens or 0)
        assert len(queue) == len(queued)
    while queued:
        pop_and_check()
    assert len(queue) == 0
    assert queue.peek() is None
    assert sorted(left) == sorted(pushed)
    assert len(set(left)) == len(left)


@pytest.mark.parametrize(("ordering", "fairness"), queue_policies())
def test_queue_reports_a_counter_only_with_fairness(ordering: str, fairness: str) -> None:
    """A queue without fairness keeps no counters (``None``); a fair one reports a finite,
    non-negative counter that grows as a tenant is served."""
    queue = make_queue(ordering, fairness, aging=AGING, weights=WEIGHTS)
    entry = _entry(0, ("push", "a", 2, 0, 10, 50, 50))
    queue.push(entry)
    before = queue.counter("a")
    queue.on_admit(queue.pop())
    after = queue.counter("a")
    if fairness == "none":
        assert (before, after) == (None, None)
    else:
        assert before is not None
        assert after is not None
        assert 0.0 <= before < after < math.inf


# ---------------------------------------------------------------------------- routers

ROUTER_NAMES = sorted(ROUTERS)

_backend = st.fixed_dictionaries(
    {
        "weight": st.sampled_from([0.5, 1.0, 2.0, 3.0]),
        "max_concurrency": st.sampled_from([None, 1, 2]),
        "inflight": st.integers(0, 3),
        "probe_healthy": st.booleans(),
        "circuit": st.sampled_from(["closed", "open", "half_open", "probing"]),
        "kv_cache_usage": st.one_of(st.none(), st.floats(0.0, 1.0)),
        "num_requests_waiting": st.one_of(st.none(), st.integers(0, 10)),
    }
)


def _pool(described: list[dict[str, object]]) -> list[BackendState]:
    """Backends in the described states; circuits open at t=0 with a 5 s cool-down, so at
    ``NOW`` (1 s) ``open`` is open, ``half_open`` (opened 10 s earlier) lets one probe through
    and ``probing`` already has its probe out."""
    pool = []
    for i, d in enumerate(described):
        weight, cap = d["weight"], d["max_concurrency"]
        assert isinstance(weight, float)
        assert cap is None or isinstance(cap, int)
        b = backend(f"b{i}", weight, max_concurrency=cap)
        inflight = d["inflight"]
        assert isinstance(inflight, int)
        b.inflight = inflight
        b.predicted_work_s = SERVICE_S * inflight
        b.probe_healthy = bool(d["probe_healthy"])
        kv, waiting = d["kv_cache_usage"], d["num_requests_waiting"]
        assert kv is None or isinstance(kv, float)
        assert waiting is None or isinstance(waiting, int)
        b.kv_cache_usage = kv
        b.num_requests_waiting = waiting
        if d["circuit"] == "open":
            b.circuit.trip(0.0)
        elif d["circuit"] in ("half_open", "probing"):
            b.circuit.trip(NOW - 10.0)
            if d["circuit"] == "probing":
                b.circuit.on_dispatch(NOW)
        pool.append(b)
    return pool


_keys = st.lists(st.one_of(st.none(), st.integers(0, 50)), min_size=1, max_size=30)


@pytest.mark.parametrize("name", ROUTER_NAMES)
@settings(max_examples=60, deadline=None)
@given(described=st.lists(_backend, max_size=5), keys=_keys)
def test_router_chooses_an_available_backend_or_none_when_there_is_none(
    name: str, described: list[dict[str, object]], keys: list[int | None]
) -> None:
    """Whatever the backends' health, caps and load — and as load builds, each choice
    counted in flight as the scheduler does — a router returns an available backend while
    one exists, and ``None`` only when none does."""
    pool = _pool(described)
    router = make_router(name, pool)
    for n, key in enumerate(keys):
        available = [b for b in pool if b.available(NOW)]
        chosen = router.choose(ticket(key, n), SERVICE_S, pool, NOW)
        if available:
            assert chosen is not None
            assert any(chosen is b for b in available), f"chose unavailable {chosen.name}"
            chosen.inflight += 1
            chosen.predicted_work_s += SERVICE_S
        else:
            assert chosen is None


@pytest.mark.parametrize("name", ROUTER_NAMES)
@settings(max_examples=30, deadline=None)
@given(described=st.lists(_backend, min_size=1, max_size=5), keys=_keys)
def test_router_is_deterministic(
    name: str, described: list[dict[str, object]], keys: list[int | None]
) -> None:
    """Two routers of one strategy, given equal backends and the same tickets in the same
    order, make the same choices."""
    runs = []
    for _ in range(2):
        pool = _pool(described)
        router = make_router(name, pool)
        choices = []
        for n, key in enumerate(keys):
            chosen = router.choose(ticket(key, n), SERVICE_S, pool, NOW)
            choices.append(None if chosen is None else chosen.name)
            if chosen is not None:
                chosen.inflight += 1
        runs.append(choices)
    assert runs[0] == runs[1]


@pytest.mark.parametrize("name", ROUTER_NAMES)
def test_router_chooses_only_available_backends(name: str) -> None:
    """Tripped, probe-failed and full backends are never chosen while another is available."""
    pool = [
        backend("tripped"),
        backend("down"),
        backend("full", max_concurrency=1),
        backend("ok1"),
        backend("ok2", weight=3.0),
    ]
    pool[0].circuit.trip(0.0)
    pool[1].probe_healthy = False
    pool[2].inflight = 1
    router = make_router(name, pool)
    chosen = {pick(router, pool, key) for key in [*range(200), None]}
    assert chosen <= {"ok1", "ok2"}
    assert None not in chosen


@pytest.mark.parametrize("name", ROUTER_NAMES)
def test_router_returns_none_when_all_unhealthy(name: str) -> None:
    """With every circuit open or every probe failed, there is no backend to choose."""
    pool = backends(3)
    pool[0].circuit.trip(0.0)
    pool[1].probe_healthy = False
    pool[2].circuit.trip(0.5)
    router = make_router(name, pool)
    assert {pick(router, pool, key) for key in (1, 2, None)} == {None}


@pytest.mark.parametrize("name", ROUTER_NAMES)
def test_router_returns_none_when_all_full(name: str) -> None:
    """Backends at their own ``max_concurrency`` are not available."""
    pool = [backend(f"b{i}", max_concurrency=2) for i in range(3)]
    for b in pool:
        b.inflight = 2
    router = make_router(name, pool)
    assert {pick(router, pool, key) for key in (1, 2, None)} == {None}


@pytest.mark.parametrize("name", ROUTER_NAMES)
def test_router_returns_none_without_backends(name: str) -> None:
    """A model with no backends routes nothing."""
    assert pick(make_router(name, []), []) is None


@pytest.mark.parametrize("name", ROUTER_NAMES)
def test_router_never_mutates_backends(name: str) -> None:
    """Choosing leaves in-flight counts, engine numbers and health as they were."""
    pool = backends(4)
    for i, b in enumerate(pool):
        b.inflight = i
        b.predicted_work_s = 3.0 * i
        b.kv_cache_usage = 0.1 * i
        b.num_requests_waiting = i
    before = snapshot(pool)
    router = make_router(name, pool)
    for key in [*range(50), None]:
        pick(router, pool, key)
    assert snapshot(pool) == before


# ---------------------------------------------------------------------------- limits

LIMIT_NAMES = sorted(LIMITS)

_limit_event = st.one_of(
    st.tuples(
        st.just("success"),
        st.one_of(
            st.floats(min_value=0.0, max_value=100.0),
            st.sampled_from([float("nan"), float("inf"), -1.0]),
        ),
        st.integers(min_value=0, max_value=200),
        st.sampled_from(SampleKind),
    ),
    st.tuples(st.just("drop"), st.just(0.0), st.integers(0, 200), st.just(SampleKind.FIRST_TOKEN)),
    st.tuples(st.just("ignore"), st.just(0.0), st.just(0), st.just(SampleKind.FIRST_TOKEN)),
    st.tuples(
        st.just("kv"),
        st.floats(min_value=0.0, max_value=1.0),
        st.integers(0, 200),
        st.just(SampleKind.FIRST_TOKEN),
    ),
)


def _limit(mode: str, cap: int, **settings_: object) -> Limit:
    return make_limit(AdaptiveSpec.model_validate({"mode": mode, **settings_}), cap)


def test_model_spec_accepts_exactly_the_registered_limit_modes() -> None:
    """Every registered mode is a valid ``adaptive.mode``; anything else is refused with
    the choices listed."""
    for mode in LIMIT_NAMES:
        spec = ModelSpec(name="m", adaptive=AdaptiveSpec(mode=mode))
        assert spec.adaptive is not None
        assert spec.adaptive.mode == mode
    with pytest.raises(ValidationError, match=r"unknown adaptive limit mode 'vegas'.*aimd"):
        ModelSpec(name="m", adaptive=AdaptiveSpec(mode="vegas"))


@pytest.mark.parametrize("mode", LIMIT_NAMES)
def test_limit_starts_at_cap(mode: str) -> None:
    """A fresh limit's value is the configured cap."""
    assert _limit(mode, cap=37).value == 37


@pytest.mark.parametrize("mode", LIMIT_NAMES)
def test_limit_name_matches_registration(mode: str) -> None:
    """The limit ``make_limit`` builds reports the mode it is registered under."""
    assert _limit(mode, cap=8).name == mode


@pytest.mark.parametrize("mode", LIMIT_NAMES)
def test_make_limit_rejects_cap_below_floor(mode: str) -> None:
    """A cap below the floor is a configuration error naming the floor."""
    with pytest.raises(ValueError, match=r"floor \(4\)"):
        _limit(mode, cap=3, floor=4)


@pytest.mark.parametrize("mode", LIMIT_NAMES)
@settings(max_examples=60, deadline=None)
@given(
    events=st.lists(_limit_event, max_size=300),
    floor=st.integers(min_value=1, max_value=8),
    extra=st.integers(min_value=0, max_value=100),
)
def test_value_stays_an_int_within_floor_and_cap(
    mode: str, events: list[tuple[str, float, int, SampleKind]], floor: int, extra: int
) -> None:
    """Under any sequence of successes (of either kind, any latency, even NaN), drops,
    ignored outcomes and KV readings, ``value`` is an int in [floor, cap]."""
    cap = floor + extra
    limit = _limit(mode, cap=cap, floor=floor, long_window=20)
    for event, reading, inflight, kind in events:
        if event == "success":
            limit.on_success(reading, inflight=inflight, kind=kind)
        elif event == "drop":
            limit.on_dropped(inflight=inflight)
        elif event == "ignore":
            limit.on_ignore()
        else:
            limit.on_kv_usage(reading, inflight=inflight)
        assert type(limit.value) is int
        assert floor <= limit.value <= cap
