"""The simulator: a virtual-clock driver of the real ``core.Scheduler`` and N engine replicas.

Events live on one heap keyed ``(time, kind, sequence)`` (SimPy style), so
ties are broken deterministically: at one instant, engine step completions
come first (freeing slots), then arrivals, scheduler ticks, metric scrapes,
and last the first step of replicas that were idle, so requests arriving
together share it. Arrivals are read from the sorted workload rather than
pushed on the heap. The driver executes every decision the scheduler returns:

* ``Admit`` → ``Engine.add_request`` on the chosen replica;
* ``Preempt`` → ``Engine.abort``, then ``Scheduler.complete`` with the tokens produced;
  an abort drops any tokens still pending in the replica's in-flight step;
* ``Reject`` / ``Expire`` → the request's outcome; ``Queued`` → nothing;
* ``Reserve`` (distributed mode) → granted at once, as by an in-memory store.

Engine semantics (``engine/model.py``): ``step(now)`` changes the engine's
state at once and returns what the step emits, which the driver applies at
``now + duration_s``. A continuous-batching replica has one step in flight and
takes new requests at the next step boundary, as vLLM does. A
``batch_independent`` replica is c independent servers whose token events
fall at exact times, so the driver steps it after every change and lets
several steps be in flight: each reports its event exactly on time, which is
what makes the Erlang C checks exact.

A request whose ``prompt + max_tokens`` the engine could never hold is never
submitted (a gateway answers it 400 at once); its outcome is ``too_large``.

Decode runs: most steps of a continuous-batching replica are pure decodes
that change nothing outside it. When ``Engine.plan_decode`` offers a run of
them (at most up to the next progress report), the replica posts one event for
the end of the run instead of one per step, and applies the run's steps when
that event comes. Anything that touches the replica earlier (an admission, a
preemption, a scrape) first applies the steps that would have started by then
(``_sync``) and re-posts the one in flight, so every outcome, time and sample
is the same as stepping one event at a time.

Ties: step-by-step, events at one instant run in the order they were posted,
and a step's completion is posted by the event that started the step, so
equal times are ordered by when the events were posted, then by the events
that posted them, recursively. Heap items carry the time posted and, for a
step, a ``ChainPoint`` that replays that recursion over the replica's step
boundaries, so runs break ties as step-by-step driving does.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import deque
from collections.abc import Callable, Iterable
from itertools import accumulate

from sluicegate.core.decisions import (
    Admit,
    Decision,
    Expire,
    Preempt,
    PreemptAction,
    Queued,
    Reject,
    Reserve,
)
from sluicegate.core.scheduler import Scheduler
from sluicegate.core.spec import BackendSpec, SchedulerSpec
from sluicegate.core.ticket import BackendStats, Outcome, Ticket, TicketId, Usage
from sluicegate.engine.config import EngineConfig
from sluicegate.engine.model import DecodeRun, Engine, StepResult
from sluicegate.sim.metrics import (
    COMPLETED,
    PREEMPTED,
    TOO_LARGE,
    SampleLog,
    SimRequest,
    SimResult,
)
from sluicegate.sim.request import WorkloadRequest

__all__ = ["Replica", "SimResult", "simulate", "with_replicas"]

_STEP, _ARRIVAL, _TICK, _SCRAPE, _WAKE = 0, 1, 2, 3, 4
PROGRESS_EVERY_STEPS = 16
"""A replica reports its requests' progress to the scheduler every this many steps."""

_EXPIRED = Outcome.EXPIRED.value
_TICK_GUARD_S = 1e-6


