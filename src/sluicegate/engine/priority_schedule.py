"""Step 1 of the schedule under ``scheduling_policy="priority"``, as ``Engine``'s base class.

What vLLM V1 does with ``--scheduling-policy priority``
(``vllm/v1/core/sched/scheduler.py``, ``Scheduler.schedule``), and only that:

* Running sequences are advanced in admission order, as under FCFS. When the
  KV cache lacks blocks for one of them, the victim is the running sequence
  with the largest ``(priority, arrival)`` (``max`` over the running list, so
  of equals the one admitted first), not the most recently admitted. It may
  be one already given tokens earlier in this step: those are taken back (its
  budget returns, it emits nothing). If the victim is the sequence being
  grown, the pass stops there.
* A victim goes back to the waiting queue in its ``(priority, arrival)``
  place (``waiting.PriorityWaiting``), not to the front.
* Waiting requests are admitted in ``(priority, arrival)`` order while slots,
  budget and KV allow, the first that does not fit blocking the rest; none
  are admitted in a step that preempted (``BatchSchedule._admit_waiting``).

V1 does **not** preempt running sequences to admit a waiting one of higher
priority: V0's ``_schedule_priority_preemption`` (``vllm/core/scheduler.py``)
did, V1's scheduler has no such pass, so neither does this model. A
high-priority request therefore waits for a free slot and KV like any other;
what priority buys is its place in the queue, and being the last to lose its
KV when running sequences need more.

The pass is two-phase so a victim scheduled earlier in the step can be taken
back: first it decides each sequence's tokens and KV blocks (and the
victims), then it applies the tokens of the sequences still scheduled.
"""

from __future__ import annotations

from sluicegate.engine.batch import BatchSchedule
from sluicegate.engine.step import SeqState, StepOutput
from sluicegate.engine.waiting import priority_rank

__all__ = ["PrioritySchedule"]


class PrioritySchedule(BatchSchedule):
    """Step 1 (running sequences) under the priority policy; see the module docstring."""

    def _schedule_running_by_priority(self, out: StepOutput, budget: int) -> int:
        """Advance running sequences, preempting by priority; returns the budget left."""
        planned = self._plan_running(out, budget)
        for seq, n in planned.values():
            budget -= n
            computed = seq.computed
            new = computed + n
            seq.computed = new
            out.kv += new
            if computed < seq.prefill_end:
                out.prefill += n
                out.attn += n * computed + n * (n + 1) // 2
            else:
                out.decode += 1
            if new == seq.total:
                self._emit(seq, out)
        return budget

    def _plan_running(self, out: StepOutput, budget: int) -> dict[str, tuple[SeqState, int]]:
        """Phase 1: each running sequence's tokens this step (KV blocks taken), by id in
        running order; victims are preempted into ``out`` and left out."""
        running = self._running
        bs = self._config.block_size
        planned: dict[str, tuple[SeqState, int]] = {}
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            n = min(seq.total - seq.computed, budget)
            new = seq.computed + n
            if new > seq.capacity:
                need = (new + bs - 1) // bs - seq.blocks
                while need > self._free_blocks:
                    victim = max(running, key=priority_rank)
                    position = running.index(victim)
                    del running[position]
                    self._evict(victim, out)
                    if victim is seq:
                        return planned
                    if position < i:  # scheduled earlier in this step: take it back
                        budget += planned.pop(victim.req_id)[1]
                        i -= 1
                self._free_blocks -= need
                seq.blocks += need
                seq.capacity = seq.blocks * bs
            planned[seq.req_id] = (seq, n)
            budget -= n
            i += 1
        return planned

    def _evict(self, victim: SeqState, out: StepOutput) -> None:
        """Preempt ``victim`` (recompute): free its KV and queue it again by priority."""
        self._free_blocks += victim.blocks
        victim.blocks = victim.capacity = victim.computed = 0
        self._waiting.appendleft(victim)
        out.preempted.append(victim.req_id)
        self._preemptions += 1
