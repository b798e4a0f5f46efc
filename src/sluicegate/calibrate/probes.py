"""Running a ``ProbePlan`` against an engine and turning its requests into ``Sample``s.

Every prompt is unique, so no probe hits a prefix cache: its first four token ids spell a
per-run random number and a per-request counter in base 94 (ids 33 … 126, which every
vocabulary of more than 127 tokens has), the rest repeat those ids. llama-server is also
told ``cache_prompt: false``.

What each probe measures, preferring the server's own clock where it has one:

* ``prefill`` (llama-server only): ``timings.prompt_ms``, the server's prefill steps.
* ``first token``: the client's time to first token, every engine.
* ``decode``: llama-server's ``predicted_per_token_ms`` (its mean step after the first
  token), else the median gap between tokens' arrivals at the client.
* the tail: every request's time from its last token's arrival to the end of the
  response (``response_overhead_s``, held fixed in the fit).

Repeats run in rounds over the whole plan rather than back to back, so that a burst of
load elsewhere on the machine spoils one sample of many probes instead of all of one.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp

from sluicegate.calibrate.engine_client import RequestRecord, completion_body, time_completion
from sluicegate.calibrate.fit import Sample
from sluicegate.calibrate.probe_plan import (
    ProbePlan,
    decode_features,
    decode_probes,
    first_token_features,
    mean_decode_context,
    prefill_features,
)

_LOWEST_ID, _IDS = 33, 94
_SALT_DIGITS = 4


@dataclass(frozen=True, slots=True)
class Measurements:
    """What a run measured: the samples to fit and every request's tail, seconds."""

    samples: tuple[Sample, ...]
    tails_s: tuple[float, ...]
    server_timings: bool


class Prompts:
    """Unique prompts of token ids: no two this run, nor (but by chance) in another."""

    def __init__(self, seed: int | None = None) -> None:
        self._next = random.Random(seed).randrange(_IDS**_SALT_DIGITS // 2)

    def make(self, length: int) -> list[int]:
        """A fresh prompt of ``length`` token ids (``length`` ≥ 1)."""
        salt, self._next = self._next, self._next + 1
        ids = []
        for _ in range(_SALT_DIGITS):
            salt, digit = divmod(salt, _IDS)
            ids.append(_LOWEST_ID + digit)
        ids += [_LOWEST_ID + i % _IDS for i in range(max(0, length - _SALT_DIGITS))]
        return ids[:length]


@dataclass
class _Collected:
    """The raw values of one probe over its repeats."""

    group: str
    label: str
    features: tuple[float, ...]
    values: list[float]


class ProbeRunner:
    """Sends a plan's requests to one engine and collects their times.

    Args:
        session: the HTTP session (its timeout bounds each request).
        url: the engine's base URL.
        model: the model name to request.
        kind: ``llama-server``, ``vllm`` or ``emulator`` (what to ask of it).
        advance: called with the number of requests each time some finish.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        model: str,
        kind: str,
        advance: Callable[[int], None],
    ) -> None:
        self._session, self._url, self._model, self._kind = session, url, model, kind
        self._advance = advance
        self._prompts = Prompts()
        self._collected: dict[tuple[str, str], _Collected] = {}
        self._tails: list[float] = []
        self._server_timings = False

    async def _send(self, prompt_tokens: int, max_tokens: int, count: int) -> list[RequestRecord]:
        """``count`` requests started together; their records."""
        bodies = [
            completion_body(self._kind, self._model, self._prompts.make(prompt_tokens), max_tokens)
            for _ in range(count)
        ]
        records = await asyncio.gather(
            *(time_completion(self._session, self._url, body) for body in bodies)
        )
        self._advance(count)
        return list(records)

    def _add(self, group: str, label: str, features: tuple[float, ...], value: float) -> None:
        entry = self._collected.setdefault((group, label), _Collected(group, label, features, []))
        entry.values.append(value)

    async def warm_up(self, plan: ProbePlan) -> None:
        """One long prefill and one full decode batch, not measured: the first steps of
        each shape allocate buffers."""
        await self._send(plan.prefill_lengths[-1], 1, 1)
        await self._send(plan.decode_contexts[0], 4, plan.batch_sizes[-1])

    async def prefill_round(self, plan: ProbePlan) -> None:
        """One request per prefill length, after one not measured: the first request
        after a batch has ended pays for the engine's clean-up of it (llama-server's
        first was twice the next one's time to first token), which is no prefill cost."""
        await self._send(plan.prefill_lengths[0], 1, 1)
        for length in plan.prefill_lengths:
            (record,) = await self._send(length, 1, 1)
            self._tails.append(record.tail_s)
            label = f"prompt {record.prompt_tokens}"
            features = first_token_features(record.prompt_tokens, plan.budget_tokens)
            self._add("first token", label, features, record.first_token_s)
            if record.timings is not None:
                self._server_timings = True
                steps = prefill_features(record.prompt_tokens, plan.budget_tokens)
                self._add("prefill", label, steps, record.timings.prompt_s)

    async def decode_round(self, plan: ProbePlan) -> None:
        """One batch per decode probe (``decode_probes``)."""
        for context, batch in decode_probes(plan):
            records = await self._send(context, plan.decode_tokens, batch)
            self._tails.extend(record.tail_s for record in records)
            prompt = round(statistics.median(r.prompt_tokens for r in records))
            mean_context = mean_decode_context(prompt, plan.decode_tokens)
            label = f"batch {batch} · context {mean_context:g}"
            features = decode_features(batch, mean_context)
            self._add("decode", label, features, _decode_step_s(records))

    def measurements(self) -> Measurements:
        """The medians of every probe so far, and the tails."""
        samples = tuple(
            Sample(c.group, c.label, c.features, statistics.median(c.values),
                   (min(c.values), max(c.values)), len(c.values))
            for c in self._collected.values()
        )  # fmt: skip
        return Measurements(samples, tuple(self._tails), self._server_timings)


def _decode_step_s(records: Sequence[RequestRecord]) -> float:
    """The batch's step time: the server's mean step per request (median over them),
    else the median of every gap between tokens at the client."""
    steps = [r.timings.step_s for r in records if r.timings is not None and r.timings.step_s > 0]
    if steps:
        return statistics.median(steps)
    return statistics.median(gap for record in records for gap in record.gaps_s())


async def run_probes(runner: ProbeRunner, plan: ProbePlan, repeats: int) -> Measurements:
    """Warm up, then ``repeats`` rounds of every prefill and decode probe."""
    await runner.warm_up(plan)
    for _ in range(repeats):
        await runner.prefill_round(plan)
        await runner.decode_round(plan)
    return runner.measurements()
