"""What a finished request tells its model's adaptive limit: a drop, a latency sample, or nothing.

**Drops.** A request the engine failed (5xx, an unreachable or vanished
engine, a broken answer), did not answer in time, or refused for load (429,
503) is reported with ``on_dropped``: each says the engine is overloaded or
unwell. A client's own mistake (another 4xx), a client that left, and a
preemption say nothing about the engine's load: the first two are reported
with ``on_ignore``, and a preemption is not reported at all.

**Latency samples.** Only answers the engine served are samples, and each is
one of two ``SampleKind`` quantities, measured from admission (so time queued
in the gateway, which the limit itself causes, is left out):

- ``FIRST_TOKEN``, the time to the first generated token, whenever the engine
  streams to the gateway: streamed requests, and unary ones the gateway sends
  upstream as a stream and reassembles (llama.cpp backends, and lanes that may
  preempt them with ``abort``). This is where an overloaded engine's waiting
  queue shows first and clearest.
- ``PER_OUTPUT_TOKEN``, the time to the whole answer divided by its output
  tokens (at least one), for unary answers that arrive in one piece. Such an
  answer has no observable first token; its raw duration grows with the
  output length, which would read every long answer as congestion, while the
  time per output token stays near the engine's decode step and grows when
  requests queue inside the engine or batches grow.

When the first token was seen, the answer also yields its time per output
token after the first, ``(elapsed − ttft) / (tokens − 1)``: the engine's decode
step time as that request saw it (every sequence of a batch shares the step),
passed beside the sample (``tpot_s``) for the ``slo`` mode.

The two kinds are never compared with each other: ``latency`` keeps a
long-run level per kind, and ``aimd``'s ``timeout_s`` applies to
time-to-first-token samples only.
"""

from __future__ import annotations

from sluicegate.core.limits.limit import Limit, SampleKind
from sluicegate.core.ticket import Feedback, Usage


def report_outcome(limit: Limit, usage: Usage, *, elapsed_s: float, inflight: int) -> None:
    """Report one finished, not preempted, request to ``limit``: exactly one listener call.

    ``on_dropped`` for ``Feedback.DROP``; ``on_answer`` with a sample of the
    right ``SampleKind`` (and, for a first-token sample of an answer of at least
    two tokens, its time per output token after the first) for
    ``Feedback.SAMPLE``; ``on_ignore`` for ``Feedback.IGNORE``.

    Args:
        limit: The model's adaptive limit.
        usage: What the driver reported; ``usage.limit_feedback`` decides the outcome.
        elapsed_s: Time from the request's admission to its end.
        inflight: Requests of the model running when it ended, itself included.
    """
    feedback = usage.limit_feedback
    if feedback is Feedback.DROP:
        limit.on_dropped(inflight=inflight)
    elif feedback is Feedback.SAMPLE:
        ttft_s = usage.ttft_s
        if ttft_s is not None:
            tokens = usage.completion_tokens
            tpot_s = (elapsed_s - ttft_s) / (tokens - 1) if tokens >= 2 else None
            limit.on_answer(ttft_s, inflight=inflight, kind=SampleKind.FIRST_TOKEN, tpot_s=tpot_s)
        else:
            per_token = elapsed_s / max(1, usage.completion_tokens)
            limit.on_answer(
                per_token, inflight=inflight, kind=SampleKind.PER_OUTPUT_TOKEN, tpot_s=None
            )
    else:
        limit.on_ignore()