class ChainPoint:
    """A step completion's place among same-instant step completions of other replicas.

    A continuous-batching replica's steps form a chain from the wake that
    started it: the completion of step k, ending at ``t[k+1]`` and posted at
    ``t[k]``, is posted while the completion of step k − 1 is handled. Its
    step-by-step heap position is therefore the key ``(t[k+1], STEP, t[k],
    STEP, t[k−1], …, STEP, t[0], WAKE, wake posted, wake sequence)``; two
    completions at the same time, posted at the same time, compare by the rest.

    Args:
        history: the chain's step start times; entries up to ``index`` never change.
        index: position of the step's start (the time the completion is posted).
        origin: ``(time posted, sequence)`` of the wake that started the chain.
    """

    __slots__ = ("history", "index", "origin")

    def __init__(self, history: array[float], index: int, origin: tuple[float, int]) -> None:
        self.history = history
        self.index = index
        self.origin = origin

    def __lt__(self, other: ChainPoint) -> bool:
        """Whether this completion comes first; both end and were posted at the same times."""
        mine, theirs = self.history, other.history
        i, j = self.index - 1, other.index - 1
        while i >= 0 and j >= 0:
            a, b = mine[i], theirs[j]
            if a != b:
                return a < b
            i -= 1
            j -= 1
        if i >= 0 or j >= 0:
            return i >= 0  # the other reached its wake, which sorts after any step completion
        return self.origin < other.origin


HeapItem = tuple[float, int, float, ChainPoint | None, int, int]
"""``(time, kind, time posted, chain point of a step, sequence, replica index)``."""


def with_replicas(spec: SchedulerSpec, model: str, replicas: int) -> SchedulerSpec:
    """A copy of ``spec`` whose ``model`` has backends ``r0 … r{replicas−1}``.

    Each replica inherits ``max_concurrency`` and ``weight`` from the model's
    first configured backend, if it has one; otherwise the scheduler's model
    and lane caps alone bound what runs.

    Raises:
        KeyError: ``model`` is not configured.
        ValueError: ``replicas`` < 1.
    """
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    names = [m.name for m in spec.models]
    if model not in names:
        raise KeyError(f"unknown model {model!r}; configured: {names}")
    models = []
    for m in spec.models:
        if m.name == model:
            template = m.backends[0] if m.backends else BackendSpec(name="r0")
            backends = tuple(
                template.model_copy(update={"name": f"r{i}", "url": None}) for i in range(replicas)
            )
            m = m.model_copy(update={"backends": backends})
        models.append(m)
    return spec.model_copy(update={"models": tuple(models)})


class DecodeSpan:
    """A decode run a replica is in: its steps start at ``times[0 … n−1]``, the last ends
    at ``times[n]``.

    Attributes:
        run: the engine's plan; none of its steps is applied to the engine yet.
        times: step boundaries, chained as step-by-step driving would: ``t + duration``.
        item: the heap item of the run's end, at ``times[n]``.
        base: where ``times[0]`` is in the replica's chain history.
        inline: whether step 0 was started by the run loop's inline path (which
            accounts busy time as ``duration``) rather than ``start_step``.
    """

    __slots__ = ("base", "inline", "item", "run", "times")

    def __init__(
        self, run: DecodeRun, times: list[float], item: HeapItem, base: int, inline: bool
    ) -> None:
        self.run = run
        self.times = times
        self.item = item
        self.base = base
        self.inline = inline


