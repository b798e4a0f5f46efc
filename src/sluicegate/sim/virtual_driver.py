"""The simulator: a virtual-clock driver of the real ``core.Scheduler`` and N engine replicas.

This module holds the event loop and drives the scheduler; carrying out its
decisions (``Admit`` → ``Engine.add_request``, ``Preempt`` → ``Engine.abort``, …) is
``sim/execute.py``'s job, stepping the engine replicas is ``sim/replica.py``'s, and
the heap and its tie-breaking order are ``sim/events.py``'s. Arrivals are read
from the sorted workload rather than pushed on the heap. An abort drops any
tokens still pending in the replica's in-flight step.

A request whose ``prompt + max_tokens`` the engine could never hold is never
submitted (a gateway answers it 400 at once); its outcome is ``too_large``.

A backend with ``priority_passthrough: true`` is a replica whose engine runs vLLM's
priority scheduler (``scheduling_policy="priority"``) and receives each ticket's
priority: passthrough means the engine was started with ``--scheduling-policy
priority`` (vLLM refuses a non-zero priority otherwise). The others run ``engine``
as given.

Each request's ticket carries its prompt's engine-block hashes (``Ticket.block_hashes``,
the workload's ``prefix`` expanded to engine blocks by ``sim/workloads/trace_blocks.py``),
the same hashes its engine caches. When the model's engines publish KV events
(``sim/replica_kv_events.py``), batches due by an event's time reach
``Scheduler.observe_kv_events`` before that event is handled.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from sluicegate.core.scheduler import Scheduler
from sluicegate.core.spec import SchedulerSpec
from sluicegate.core.ticket import BackendStats, Ticket, TicketId
from sluicegate.engine.engine_config import EngineConfig
from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.events import (
    ARRIVAL,
    DELIVER,
    RESPONSE,
    SCRAPE,
    STEP,
    TICK,
    EventQueue,
    HeapItem,
)
from sluicegate.sim.live import SimRequest
from sluicegate.sim.prefix_hits import PrefixCounts
from sluicegate.sim.replica import Replica
from sluicegate.sim.replica_backends import engine_of, with_replicas
from sluicegate.sim.replica_kv_events import KvEventFeed
from sluicegate.sim.result import TOO_LARGE, SampleLog, SimResult
from sluicegate.sim.step_responses import StepResponses
from sluicegate.sim.workloads.trace_blocks import EngineBlocks

__all__ = ["SimResult", "simulate", "with_replicas"]

_TICK_GUARD_S = 1e-6


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
    kv_event_delay_s: float = 0.0,
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
        kv_event_delay_s: how long after its engine step a replica's KV events reach the
            scheduler, when its engines publish them (``sim/replica_kv_events.py``).

    Raises:
        KeyError: ``model`` is not configured.
        ValueError: a request names a lane the model lacks, a trace block size that
            is not a whole number of engine blocks, or bad arguments.
    """
    if scrape_interval_s <= 0:
        raise ValueError(f"scrape_interval_s must be > 0, got {scrape_interval_s}")
    replicated = with_replicas(spec, model, replicas)  # checks the model exists
    feed = KvEventFeed.for_model(next(m for m in spec.models if m.name == model), kv_event_delay_s)
    sim = _Simulation(replicated, model, workload, engine, seed, feed)
    return sim.run(scrape_interval_s, progress)


