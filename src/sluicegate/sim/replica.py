"""One engine replica in the simulator: stepping the engine model and posting its step events.

Engine semantics (``engine/model.py``): ``step(now)`` changes the engine's
state at once and returns what the step emits, which the driver applies at
``now + duration_s``. A continuous-batching replica has one step in flight and
takes new requests at the next step boundary, as vLLM does. A
``batch_independent`` replica is c independent servers whose token events
fall at exact times, so it steps after every change and lets several steps be
in flight: each reports its event exactly on time, which is what makes the
Erlang C checks exact.

Decode runs: most steps of a continuous-batching replica are pure decodes
that change nothing outside it. When ``Engine.plan_decode`` offers a run of
them (up to the next finish, at most ``MAX_RUN_STEPS``), the replica posts one
event for the end of the run instead of one per step, and applies the run's
steps when that event comes. Anything that changes the replica earlier (an
admission, a preemption) first applies the steps that would have started by
then (``sync``) and re-posts the one in flight; a scrape reads the KV usage the
started steps give without ending the run. The progress reports due every
``PROGRESS_EVERY_STEPS`` steps inside a run are made when the next event reaches
the scheduler (``flush_progress``, the driver calls it), with the counts of the
latest report that would have been made by then, and busy time accrues as
step-by-step driving adds it; so every outcome, time and sample is the same as
stepping one event at a time.

Priority passthrough: a replica whose backend has ``priority_passthrough: true``
hands the engine each ticket's priority (``add_request(priority=…)``; sluicegate's
and vLLM's both run lower first), and its engine runs the priority policy
(``EngineConfig.scheduling_policy="priority"``, set by the driver): the field is
only useful, and vLLM only accepts a non-zero one, on an engine started with
``--scheduling-policy priority``.

KV events: a replica given a ``KvEventFeed`` records its prefix cache's stores and
evictions and hands them to the feed after every engine step (``sim/replica_kv_events.py``).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from itertools import accumulate

from sluicegate.engine.engine_config import EngineConfig
from sluicegate.engine.model import Engine, StepResult
from sluicegate.sim.decode_span import DecodeSpan
from sluicegate.sim.events import STEP, WAKE, ChainPoint, EventQueue, HeapItem
from sluicegate.sim.live import SimRequest
from sluicegate.sim.replica_kv_events import KvEventFeed
from sluicegate.sim.replica_progress import PROGRESS_EVERY_STEPS, ProgressReports, Report

MAX_RUN_STEPS = 256
"""The longest decode run planned at once (a run cut short wastes the rest of its plan)."""


class Replica(ProgressReports):
    """One engine replica and the driver's bookkeeping around it.

    Attributes:
        inflight: steps started and not yet applied, by heap sequence number.
        running: requests on the engine (waiting or running), by engine id.
        busy_s: time with a step in flight (the union, when steps overlap).
        slot_s: ∫ running-batch size dt over the same time.
        span: the decode run in progress, if any (its steps are not on the engine yet).
        history: start times of the steps since the wake that started this chain.
        origin: ``(time posted, sequence)`` of that wake.
        touched: the driver's mark: decisions at this instant gave it work (see ``resume``).
        passthrough: hand the engine each request's priority (see the module docstring).
        kv_feed: where the engine's KV events go after each step (``None``: not recorded).
    """

    __slots__ = ("busy_s", "busy_until", "engine", "events", "history", "independent",
                 "index", "inflight", "kv_feed", "name", "origin", "passthrough", "running",
                 "slot_s", "span", "steps", "touched", "waking")  # fmt: skip

    def __init__(
        self,
        index: int,
        name: str,
        config: EngineConfig,
        seed: int,
        events: EventQueue,
        *,
        passthrough: bool = False,
        kv_feed: KvEventFeed | None = None,
    ) -> None:
        self.index = index
        self.passthrough = passthrough
        self.name = name
        self.engine = Engine(config, seed=seed)
        self.kv_feed = kv_feed
        self.engine.prefix_cache.recording = kv_feed is not None
        self.events = events
        self.independent = config.batch_independent
        self.inflight: dict[int, StepResult] = {}
        self.running: dict[str, SimRequest] = {}
        self.busy_s = self.slot_s = 0.0
        self.busy_until = float("-inf")
        self.steps = self.reported = 0
        self.report_at = math.inf
        self.touched = False
        self.waking = False
        self.span: DecodeSpan | None = None
        self.history: array[float] = array("d")
        self.origin = (-math.inf, 0)

    # ------------------------------------------------------------------ requests

    def assign(self, req: SimRequest, now: float) -> None:
        """The gateway dispatches ``req`` to this replica at ``now`` (``add`` hands it to
        the engine, ``EngineConfig.request_overhead_s`` later)."""
        req.runs += 1
        req.eid = req.ticket_id if req.runs == 1 else f"{req.ticket_id}~{req.runs}"
        req.backend = self.name
        if req.admit_s is None:
            req.admit_s = now
        req.admitted_s = now
        req.first_token_s = None

    def add(self, req: SimRequest, now: float, priority: int = 0) -> None:
        """Hand an assigned request to the engine, arriving at ``now`` (with its ticket's
        ``priority`` if ``passthrough``)."""
        eid = req.eid
        wl = req.workload
        self.engine.add_request(
            eid, wl.prompt_tokens, wl.max_tokens, now,
            output_tokens=wl.output_tokens, prefix=req.block_hashes,
            priority=priority if self.passthrough else 0,
        )  # fmt: skip
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

    # ------------------------------------------------------------------ stepping

    def resume(self, now: float) -> None:
        """Decisions at ``now`` gave this replica work: get it stepping.

        A batch-independent replica steps at once. An idle continuous-batching one
        posts a wake at ``now``, which runs after every other event of the instant,
        so requests admitted together share its first step.
        """
        if self.independent:
            self.step(now)
        elif not self.inflight and not self.waking:
            self.waking = True
            self.events.push(now, WAKE, self.index, now, None)

    def wake(self, now: float, posted: float, seq: int) -> None:
        """Handle this replica's wake event (posted at ``posted`` as number ``seq``)."""
        self.waking = False
        if not self.inflight:
            self.history = array("d")  # a new chain of steps starts here
            self.origin = (posted, seq)
            self.step(now)

    def finish_step(self, seq: int, now: float, report: Report) -> StepResult | None:
        """Apply the step (or decode run) whose completion ``seq`` is due at ``now``.

        A step that emitted neither a first nor a last token and reports no
        progress concerns no one else: it is counted and the next one started
        here, and ``None`` returned. Otherwise its result is returned, and the
        driver hands its tokens to the scheduler, then calls ``step_handled``.
        A decode run's progress reports not yet made go to ``report`` here.
        """
        result = self.inflight.pop(seq)
        span = self.span
        if span is not None:
            steps = span.run.steps
            self._report_span(span, steps, report)
            self.commit(steps)
        elif self.steps % PROGRESS_EVERY_STEPS == PROGRESS_EVERY_STEPS - 1:
            return result
        if self.independent or result.first_token or result.finished:
            return result
        self.steps += 1
        # After a report the next step starts as ``step_handled`` would start it.
        self.begin(now, self.steps % PROGRESS_EVERY_STEPS != 0)
        return None

    def kv_cache_usage(self, event: HeapItem) -> float:
        """The engine's KV usage as step-by-step driving would have it at ``event``: with
        the steps of a decode run started by then applied (the run goes on)."""
        span = self.span
        if span is None:
            return self.engine.kv_cache_usage
        steps = span.passed(event, self.history, self.origin)
        return self.engine.kv_cache_usage_after(span.run, steps)

    def step_handled(self, now: float, report: Report) -> None:
        """After the driver handled a step's result: count it, report progress every
        ``PROGRESS_EVERY_STEPS`` steps (see ``report_progress``), and start the next step
        unless one is still in flight (a batch-independent replica, whose servers are
        independent, always tries)."""
        self.steps += 1
        if self.steps % PROGRESS_EVERY_STEPS == 0:
            self.reported = self.steps
            self.report_progress(report)
        if self.independent or not self.inflight:
            self.step(now)

    def step(self, now: float) -> None:
        """Start the next step at ``now`` (if the engine has work) and post its completion."""
        if not self.independent:
            self.begin(now, False)
            return
        result = self.start_step(now)
        if result is not None:
            item = self.events.push(now + result.duration_s, STEP, self.index, now, None)
            self.inflight[item[4]] = result

    def start_step(self, now: float, contiguous: bool = False) -> StepResult | None:
        """Run ``engine.step(now)`` and account its busy time; ``None`` when idle.

        ``contiguous``: the step starts where the replica's last one ended, and its
        whole duration counts as busy time; otherwise only the part after
        ``busy_until`` counts, as a batch-independent replica's steps overlap.
        """
        engine = self.engine
        result = engine.step(now)
        if result is not None:
            # Sequences in the step: those still running plus those it finished.
            batch = engine.num_requests_running + len(result.finished)
            duration = result.duration_s
            self._account(now, now + duration, duration, (), batch, contiguous)
            if self.kv_feed is not None:
                drained = engine.prefix_cache.drain_events()
                self.kv_feed.publish(self.name, drained, now + duration)
        return result

    def begin(self, now: float, contiguous: bool) -> None:
        """Start a continuous-batching replica's next step, or decode run, at ``now``.

        ``contiguous``: ``finish_step`` starts it where the last step ended (see
        ``start_step``).
        """
        engine = self.engine
        run = engine.plan_decode(MAX_RUN_STEPS)
        if run is None:
            result = self.start_step(now, contiguous)
            if result is None:
                return
            self.history.append(now)
            self._post(now + result.duration_s, result)
            return
        times = list(accumulate(run.durations_s, initial=now))  # t + duration, chained
        base = len(self.history)
        self.history.extend(times[:-1])
        item = self._post(times[-1], run.result(run.steps - 1))
        span = DecodeSpan(run, times, item, base, contiguous, self.steps)
        self.span = span
        self._next_report(span)

    def sync(self, event: HeapItem) -> None:
        """Bring a replica in a decode span up to ``event``, the event being handled.

        Applies the span's steps that step-by-step driving would have started
        by now (a boundary at the current instant counts if its event sorts
        before the current one) and re-posts the one in flight, if not the last.
        """
        span = self.span
        if span is None:
            return
        times = span.times
        last = len(times) - 1
        steps = span.passed(event, self.history, self.origin)
        self.commit(steps)
        if steps < last:
            item = span.item
            del self.inflight[item[4]]
            self.events.remove(item)
            del self.history[span.base + steps :]
            self._post(times[steps], span.run.result(steps - 1))

    def commit(self, steps: int) -> None:
        """Apply the first ``steps`` steps of the span to the engine and end the span.

        Busy and slot time accrue per step, as stepping one event at a time would
        have added them (a step after a progress report in ``_account``'s
        non-contiguous form, as ``step_handled`` starts it); the completions of all
        but the last step count as processed.
        """
        span = self.span
        assert span is not None
        self.span = None
        self.report_at = math.inf
        run = span.run
        times = span.times
        self.engine.advance_decode(run, steps, times[steps - 1])
        durations = run.durations_s
        rest = list(durations[1:steps])
        # Step j follows the report at the replica's step count steps_before + j.
        for j in range(-span.steps_before % PROGRESS_EVERY_STEPS or PROGRESS_EVERY_STEPS,
                       steps, PROGRESS_EVERY_STEPS):  # fmt: skip
            rest[j - 1] = times[j + 1] - times[j]
        batch = len(run.req_ids)
        self._account(times[0], times[steps], durations[0], rest, batch, span.contiguous)
        self.steps += steps - 1

    def _post(self, end: float, result: StepResult) -> HeapItem:
        """Post the completion of a continuous-batching replica's step in flight."""
        history = self.history
        point = ChainPoint(history, len(history) - 1, self.origin)
        item = self.events.push(end, STEP, self.index, history[-1], point)
        self.inflight[item[4]] = result
        return item

    def _account(
        self,
        start: float,
        end: float,
        first: float,
        rest: Sequence[float],
        batch: int,
        contiguous: bool,
    ) -> None:
        """Add busy and slot time: a step of ``first`` seconds at ``start``, then steps of
        ``rest`` seconds back to back, the last ending at ``end``; ``batch`` sequences each.

        Every step after the first starts where the previous one ended and adds its
        whole duration; so does the first when ``contiguous``. Otherwise the first
        adds only its part after ``busy_until``. (For a step starting exactly at
        ``busy_until`` the two differ only in rounding; keeping each caller's form
        keeps seeded results bit for bit.)
        """
        until = self.busy_until
        gained = first
        if not contiguous:
            first_end = start + first
            gained = first_end - max(start, until) if first_end > until else 0.0
        busy = self.busy_s + gained
        slot = self.slot_s + gained * batch
        for duration in rest:
            busy += duration
            slot += duration * batch
        self.busy_s, self.slot_s = busy, slot
        if end > until:
            self.busy_until = end