class Replica:
    """One engine replica and the driver's bookkeeping around it.

    Attributes:
        inflight: steps started and not yet applied, by heap sequence number.
        running: requests on the engine (waiting or running), by engine id.
        busy_s: time with a step in flight (the union, when steps overlap).
        slot_s: ∫ running-batch size dt over the same time.
        span: the decode run in progress, if any (its steps are not on the engine yet).
        history: start times of the steps since the wake that started this chain.
        origin: ``(time posted, sequence)`` of that wake.
    """

    __slots__ = ("busy_s", "busy_until", "engine", "history", "independent", "index",
                 "inflight", "name", "origin", "running", "slot_s", "span", "steps", "touched",
                 "waking")  # fmt: skip

    def __init__(self, index: int, name: str, config: EngineConfig, seed: int) -> None:
        self.index = index
        self.name = name
        self.engine = Engine(config, seed=seed)
        self.independent = config.batch_independent
        self.inflight: dict[int, StepResult] = {}
        self.running: dict[str, SimRequest] = {}
        self.busy_s = self.slot_s = 0.0
        self.busy_until = float("-inf")
        self.steps = 0
        self.touched = False
        self.waking = False
        self.span: DecodeSpan | None = None
        self.history: array[float] = array("d")
        self.origin = (-math.inf, 0)

    def start_step(self, now: float) -> StepResult | None:
        """Run ``engine.step(now)`` and account its busy time; ``None`` when idle."""
        engine = self.engine
        result = engine.step(now)
        if result is None:
            return None
        end = now + result.duration_s
        if end > self.busy_until:
            gained = end - max(now, self.busy_until)
            self.busy_s += gained
            # Sequences in the step: those still running plus those it finished.
            self.slot_s += gained * (engine.num_requests_running + len(result.finished))
            self.busy_until = end
        return result

    def add(self, req: SimRequest, now: float) -> None:
        """Hand an admitted request to the engine."""
        req.runs += 1
        eid = req.ticket_id if req.runs == 1 else f"{req.ticket_id}~{req.runs}"
        req.eid = eid
        req.backend = self.name
        if req.admit_s is None:
            req.admit_s = now
        req.admitted_s = now
        req.first_token_s = None
        wl = req.workload
        self.engine.add_request(
            eid, wl.prompt_tokens, wl.max_tokens, now, output_tokens=wl.output_tokens
        )
        self.running[eid] = req

    def abort(self, req: SimRequest, now: float) -> int:
        """Abort ``req`` on the engine; returns the tokens it had produced by ``now``.

        Tokens of a step still in flight have not reached the client, so they
        are not counted (and the step's report of them will be dropped).
        """
        eid = req.eid
        pending = 0
        for result in self.inflight.values():
            pending += result.tokens.get(eid, 0)
        try:
            produced = self.engine.generated(eid)
        except KeyError:  # it finished inside the in-flight step
            produced = req.target
        self.engine.abort(eid, now=now)
        del self.running[eid]
        return produced - pending

    def commit(self, steps: int) -> None:
        """Apply the first ``steps`` steps of the span to the engine and end the span.

        Busy and slot time accrue per step, as ``start_step`` (step 0 unless
        ``inline``) and the run loop's inline path would have added them; the
        completions of all but the last step count as processed.
        """
        span = self.span
        assert span is not None
        self.span = None
        run = span.run
        times = span.times
        self.engine.advance_decode(run, steps, times[steps - 1])
        durations = run.durations_s
        batch = len(run.req_ids)
        busy = self.busy_s
        slot = self.slot_s
        first = 0
        if not span.inline:
            first = 1
            now = times[0]
            end = now + durations[0]
            if end > self.busy_until:
                gained = end - max(now, self.busy_until)
                busy += gained
                slot += gained * batch
        for duration in durations[first:steps]:
            busy += duration
            slot += duration * batch
        self.busy_s = busy
        self.slot_s = slot
        self.busy_until = times[steps]
        self.steps += steps - 1


def simulate(
    spec: SchedulerSpec,
    model: str,
    workload: list[WorkloadRequest],
    engine: EngineConfig,
    replicas: int,
    *,
    seed: int = 0,
    scrape_interval_s: float = 1.0,
    progress: Callable[[float], None] | None = None,
) -> SimResult:
    """Replay ``workload`` through a ``Scheduler`` on ``spec`` and ``replicas`` engines.

    Deterministic: the same arguments give identical records and samples.

    Args:
        spec: scheduler configuration; ``model``'s backends are replaced by the replicas.
        model: the model every request asks for.
        workload: requests, in any order (replayed by arrival, then position).
        engine: configuration of every replica; replica i is seeded ``seed + i``.
        replicas: number of engine replicas.
        seed: engine seed base.
        scrape_interval_s: period of the metric scrapes fed to ``observe_backend``.
        progress: called with the virtual time at every scrape and at the end.

    Raises:
        KeyError: ``model`` is not configured.
        ValueError: a request names a lane the model lacks, or bad arguments.
    """
    if scrape_interval_s <= 0:
        raise ValueError(f"scrape_interval_s must be > 0, got {scrape_interval_s}")
    sim = _Simulation(with_replicas(spec, model, replicas), model, workload, engine, seed)
    return sim.run(scrape_interval_s, progress)


