"""The step schedule of a shared batch (vLLM v1 style), as ``Engine``'s base class.

It owns what one ``Engine.step`` does to the running batch and the waiting
queue: advance running sequences within the token budget, preempt the newest
(recompute) when KV blocks run short, admit waiting requests in the queue's
order (FCFS, or by priority: the priority policy's step 1 is
``priority_schedule``'s), and emit the sampled tokens. ``model`` holds the
engine's state, its public calls and the ``batch_independent`` mode; the
schedule itself is described in its docstring.
"""

from __future__ import annotations

from sluicegate.engine.engine_config import EngineConfig
from sluicegate.engine.prefix_cache import PrefixCache
from sluicegate.engine.step import SeqState, StepOutput
from sluicegate.engine.waiting import WaitingQueue

__all__ = ["BatchSchedule"]


class BatchSchedule:
    """The schedule's steps over the engine state that ``Engine.__init__`` sets up."""

    _config: EngineConfig
    _seqs: dict[str, SeqState]
    _waiting: WaitingQueue
    _running: list[SeqState]
    _free_blocks: int
    _preemptions: int
    _cache: PrefixCache
    _to_cache: list[tuple[int, ...]]

    def _schedule_running(self, out: StepOutput, budget: int) -> int:
        """Step 1: advance running sequences in admission order; returns the budget left.

        This loop is the simulator's hot path, hence the inlined decode token.
        Preemption only pops sequences after the current one, which the list
        iterator then never reaches.
        """
        tokens = out.tokens
        prefill = decode = kv = attn = 0
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
                attn += n * computed + n * (n + 1) // 2
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
        out.attn += attn
        return budget

    def _grow(self, seq: SeqState, new: int, out: StepOutput) -> bool:
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

    def _preempt_until(self, seq: SeqState, need: int, out: StepOutput) -> bool:
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

    def _admit_waiting(self, out: StepOutput, budget: int) -> None:
        """Step 2: admit waiting requests in queue order while slots, budget and KV allow."""
        cfg = self._config
        waiting = self._waiting
        slots = cfg.max_num_seqs - len(self._running)
        bs = cfg.block_size
        while waiting and budget > 0 and slots > 0:
            seq = waiting[0]
            cached = self._cache.lookup(seq.prefix, seq.total, bs, self._free_blocks)
            n = seq.total - cached
            if n > budget:
                if not cfg.enable_chunked_prefill:
                    break
                n = budget
            need = (cached + n + bs - 1) // bs
            if need > self._free_blocks:
                break
            waiting.popleft()
            self._running.append(seq)
            slots -= 1
            self._free_blocks -= need
            seq.blocks = need
            seq.capacity = need * bs
            seq.computed = cached + n
            seq.prefill_end = seq.total
            budget -= n
            out.prefill += n
            out.attn += n * cached + n * (n + 1) // 2
            out.kv += cached + n
            if seq.prefix:
                self._cache.count(seq.prompt_tokens, cached, self._free_blocks)
            if cached + n == seq.total:
                self._emit(seq, out)

    def _emit(self, seq: SeqState, out: StepOutput) -> None:
        """The sequence computed its last known token: it samples the next one."""
        generated = seq.generated + 1
        seq.generated = generated
        seq.total += 1
        req_id = seq.req_id
        out.tokens[req_id] = 1
        if seq.prefix and (generated == 1 or generated >= seq.target):
            self._to_cache.append(seq.prefix)  # prefilled, or finished: its blocks are cached
        if generated == 1:
            out.first.append(req_id)
        if generated >= seq.target:
            out.finished.append(req_id)
            out.released += seq.blocks
            seq.blocks = 0
            seq.done = True
            del self._seqs[req_id]