class _Simulation(StepResponses):
    """One run's state; ``run`` is the event loop."""

    def __init__(
        self,
        spec: SchedulerSpec,
        model: str,
        workload: list[WorkloadRequest],
        engine: EngineConfig,
        seed: int,
        kv_feed: KvEventFeed | None = None,
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
        # What vLLM reports as ``num_gpu_blocks × block_size``; nothing for an
        # engine of independent servers, which models no shared KV cache.
        self.kv_capacity_tokens = (
            None if engine.batch_independent else engine.num_blocks * engine.block_size
        )
        self.scheduler = Scheduler(spec)
        self.events = EventQueue()
        self.replicas = [
            Replica(
                i, b.name, engine_of(b, engine), seed + i, self.events,
                passthrough=b.priority_passthrough, kv_feed=kv_feed,
            )
            for i, b in enumerate(model_spec.backends)
        ]  # fmt: skip
        self.kv_feed = kv_feed
        self.by_backend = {rep.name: rep for rep in self.replicas}
        order = sorted(range(len(workload)), key=lambda i: (workload[i].arrival_s, i))
        blocks = EngineBlocks(engine.block_size)
        self.requests = [
            SimRequest(i, w, blocks.expand(w.prefix, w.prefix_block_tokens, w.prompt_tokens))
            for i, w in enumerate(workload)
        ]
        self.arrivals = [self.requests[i] for i in order]
        self.live: dict[TicketId, SimRequest] = {}
        self.touched: list[Replica] = []
        self.tick_seq = -1
        self.event: HeapItem = (0.0, ARRIVAL, 0.0, None, 0, 0)
        self.tick_at: float | None = None
        self.last_tick = float("-inf")
        self.samples = SampleLog(list(self.lanes))
        self.estimated_wait: dict[int, float] = {}
        self.request_overhead_s = engine.request_overhead_s
        self.response_overhead_s = engine.response_overhead_s
        self.deliveries: dict[int, tuple[SimRequest, int]] = {}
        self.in_transit: dict[TicketId, int] = {}
        self.responses: dict[int, tuple[list[str], list[str]]] = {}
        self.start = 0.0
        self.interval = 1.0
        self.scrape_k = 0
        self.progress: Callable[[float], None] | None = None

    # ------------------------------------------------------------------ loop

    def run(self, interval: float, progress: Callable[[float], None] | None) -> SimResult:
        """Process events until no arrival, request or engine step is left.

        ``self.event`` is the event being handled, which ``Replica.sync`` compares
        step boundaries against. Every event that reaches the scheduler first
        gets the progress reports replicas in decode runs owe it.
        """
        heap = self.events.heap
        arrivals = self.arrivals
        replicas = self.replicas
        times = [req.workload.arrival_s for req in arrivals]
        count = len(times)
        self.start = times[0] if count else 0.0
        self.interval = interval
        self.progress = progress
        if count:
            self.events.push(self.start, SCRAPE, 0, self.start, None)
        # The preset's KV capacity is known before the first request (an ``auto`` budget).
        if self.kv_capacity_tokens is not None:
            for rep in replicas:
                stats = BackendStats(
                    self.model, rep.name, kv_capacity_tokens=self.kv_capacity_tokens
                )
                self._execute(self.scheduler.observe_backend(stats, self.start), self.start)
        pop = heapq.heappop
        feed = self.kv_feed
        report = self.scheduler.progress
        i = 0
        next_at = times[0] if count else math.inf
        while True:
            if heap and (heap[0][0] < next_at or (heap[0][0] == next_at and heap[0][1] < ARRIVAL)):
                item = pop(heap)
                now, kind, posted, _, seq, index = item
                if feed is not None:
                    feed.deliver(now, self.scheduler)
                if kind == STEP:
                    rep = replicas[index]
                    result = rep.finish_step(seq, now, report)
                    if result is not None:
                        self.event = item
                        self._flush_progress()
                        self._on_step(rep, result, now)
                    continue
                self.event = item
                if kind == TICK:
                    if seq == self.tick_seq:
                        self._flush_progress()
                        self._on_tick(now)
                elif kind == SCRAPE:
                    self._flush_progress()
                    self._on_scrape(now, next_at)
                elif kind == RESPONSE:
                    self._flush_progress()
                    first, finished = self.responses.pop(seq)
                    if self._on_tokens(replicas[index], first, finished, now) or self.touched:
                        self._after(now)
                elif kind == DELIVER:
                    self._deliver(replicas[index], seq, now)
                    self._after(now)
                else:
                    replicas[index].wake(now, posted, seq)
            elif i < count:
                if feed is not None:
                    feed.deliver(next_at, self.scheduler)
                self.event = (next_at, ARRIVAL, next_at, None, 0, 0)
                self._flush_progress()
                self._on_arrival(arrivals[i], next_at)
                i += 1
                next_at = times[i] if i < count else math.inf
            else:
                return self._result()

    def _flush_progress(self) -> None:
        """Before ``self.event`` reaches the scheduler, make the progress reports that
        replicas in decode runs owe it (``Replica.flush_progress``)."""
        event = self.event
        at = event[0]
        for rep in self.replicas:
            if rep.report_at <= at:
                rep.flush_progress(event, self.scheduler.progress)

    def _after(self, now: float) -> None:
        """Start steps on replicas that got work, and re-arm the scheduler tick."""
        for rep in self.touched:
            rep.touched = False
            rep.resume(now)
        self.touched.clear()
        wakeup = self.scheduler.next_wakeup()
        if wakeup is None:
            self.tick_at = None
            self.tick_seq = -1
            return
        wakeup = max(wakeup, now, self.last_tick + _TICK_GUARD_S)
        if wakeup != self.tick_at:
            self.tick_at = wakeup
            self.tick_seq = self.events.push(wakeup, TICK, 0, now, None)[4]

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
            prefix_key=wl.prefix_key,
            block_hashes=req.block_hashes,
        )
        self.live[req.ticket_id] = req
        self._execute(self.scheduler.submit(ticket, now), now)
        self._after(now)

    def _on_tick(self, now: float) -> None:
        self.tick_at = None
        self.tick_seq = -1
        self.last_tick = now
        self._execute(self.scheduler.tick(now), now)
        self._after(now)

    def _on_scrape(self, now: float, next_arrival: float) -> None:
        """Feed every replica's metrics to the scheduler, sample, and plan the next scrape."""
        event = self.event
        for rep in self.replicas:
            engine = rep.engine
            stats = BackendStats(
                model=self.model,
                backend=rep.name,
                kv_cache_usage=rep.kv_cache_usage(event),
                num_requests_running=engine.num_requests_running,
                num_requests_waiting=engine.num_requests_waiting,
                kv_capacity_tokens=self.kv_capacity_tokens,
            )
            self._execute(self.scheduler.observe_backend(stats, now), now)
        view = self.scheduler.view(self.model, now)
        self.samples.add(
            now,
            {lane.name: lane.queued for lane in view.lanes},
            [rep.engine.num_requests_running for rep in self.replicas],
            [rep.engine.num_requests_waiting for rep in self.replicas],
            [rep.kv_cache_usage(event) for rep in self.replicas],
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
        self.events.push(self.start + self.scrape_k * self.interval, SCRAPE, 0, now, None)

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
            prompt_tokens_queried=sum(r.engine.prefix_cache.query_tokens for r in self.replicas),
            prompt_tokens_cached=sum(r.engine.prefix_cache.hit_tokens for r in self.replicas),
            estimated_wait_s=self.estimated_wait,
            prefix_by_replica={
                r.name: PrefixCounts.of(r.engine.prefix_cache) for r in self.replicas
            },
        )
