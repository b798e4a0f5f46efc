"""A sans-I/O, step-driven model of a continuous-batching LLM engine (vLLM v1 style).

Driving it: ``step(now)`` decides one iteration and returns a ``StepResult``
whose outputs the driver applies at ``now + duration_s``, then calls ``step``
again at that time (a simulator jumps its clock, an emulator sleeps). ``None``
means idle: call ``step`` again after the next ``add_request``.

Scheduling, per step (as vLLM v1's ``Scheduler.schedule``):

1. Running sequences, oldest admission first, each get the tokens they still
   need (1 for a decode, the rest of the prompt for a chunked prefill) within
   the step's token budget. If the KV cache lacks a block for one of them, the
   most recently admitted running sequence is preempted (recompute): its KV is
   freed and it goes back to the front of the waiting queue, to prefill its
   prompt plus the tokens generated so far again.
2. Only if nothing was preempted, waiting requests are admitted FCFS while a
   sequence slot, budget and KV blocks remain; the head of the queue blocks the
   rest (no skipping).

A sequence emits a token in the step that computes its last known token.

With ``EngineConfig.batch_independent`` the engine is instead ``max_num_seqs``
independent servers: a request starts when a server is free (FCFS) and its
tokens come at fixed offsets from its start — the first after its solo prefill
step, then one per solo decode step, so its service time is exactly
``EngineConfig.solo_service_s``. Each ``step`` advances to the next token event
of any request. A request starts at ``max(arrival, time its server became
free)`` even if ``step`` is called later, so queueing and service times are
exact; an event that falls before the call that discovers it is reported late,
at that call.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

from sluicegate.engine.config import EngineConfig
from sluicegate.engine.lengths import DEFAULT_LENGTH_MODEL, OutputLengthModel, resolve_output_tokens


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one engine step produced; the driver applies it at ``now + duration_s``.

    Attributes:
        duration_s: how long the step takes.
        tokens: tokens emitted this step per request (absent means none).
        first_token: requests whose first token is among ``tokens``.
        finished: requests that emitted their last token; they are gone from the engine.
        preempted: requests preempted (recompute) this step; they are waiting again.
        prefill_tokens: prompt (or recomputed) tokens processed in the step.
        decode_seqs: sequences that decoded one token in the step.
    """

    duration_s: float
    tokens: dict[str, int]
    first_token: list[str]
    finished: list[str]
    preempted: list[str]
    prefill_tokens: int = 0
    decode_seqs: int = 0


class _Seq:
    """One request inside the engine. ``total`` = prompt + generated tokens."""

    __slots__ = ("arrival", "blocks", "capacity", "computed", "done", "generated", "order",
                 "prefill_end", "prompt_tokens", "req_id", "target", "total")  # fmt: skip

    def __init__(self, req_id: str, prompt_tokens: int, target: int, arrival: float, order: int):
        self.req_id = req_id
        self.prompt_tokens = prompt_tokens
        self.target = target
        self.arrival = arrival
        self.order = order
        self.total = self.prefill_end = prompt_tokens
        self.generated = self.computed = self.blocks = self.capacity = 0
        self.done = False


class _StepOut:
    """Mutable accumulator for one step's outputs."""

    __slots__ = ("decode", "finished", "first", "kv", "preempted", "prefill", "released", "tokens")

    def __init__(self) -> None:
        self.tokens: dict[str, int] = {}
        self.first: list[str] = []
        self.finished: list[str] = []
        self.preempted: list[str] = []
        self.prefill = self.decode = self.kv = self.released = 0

    def result(self, duration_s: float) -> StepResult:
        return StepResult(
            duration_s, self.tokens, self.first, self.finished, self.preempted,
            self.prefill, self.decode,
        )  # fmt: skip