class _Simulation:
    """One run's state; ``run`` is the event loop."""

    def __init__(
        self,
        spec: SchedulerSpec,
        model: str,
        workload: list[WorkloadRequest],
        engine: EngineConfig,
        seed: int,
    ) -> None:
        model_spec = next(m for m in spec.models if m.name == model)
        self.lanes = {lane.name: lane for lane in model_spec.lanes}
        unknown = sorted({w.lane for w in workload} - set(self.lanes))
        if unknown:
            raise ValueError(
                f"workload uses lanes {unknown} that model {model!r} lacks; "
                f"configured: {sorted(self.lanes)}"
            )
        self.spec = spec
        self.model = model
        self.engine_config = engine
        self.scheduler = Scheduler(spec)
        self.replicas = [
            Replica(i, b.name, engine, seed + i) for i, b in enumerate(model_spec.backends)
        ]
        self.by_backend = {rep.name: rep for rep in self.replicas}
        order = sorted(range(len(workload)), key=lambda i: (workload[i].arrival_s, i))
        self.requests = [SimRequest(i, workload[i]) for i in range(len(workload))]
        self.arrivals = [self.requests[i] for i in order]
        self.live: dict[TicketId, SimRequest] = {}
        self.heap: list[HeapItem] = []
        self.seq = 0
        self.touched: list[Replica] = []
        self.tick_seq = -1
        self.event: HeapItem = (0.0, _ARRIVAL, 0.0, None, 0, 0)
        self.tick_at: float | None = None
        self.last_tick = float("-inf")
        self.samples = SampleLog(list(self.lanes))
        self.start = 0.0
        self.interval = 1.0
        self.scrape_k = 0
        self.progress: Callable[[float], None] | None = None

    # ------------------------------------------------------------------ loop

    def run(self, interval: float, progress: Callable[[float], None] | None) -> SimResult:
        """Process events until no arrival, request or engine step is left.

        A step that emitted neither a first nor a last token and reports no
        progress is handled inline. ``self.event`` is the event being handled,
        which ``_sync`` compares step boundaries against.
        """
        heap = self.heap
        arrivals = self.arrivals
        replicas = self.replicas
        times = [req.workload.arrival_s for req in arrivals]
        count = len(times)
        self.start = times[0] if count else 0.0
        self.interval = interval
        self.progress = progress
        if count:
            self._push(self.start, _SCRAPE, 0, self.start, None)
        pop = heapq.heappop
        i = 0
        next_at = times[0] if count else math.inf
        while True:
            if heap and (heap[0][0] < next_at or (heap[0][0] == next_at and heap[0][1] < _ARRIVAL)):
                item = pop(heap)
                now, kind, _, _, seq, index = item
                if kind != _STEP:
                    self.event = item
                    if kind == _TICK:
                        if seq == self.tick_seq:
                            self._on_tick(now)
                    elif kind == _SCRAPE:
                        self._on_scrape(now, next_at)
                    else:
                        self._on_wake(replicas[index], now)
                    continue
                rep = replicas[index]
                result = rep.inflight.pop(seq)
                span = rep.span
                if span is not None:
                    rep.commit(len(span.times) - 1)
                if (
                    rep.independent
                    or result.first_token
                    or result.finished
                    or rep.steps % PROGRESS_EVERY_STEPS == PROGRESS_EVERY_STEPS - 1
                ):
                    self.event = item
                    self._on_step(rep, result, now)
                    continue
                rep.steps += 1
                self._begin(rep, now, True)
            elif i < count:
                self.event = (next_at, _ARRIVAL, next_at, None, 0, 0)
                self._on_arrival(arrivals[i], next_at)
                i += 1
                next_at = times[i] if i < count else math.inf
            else:
                return self._result()

    def _push(
        self, at: float, kind: int, index: int, posted: float, point: ChainPoint | None
    ) -> HeapItem:
        """Post an event at ``at``, as if posted at ``posted`` (ties go to the earlier)."""
        self.seq += 1
        item = (at, kind, posted, point, self.seq, index)
        heapq.heappush(self.heap, item)
        return item

    def _push_step(self, rep: Replica, end: float, result: StepResult) -> HeapItem:
        """Post the completion of a continuous-batching replica's step in flight."""
        history = rep.history
        point = ChainPoint(history, len(history) - 1, rep.origin)
        item = self._push(end, _STEP, rep.index, history[-1], point)
        rep.inflight[item[4]] = result
        return item

    def _begin(self, rep: Replica, now: float, inline: bool) -> None:
        """Start a continuous-batching replica's next step, or decode run, at ``now``.

        ``inline`` means the run loop's own path, which accounts busy time as
        the step's duration; otherwise ``start_step`` accounts it.
        """
        engine = rep.engine
        steps = PROGRESS_EVERY_STEPS - rep.steps % PROGRESS_EVERY_STEPS
        run = engine.plan_decode(steps) if steps > 1 else None
        if run is None:
            if not inline:
                result = rep.start_step(now)
                if result is None:
                    return
            else:
                result = engine.step(now)
                if result is None:
                    return
                duration = result.duration_s
                rep.busy_s += duration
                rep.slot_s += duration * (engine.num_requests_running + len(result.finished))
                rep.busy_until = now + duration
            rep.history.append(now)
            self._push_step(rep, now + result.duration_s, result)
            return
        times = list(accumulate(run.durations_s, initial=now))  # t + duration, chained
        base = len(rep.history)
        rep.history.extend(times[:-1])
        item = self._push_step(rep, times[-1], run.result(run.steps - 1))
        rep.span = DecodeSpan(run, times, item, base, inline)

    def _sync(self, rep: Replica) -> None:
        """Bring a replica in a decode span up to the event being handled.

        Applies the span's steps that step-by-step driving would have started
        by now (a boundary at the current instant counts if its event sorts
        before the current one) and re-posts the one in flight, if not the last.
        """
        span = rep.span
        if span is None:
            return
        at, kind, posted, point, _, _ = self.event
        times = span.times
        last = len(times) - 1
        steps = 1
        while steps < last:
            t = times[steps]
            if t > at:
                break
            if t == at and kind == _STEP:
                prev = times[steps - 1]
                if prev > posted:
                    break
                if prev == posted and point is not None:
                    mine = ChainPoint(rep.history, span.base + steps - 1, rep.origin)
                    if not mine < point:
                        break
            steps += 1
        rep.commit(steps)
        if steps < last:
            item = span.item
            del rep.inflight[item[4]]
            self.heap.remove(item)
            heapq.heapify(self.heap)
            del rep.history[span.base + steps :]
            self._push_step(rep, times[steps], span.run.result(steps - 1))

    def _after(self, now: float) -> None:
        """Start steps on replicas that got work, and re-arm the scheduler tick."""
        for rep in self.touched:
            rep.touched = False
            if rep.independent:
                self._step(rep, now)
            elif not rep.inflight and not rep.waking:
                rep.waking = True
                self._push(now, _WAKE, rep.index, now, None)
        self.touched.clear()
        wakeup = self.scheduler.next_wakeup()
        if wakeup is None:
            self.tick_at = None
            self.tick_seq = -1
            return
        wakeup = max(wakeup, now, self.last_tick + _TICK_GUARD_S)
        if wakeup != self.tick_at:
            self.tick_at = wakeup
            self.tick_seq = self._push(wakeup, _TICK, 0, now, None)[4]

    def _step(self, rep: Replica, now: float) -> None:
        if not rep.independent:
            self._begin(rep, now, False)
            return
        result = rep.start_step(now)
        if result is not None:
            item = self._push(now + result.duration_s, _STEP, rep.index, now, None)
            rep.inflight[item[4]] = result

    # ------------------------------------------------------------------ events

    def _on_arrival(self, req: SimRequest, now: float) -> None:
        wl = req.workload
        try:
            self.engine_config.check_request(wl.prompt_tokens, wl.max_tokens)
        except ValueError:
            req.end(TOO_LARGE, now)
            return
        deadline = None if wl.deadline_ms is None else now + wl.deadline_ms / 1000.0
        ticket = Ticket(
            id=req.ticket_id,
            model=self.model,
            tenant=wl.tenant,
            lane=wl.lane,
            priority=wl.priority,
            prompt_tokens=wl.prompt_tokens,
            max_tokens=wl.max_tokens,
            arrival=now,
            deadline=deadline,
            true_output_tokens=wl.output_tokens,
        )
        self.live[req.ticket_id] = req
        self._execute(self.scheduler.submit(ticket, now), now)
        self._after(now)

    def _on_step(self, rep: Replica, result: StepResult, now: float) -> None:
        running = rep.running
        touched_scheduler = False
        for eid in result.first_token:
            req = running.get(eid)
            if req is not None:
                req.first_token_s = now
                self.scheduler.progress(req.ticket_id, 1)
        if result.finished:
            decisions: list[Decision] = []
            for eid in result.finished:
                req = running.pop(eid, None)
                if req is None:
                    continue  # aborted while the step was in flight
                req.generated = req.target
                req.end(COMPLETED, now)
                del self.live[req.ticket_id]
                ttft = None if req.first_token_s is None else req.first_token_s - req.admitted_s
                usage = Usage(req.workload.prompt_tokens, req.target, ttft_s=ttft)
                decisions.extend(self.scheduler.complete(req.ticket_id, usage, now))
                touched_scheduler = True
            self._execute(decisions, now)
        rep.steps += 1
        if rep.steps % PROGRESS_EVERY_STEPS == 0:
            self._report_progress(rep)
        if rep.independent or not rep.inflight:
            self._step(rep, now)
        if touched_scheduler or self.touched:
            self._after(now)

    def _on_wake(self, rep: Replica, now: float) -> None:
        """An idle replica got work earlier at this instant: start its first step now."""
        rep.waking = False
        if not rep.inflight:
            _, _, posted, _, seq, _ = self.event
            rep.history = array("d")  # a new chain of steps starts here
            rep.origin = (posted, seq)
            self._step(rep, now)

    def _on_tick(self, now: float) -> None:
        self.tick_at = None
        self.tick_seq = -1
        self.last_tick = now
        self._execute(self.scheduler.tick(now), now)
        self._after(now)

    def _on_scrape(self, now: float, next_arrival: float) -> None:
        """Feed every replica's metrics to the scheduler, sample, and plan the next scrape."""
        for rep in self.replicas:
            self._sync(rep)
            engine = rep.engine
            stats = BackendStats(
                model=self.model,
                backend=rep.name,
                kv_cache_usage=engine.kv_cache_usage,
                num_requests_running=engine.num_requests_running,
                num_requests_waiting=engine.num_requests_waiting,
            )
            self._execute(self.scheduler.observe_backend(stats, now), now)
        view = self.scheduler.view(self.model, now)
        self.samples.add(
            now,
            {lane.name: lane.queued for lane in view.lanes},
            [rep.engine.num_requests_running for rep in self.replicas],
            [rep.engine.num_requests_waiting for rep in self.replicas],
            [rep.engine.kv_cache_usage for rep in self.replicas],
        )
        self._after(now)
        if self.progress is not None:
            self.progress(now)
        # While work remains scrape every interval; across idle gaps skip to the next arrival.
        if self.scheduler.live_tickets() or any(rep.inflight for rep in self.replicas):
            self.scrape_k += 1
        elif next_arrival < math.inf:
            k = int((next_arrival - self.start) // self.interval)
            self.scrape_k = max(self.scrape_k + 1, k)
        else:
            return
        self._push(self.start + self.scrape_k * self.interval, _SCRAPE, 0, now, None)

    def _report_progress(self, rep: Replica) -> None:
        engine = rep.engine
        for eid, req in rep.running.items():
            try:
                generated = engine.generated(eid)
            except KeyError:  # finished inside a step still in flight
                continue
            self.scheduler.progress(req.ticket_id, generated)

    # ------------------------------------------------------------------ decisions

    def _execute(self, decisions: Iterable[Decision], now: float) -> None:
        queue = deque(decisions)
        while queue:
            decision = queue.popleft()
            if isinstance(decision, Admit):
                self._admit(decision, now)
            elif isinstance(decision, Queued):
                continue
            elif isinstance(decision, Reject):
                self.live.pop(decision.ticket.id).end(decision.outcome.value, now)
            elif isinstance(decision, Expire):
                self.live.pop(decision.ticket.id).end(_EXPIRED, now)
            elif isinstance(decision, Preempt):
                queue.extend(self._preempt(decision, now))
            elif isinstance(decision, Reserve):
                queue.extend(self.scheduler.grant(decision.ticket.id, now))

    def _admit(self, decision: Admit, now: float) -> None:
        req = self.live[decision.ticket.id]
        rep = self.by_backend[decision.backend]
        self._sync(rep)
        rep.add(req, now)
        if not rep.touched:
            rep.touched = True
            self.touched.append(rep)

    def _preempt(self, decision: Preempt, now: float) -> list[Decision]:
        req = self.live[decision.ticket.id]
        rep = self.by_backend[decision.backend]
        self._sync(rep)
        generated = rep.abort(req, now)
        if not rep.touched:
            rep.touched = True
            self.touched.append(rep)
        if decision.action is PreemptAction.REQUEUE:
            req.requeues += 1
            req.first_token_s = None
        else:
            req.generated = generated
            req.end(PREEMPTED, now)
            del self.live[req.ticket_id]
        usage = Usage(req.workload.prompt_tokens, generated)
        return self.scheduler.complete(req.ticket_id, usage, now)

    # ------------------------------------------------------------------ result

    def _result(self) -> SimResult:
        start = self.start
        ends = [req.finish_s for req in self.requests if req.finish_s is not None]
        arrivals = [req.workload.arrival_s for req in self.arrivals[-1:]]
        end = max([start, *arrivals, *ends])
        if self.progress is not None:
            self.progress(max(end, start + self.scrape_k * self.interval))
        model_spec = next(m for m in self.spec.models if m.name == self.model)
        slo_s = {name: lane.slo_ms / 1000.0 for name, lane in self.lanes.items()}
        records = [req.record(slo_s[req.workload.lane]) for req in self.requests]
        return SimResult(
            model=self.model,
            policies={lane.name: lane.policy for lane in model_spec.lanes},
            slo_s={lane.name: lane.slo_ms / 1000.0 for lane in model_spec.lanes},
            tenant_weights={t.name: t.weight for t in self.spec.tenants},
            replicas=len(self.replicas),
            max_num_seqs=self.engine_config.max_num_seqs,
            records=tuple(records),
            samples=self.samples.freeze(),
            start_s=start,
            end_s=end,
            busy_s=tuple(rep.busy_s for rep in self.replicas),
            slot_s=tuple(rep.slot_s for rep in self.replicas),
            engine_steps=sum(rep.steps for rep in self.replicas),
            engine_preemptions=sum(rep.engine.num_preemptions_total for rep in self.replicas),
        )
