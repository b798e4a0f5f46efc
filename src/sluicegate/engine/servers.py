"""``EngineConfig.batch_independent`` mode: ``max_num_seqs`` independent FCFS servers.

A request starts when a server is free, at ``max(arrival, time its server
became free)`` even if the engine learns of it later, so queueing and service
times are exact. Its tokens then come at fixed offsets from its start: token 1
after ``step_s(p, 0, p)`` (its solo prefill), token g + 1 ``step_s(0, 1, p + g)``
after token g, so its service time is exactly ``EngineConfig.solo_service_s``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from sluicegate.engine.engine_config import EngineConfig
from sluicegate.engine.step import SeqState, StepOutput
from sluicegate.engine.waiting import WaitingQueue

Emit = Callable[[SeqState, StepOutput], None]
"""The engine's token emission: counts the token, and removes the request when it is done."""


class IndependentServers:
    """The servers' state: when each free one became free, and a heap of token events.

    Attributes:
        running: requests on a server.
    """

    __slots__ = ("_config", "_events", "_free_since", "running")

    def __init__(self, config: EngineConfig) -> None:
        self._config = config
        self._free_since: list[float] = [float("-inf")] * config.max_num_seqs
        self._events: list[tuple[float, int, SeqState]] = []
        self.running = 0

    def start_waiting(self, waiting: WaitingQueue) -> int:
        """Start waiting requests FCFS on free servers; returns the KV blocks they took."""
        cfg = self._config
        bs = cfg.block_size
        taken = 0
        while waiting and self._free_since:
            seq = waiting.popleft()
            start = max(seq.arrival, heapq.heappop(self._free_since))
            p = seq.prompt_tokens
            seq.blocks = (p + bs - 1) // bs
            taken += seq.blocks
            self.running += 1
            prefill_s = cfg.step_s(p, 0, p, p * (p + 1) // 2)
            heapq.heappush(self._events, (start + prefill_s, seq.order, seq))
        return taken

    def release(self, at: float) -> None:
        """A request left its server at ``at`` (it finished or was aborted)."""
        self.running -= 1
        heapq.heappush(self._free_since, at)

    def advance(self, now: float, out: StepOutput, emit: Emit) -> tuple[float, int] | None:
        """Emit into ``out`` every token due at the next event time, or overdue at ``now``.

        Returns:
            ``(when, grown)``: the time the tokens are reported (the event time,
            or ``now`` for overdue ones) and the KV blocks the requests grew by;
            ``None`` when no request is on a server.
        """
        events = self._events
        while events and events[0][2].done:
            heapq.heappop(events)
        if not events:
            return None
        when = max(events[0][0], now)
        grown = 0
        while events and events[0][0] <= when:
            at, order, seq = heapq.heappop(events)
            if not seq.done:
                grown += self._token(at, order, seq, out, emit)
        return when, grown

    def _token(self, at: float, order: int, seq: SeqState, out: StepOutput, emit: Emit) -> int:
        """Emit one token of ``seq`` due at ``at``, schedule its next; returns blocks grown."""
        cfg = self._config
        context = seq.total
        if seq.generated == 0:
            out.prefill += context
        else:
            out.decode += 1
        out.kv += context
        emit(seq, out)
        if seq.done:
            self.release(at)
            return 0
        grown = (seq.total + cfg.block_size - 1) // cfg.block_size - seq.blocks
        seq.blocks += grown
        heapq.heappush(self._events, (at + cfg.step_s(0, 1, seq.total), order, seq))
        return grown