class Engine:
    """One modelled engine replica: waiting queue, running batch, KV blocks, step timing.

    Deterministic: the same config, seed, and sequence of calls give the same
    ``StepResult`` sequence. See the module docstring for the schedule.

    Args:
        config: capacity and timing.
        seed: mixes into every seeded output-length draw.
        length_model: distribution of output lengths for requests that stop at EOS.
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        seed: int = 0,
        length_model: OutputLengthModel = DEFAULT_LENGTH_MODEL,
    ) -> None:
        self._config = config
        self._seed = seed
        self._length_model = length_model
        self._seqs: dict[str, _Seq] = {}
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []
        self._num_blocks = config.num_blocks
        self._free_blocks = self._num_blocks
        self._order = 0
        self._preemptions = 0
        self._generation_tokens = 0
        self._now = float("-inf")
        # batch_independent mode: per-server free-since times and a token-event heap.
        self._free_since: list[float] = [float("-inf")] * config.max_num_seqs
        self._events: list[tuple[float, int, _Seq]] = []
        self._indep_running = 0

    @property
    def config(self) -> EngineConfig:
        """The engine's configuration."""
        return self._config

    @property
    def num_requests_running(self) -> int:
        """Requests in the running batch (vLLM ``vllm:num_requests_running``)."""
        if self._config.batch_independent:
            return self._indep_running
        return len(self._running)

    @property
    def num_requests_waiting(self) -> int:
        """Requests queued for admission (vLLM ``vllm:num_requests_waiting``)."""
        return len(self._waiting)

    @property
    def kv_cache_usage(self) -> float:
        """Used KV blocks / total blocks in [0, 1] (vLLM ``vllm:kv_cache_usage_perc``).

        In ``batch_independent`` mode KV never limits anything and this saturates at 1.
        """
        used = (self._num_blocks - self._free_blocks) / self._num_blocks
        return min(1.0, used) if self._config.batch_independent else used

    @property
    def num_preemptions_total(self) -> int:
        """Recompute preemptions so far (vLLM ``vllm:num_preemptions_total``)."""
        return self._preemptions

    @property
    def generation_tokens_total(self) -> int:
        """Tokens emitted so far (vLLM ``vllm:generation_tokens_total``)."""
        return self._generation_tokens

    @property
    def is_idle(self) -> bool:
        """True when no request is waiting or running."""
        return not self._seqs

    def generated(self, req_id: str) -> int:
        """Tokens emitted so far by a live request; ``KeyError`` once finished or aborted."""
        return self._seqs[req_id].generated

    def planned_output_tokens(
        self,
        req_id: str,
        prompt_tokens: int,
        max_tokens: int,
        *,
        output_tokens: int | None = None,
        ignore_eos: bool = False,
    ) -> int:
        """The output length ``add_request`` would give these arguments (for an oracle)."""
        return resolve_output_tokens(
            self._seed, req_id, prompt_tokens, max_tokens,
            output_tokens=output_tokens, ignore_eos=ignore_eos, model=self._length_model,
        )  # fmt: skip

    def add_request(
        self,
        req_id: str,
        prompt_tokens: int,
        max_tokens: int,
        now: float,
        *,
        output_tokens: int | None = None,
        ignore_eos: bool = False,
    ) -> None:
        """Queue a request (FCFS) arriving at ``now``.

        Raises:
            ValueError: duplicate id, non-positive sizes, or a request that could
                never run: ``prompt + max_tokens`` above the KV capacity, or above
                the step budget when chunked prefill is off.
        """
        if req_id in self._seqs:
            raise ValueError(f"request {req_id!r} is already in the engine")
        self._config.check_request(prompt_tokens, max_tokens)
        target = self.planned_output_tokens(
            req_id, prompt_tokens, max_tokens, output_tokens=output_tokens, ignore_eos=ignore_eos
        )
        self._order += 1
        seq = _Seq(req_id, prompt_tokens, target, now, self._order)
        self._seqs[req_id] = seq
        self._waiting.append(seq)
        self._now = max(self._now, now)
        if self._config.batch_independent:
            self._start_waiting()

    def abort(self, req_id: str, *, now: float | None = None) -> bool:
        """Remove a waiting or running request and free its KV at once.

        Args:
            req_id: the request.
            now: when it is aborted; only ``batch_independent`` mode uses it (the
                server is free from then). Defaults to the latest time the engine saw.

        Returns:
            Whether the request was in the engine.
        """
        seq = self._seqs.pop(req_id, None)
        if seq is None:
            return False
        seq.done = True
        if now is not None:
            self._now = max(self._now, now)
        if seq.blocks == 0:  # only waiting requests hold no KV
            self._waiting.remove(seq)
            return True
        self._free_blocks += seq.blocks
        seq.blocks = 0
        if self._config.batch_independent:
            self._indep_running -= 1
            heapq.heappush(self._free_since, self._now)
            self._start_waiting()
        else:
            self._running.remove(seq)
        return True

    def step(self, now: float) -> StepResult | None:
        """Run one iteration starting at ``now``; ``None`` when there is nothing to do."""
        self._now = max(self._now, now)
        if self._config.batch_independent:
            return self._step_independent(now)
        if not self._running and not self._waiting:
            return None
        out = _StepOut()
        budget = self._schedule_running(out, self._config.max_num_batched_tokens)
        if not out.preempted:
            self._admit_waiting(out, budget)
        if not out.tokens and not out.prefill and not out.preempted:
            raise RuntimeError("engine made no progress; an admission check is missing")
        self._free_blocks += out.released
        if out.finished:
            self._running = [s for s in self._running if not s.done]
        self._generation_tokens += len(out.tokens)
        return out.result(self._config.step_s(out.prefill, out.decode, out.kv))

    def _schedule_running(self, out: _StepOut, budget: int) -> int:
        """Step 1: advance running sequences in admission order; returns the budget left.

        This loop is the simulator's hot path, hence the inlined decode token.
        Preemption only pops sequences after the current one, which the list
        iterator then never reaches.
        """
        tokens = out.tokens
        prefill = decode = kv = 0
        for seq in self._running:
            if budget <= 0:
                break
            computed = seq.computed
            n = seq.total - computed
            if n > budget:
                n = budget
            new = computed + n
            if new > seq.capacity and not self._grow(seq, new, out):
                break
            budget -= n
            seq.computed = new
            kv += new
            if computed < seq.prefill_end:
                prefill += n
                if new == seq.total:
                    self._emit(seq, out)
                continue
            decode += 1
            generated = seq.generated + 1
            if generated >= seq.target:
                self._emit(seq, out)
            else:
                seq.generated = generated
                seq.total = new + 1
                tokens[seq.req_id] = 1
        out.prefill += prefill
        out.decode += decode
        out.kv += kv
        return budget

    def _grow(self, seq: _Seq, new: int, out: _StepOut) -> bool:
        """Give ``seq`` the blocks for ``new`` tokens, preempting the newest if KV is short.

        Returns:
            False if ``seq`` itself had to be preempted.
        """
        bs = self._config.block_size
        need = (new + bs - 1) // bs - seq.blocks
        if need > self._free_blocks and not self._preempt_until(seq, need, out):
            return False
        self._free_blocks -= need
        seq.blocks += need
        seq.capacity = seq.blocks * bs
        return True

    def _preempt_until(self, seq: _Seq, need: int, out: _StepOut) -> bool:
        """Preempt the newest running sequences until ``seq`` gets ``need`` free blocks.

        Returns:
            False if ``seq`` itself had to be preempted.
        """
        running = self._running
        while need > self._free_blocks:
            victim = running.pop()
            self._free_blocks += victim.blocks
            victim.blocks = victim.capacity = victim.computed = 0
            self._waiting.appendleft(victim)
            out.preempted.append(victim.req_id)
            self._preemptions += 1
            if victim is seq:
                return False
        return True

    def _admit_waiting(self, out: _StepOut, budget: int) -> None:
        """Step 2: admit waiting requests FCFS while slots, budget and KV allow."""
        cfg = self._config
        waiting = self._waiting
        slots = cfg.max_num_seqs - len(self._running)
        bs = cfg.block_size
        while waiting and budget > 0 and slots > 0:
            seq = waiting[0]
            n = seq.total
            if n > budget:
                if not cfg.enable_chunked_prefill:
                    break
                n = budget
            need = (n + bs - 1) // bs
            if need > self._free_blocks:
                break
            waiting.popleft()
            self._running.append(seq)
            slots -= 1
            self._free_blocks -= need
            seq.blocks = need
            seq.capacity = need * bs
            seq.computed = n
            seq.prefill_end = seq.total
            budget -= n
            out.prefill += n
            out.kv += n
            if n == seq.total:
                self._emit(seq, out)

    def _emit(self, seq: _Seq, out: _StepOut) -> None:
        """The sequence computed its last known token: it samples the next one."""
        generated = seq.generated + 1
        seq.generated = generated
        seq.total += 1
        req_id = seq.req_id
        out.tokens[req_id] = 1
        if generated == 1:
            out.first.append(req_id)
        if generated >= seq.target:
            out.finished.append(req_id)
            out.released += seq.blocks
            seq.blocks = 0
            seq.done = True
            del self._seqs[req_id]

    # --- batch_independent mode -------------------------------------------------

    def _start_waiting(self) -> None:
        """Start waiting requests FCFS on free servers, at ``max(arrival, free since)``."""
        cfg = self._config
        bs = cfg.block_size
        while self._waiting and self._free_since:
            seq = self._waiting.popleft()
            start = max(seq.arrival, heapq.heappop(self._free_since))
            p = seq.prompt_tokens
            seq.blocks = (p + bs - 1) // bs
            self._free_blocks -= seq.blocks
            self._indep_running += 1
            heapq.heappush(self._events, (start + cfg.step_s(p, 0, p), seq.order, seq))

    def _step_independent(self, now: float) -> StepResult | None:
        """Advance to the next token event (or report overdue ones at ``now``)."""
        events = self._events
        while events and events[0][2].done:
            heapq.heappop(events)
        if not events:
            return None
        when = max(events[0][0], now)
        out = _StepOut()
        while events and events[0][0] <= when:
            at, order, seq = heapq.heappop(events)
            if seq.done:
                continue
            self._independent_token(at, order, seq, out)
        self._free_blocks += out.released
        self._start_waiting()
        self._generation_tokens += len(out.tokens)
        return out.result(when - now)

    def _independent_token(self, at: float, order: int, seq: _Seq, out: _StepOut) -> None:
        """Emit one token of ``seq`` due at ``at`` and schedule its next one."""
        cfg = self._config
        context = seq.total
        if seq.generated == 0:
            out.prefill += context
        else:
            out.decode += 1
        out.kv += context
        self._emit(seq, out)
        if seq.done:
            self._indep_running -= 1
            heapq.heappush(self._free_since, at)
            return
        grown = (seq.total + cfg.block_size - 1) // cfg.block_size - seq.blocks
        seq.blocks += grown
        self._free_blocks -= grown
        heapq.heappush(self._events, (at + cfg.step_s(0, 1, seq.total), order, seq))
