"""A sans-I/O, step-driven model of a continuous-batching LLM engine (vLLM v1 style).

Driving it: ``step(now)`` decides one iteration and returns a ``StepResult``
whose outputs the driver applies at ``now + duration_s``, then calls ``step``
again at that time (a simulator jumps its clock, an emulator sleeps). ``None``
means idle: call ``step`` again after the next ``add_request``.

Scheduling, per step (as vLLM v1's ``Scheduler.schedule``; ``batch`` holds it):

1. Running sequences, oldest admission first, each get the tokens they still
   need (1 for a decode, the rest of the prompt for a chunked prefill) within
   the step's token budget. If the KV cache lacks a block for one of them, the
   most recently admitted running sequence is preempted (recompute): its KV is
   freed and it goes back to the front of the waiting queue, to prefill its
   prompt plus the tokens generated so far again.
2. Only if nothing was preempted, waiting requests are admitted FCFS while a
   sequence slot, budget and KV blocks remain; the head of the queue blocks the
   rest (no skipping).

With ``EngineConfig.scheduling_policy="priority"`` (vLLM's ``--scheduling-policy
priority``) the same two steps run with vLLM V1's priority rules
(``priority_schedule``): the waiting queue is ordered by ``(priority, arrival)``
(``add_request(priority=…)``, lower first), a preempted sequence goes back in
that order, and the KV victim is the running sequence with the largest
``(priority, arrival)``, not the newest. As in V1, a waiting request never
preempts a running one (V0 did). Under ``fcfs`` a non-zero priority is refused,
as vLLM refuses it ("Priority scheduling is not enabled").

A sequence emits a token in the step that computes its last known token.

With ``EngineConfig.batch_independent`` the engine is instead ``max_num_seqs``
independent servers: a request starts when a server is free (FCFS) and its
tokens come at fixed offsets from its start — the first after its solo prefill
step, then one per solo decode step, so its service time is exactly
``EngineConfig.solo_service_s``. Each ``step`` advances to the next token event
of any request. A request starts at ``max(arrival, time its server became
free)`` even if ``step`` is called later, so queueing and service times are
exact; an event that falls before the call that discovers it is reported late,
at that call (see ``servers``).

Prefix caching (``add_request(prefix=block hashes)``, see ``prefix_cache``): an
admitted request's leading cached blocks are not prefilled; its blocks are
cached after its prefill and at its end. Requests without hashes never touch it.

A simulator may skip the events of pure-decode steps: ``plan_decode`` says
which steps come next while nothing waits and nobody finishes, and
``advance_decode`` applies them (see ``decode``); ``kv_cache_usage_after`` reads
the KV usage part of a run would leave without applying it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from sluicegate.engine.decode import DecodeRun, apply_run, blocks_grown, plan_run
from sluicegate.engine.engine_config import EngineConfig
from sluicegate.engine.lengths import DEFAULT_LENGTH_MODEL, OutputLengthModel, resolve_output_tokens
from sluicegate.engine.prefix_cache import PrefixCache
from sluicegate.engine.priority_schedule import PrioritySchedule
from sluicegate.engine.servers import IndependentServers
from sluicegate.engine.step import SeqState, StepOutput, StepResult
from sluicegate.engine.waiting import PriorityWaiting, WaitingQueue

__all__ = ["DecodeRun", "Engine", "StepResult"]


class Engine(PrioritySchedule):
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
        self._seqs: dict[str, SeqState] = {}
        self._by_priority = config.scheduling_policy == "priority"
        self._waiting: WaitingQueue = PriorityWaiting() if self._by_priority else deque()
        self._running: list[SeqState] = []
        self._num_blocks = config.num_blocks
        self._free_blocks = self._num_blocks
        self._order = 0
        self._preemptions = 0
        self._generation_tokens = 0
        self._now = float("-inf")
        self._version = 0  # bumped by every change, so a stale DecodeRun is refused
        self._servers = IndependentServers(config) if config.batch_independent else None
        self._cache = PrefixCache()
        self._to_cache: list[tuple[int, ...]] = []

    @property
    def config(self) -> EngineConfig:
        """The engine's configuration."""
        return self._config

    @property
    def num_requests_running(self) -> int:
        """Requests in the running batch (vLLM ``vllm:num_requests_running``)."""
        if self._servers is not None:
            return self._servers.running
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
    def prefix_cache(self) -> PrefixCache:
        """The replica's prefix cache, with its query and hit token counters (read only)."""
        return self._cache

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
        prefix: Sequence[int] = (),
        priority: int = 0,
    ) -> None:
        """Queue a request arriving at ``now`` (FCFS, or by priority under that policy).

        ``prefix`` hashes the prompt's full KV blocks in order (more are ignored;
        none: no prefix caching). ``priority``: vLLM's request field, lower runs
        first; only the priority policy takes a non-zero one.

        Raises:
            ValueError: duplicate id, non-positive sizes, a request that could
                never run (``prompt + max_tokens`` above the KV capacity, or above
                the step budget when chunked prefill is off), or a non-zero
                ``priority`` under ``fcfs``.
        """
        if req_id in self._seqs:
            raise ValueError(f"request {req_id!r} is already in the engine")
        if priority != 0 and not self._by_priority:
            raise ValueError(
                f"Got priority {priority} but Priority scheduling is not enabled "
                "(scheduling_policy is fcfs)"
            )
        self._config.check_request(prompt_tokens, max_tokens)
        target = self.planned_output_tokens(
            req_id, prompt_tokens, max_tokens, output_tokens=output_tokens, ignore_eos=ignore_eos
        )
        self._order += 1
        self._version += 1
        full = 0 if self._servers is not None else prompt_tokens // self._config.block_size
        seq = SeqState(
            req_id, prompt_tokens, target, now, self._order, tuple(prefix[:full]), priority
        )
        self._seqs[req_id] = seq
        self._waiting.append(seq)
        self._now = max(self._now, now)
        if self._servers is not None:
            self._free_blocks -= self._servers.start_waiting(self._waiting)

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
        self._version += 1
        if now is not None:
            self._now = max(self._now, now)
        if seq.blocks == 0:  # only waiting requests hold no KV
            self._waiting.remove(seq)
            return True
        self._free_blocks += seq.blocks
        seq.blocks = 0
        if self._servers is not None:
            self._servers.release(self._now)
            self._free_blocks -= self._servers.start_waiting(self._waiting)
        else:
            self._running.remove(seq)
        return True

    def step(self, now: float) -> StepResult | None:
        """Run one iteration starting at ``now``; ``None`` when there is nothing to do."""
        self._now = max(self._now, now)
        self._version += 1
        if self._servers is not None:
            return self._step_independent(now, self._servers)
        if not self._running and not self._waiting:
            return None
        out = StepOutput()
        budget = self._config.max_num_batched_tokens
        if self._by_priority:
            budget = self._schedule_running_by_priority(out, budget)
        else:
            budget = self._schedule_running(out, budget)
        if not out.preempted:
            self._admit_waiting(out, budget)
        if not out.tokens and not out.prefill and not out.preempted:
            raise RuntimeError("engine made no progress; an admission check is missing")
        self._free_blocks += out.released
        if out.finished:
            self._running = [s for s in self._running if not s.done]
        self._generation_tokens += len(out.tokens)
        if self._to_cache:
            self._cache.insert_all(self._to_cache, self._free_blocks)
        return out.result(self._config.step_s(out.prefill, out.decode, out.kv, out.attn))

    def plan_decode(self, max_steps: int) -> DecodeRun | None:
        """The next pure-decode steps, up to ``max_steps``, without running them.

        A run exists while nothing waits, every running sequence decodes, and
        KV suffices; it stops before the first step that would finish a
        request. Its durations and tokens are those ``step`` would give.

        Returns:
            The run (at least one step), or ``None`` when the next step is not
            such a step (or in ``batch_independent`` mode): call ``step``.
        """
        if self._waiting or self._servers is not None:
            return None
        return plan_run(self._running, self._config, self._free_blocks, max_steps, self._version)

    def advance_decode(self, run: DecodeRun, steps: int, now: float) -> None:
        """Apply the first ``steps`` steps of ``run``, exactly as that many ``step`` calls.

        Args:
            run: planned by ``plan_decode`` with no change to the engine since.
            steps: how many, from 1 to ``run.steps``.
            now: when the last of them starts.

        Raises:
            ValueError: the engine changed since ``run`` was planned, or ``steps`` is out of range.
        """
        if run.version != self._version:
            raise ValueError("the engine changed since this decode run was planned")
        if not 1 <= steps <= run.steps:
            raise ValueError(f"steps must be in [1, {run.steps}], got {steps}")
        self._version += 1
        self._free_blocks -= apply_run(self._running, self._config.block_size, steps)
        self._generation_tokens += steps * len(self._running)
        self._now = max(self._now, now)

    def kv_cache_usage_after(self, run: DecodeRun, steps: int) -> float:
        """``kv_cache_usage`` as it will be once ``advance_decode(run, steps, …)`` is applied.

        Raises:
            ValueError: the engine changed since ``run`` was planned.
        """
        if run.version != self._version:
            raise ValueError("the engine changed since this decode run was planned")
        grown = blocks_grown(self._running, self._config.block_size, steps)
        return (self._num_blocks - (self._free_blocks - grown)) / self._num_blocks

    def _step_independent(self, now: float, servers: IndependentServers) -> StepResult | None:
        """Advance to the next token event (or report overdue ones at ``now``)."""
        out = StepOutput()
        advanced = servers.advance(now, out, self._emit)
        if advanced is None:
            return None
        when, grown = advanced
        self._free_blocks += out.released - grown
        self._free_blocks -= servers.start_waiting(self._waiting)
        self._generation_tokens += len(out.tokens)
        return out.result(when - now)
