"""Work summaries: every replica's work in its shedding lanes, shared through the store so
that each replica's start estimate counts the others' (DESIGN §16).

Each replica writes its ``LaneWork`` per lane that holds work into the hash
``{<prefix>:<model>}:work:<replica>`` (a field per lane, JSON; the hash expires one
lease TTL after its last write) and reads back the hashes of the other *live* replicas
(the model's ``replicas`` set), in one script call per model (``scripts/work.lua``),
pipelined into one round trip for all models (``exchange_work``). An idle replica
writes nothing. Sessions of this replica's own id (``<replica>.<n>``, an earlier
session that has not expired yet) are not others.

A lane's field is ``[running, running_s, waiting, waiting_s, marks, tenants]``: marks
``[[key…], before, after]`` in a lane without fairness, ``[tenant, seconds, marks]`` in
a ``vtc`` lane (the ``MAX_TENANTS`` − 1 tenants with the most work, the rest summed
under ``""`` without marks). A field that does not parse (another version of
sluicegate) is skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from sluicegate.core.work_ahead import LaneWork, Mark, RemoteWork
from sluicegate.store.redis_store import RedisStore

__all__ = ["MAX_TENANTS", "decode_work", "encode_work", "exchange_work"]

MAX_TENANTS = 64
"""Most tenants a ``vtc`` lane's summary names (the rest are summed under ``""``)."""
_log = logging.getLogger("sluicegate.store")


def _marks_out(marks: Sequence[Mark]) -> list[list[object]]:
    return [[list(key), before, after] for key, before, after in marks]


def _marks_in(marks: Sequence[Sequence[Any]]) -> tuple[Mark, ...]:
    return tuple(
        (tuple(float(part) for part in key), float(before), float(after))
        for key, before, after in marks
    )


def encode_work(work: LaneWork) -> str:
    """``work`` as the JSON of its hash field."""
    tenants = sorted(work.tenants, key=lambda tenant: -tenant[1])
    if len(tenants) > MAX_TENANTS:
        rest = sum(seconds for _, seconds, _ in tenants[MAX_TENANTS - 1 :])
        tenants = [*tenants[: MAX_TENANTS - 1], ("", rest, ())]
    named = [[name, seconds, _marks_out(marks)] for name, seconds, marks in tenants]
    fields = (work.running, work.running_s, work.waiting, work.waiting_s)
    return orjson.dumps((*fields, _marks_out(work.marks), named)).decode()


def decode_work(text: str) -> LaneWork:
    """The ``LaneWork`` a hash field holds.

    Raises:
        ValueError: the field is not one (malformed, or another layout).
    """
    try:
        running, running_s, waiting, waiting_s, marks, tenants = orjson.loads(text)
        return LaneWork(
            int(running),
            float(running_s),
            int(waiting),
            float(waiting_s),
            marks=_marks_in(marks),
            tenants=tuple(
                (str(name), float(seconds), _marks_in(queue)) for name, seconds, queue in tenants
            ),
        )
    except (orjson.JSONDecodeError, TypeError, ValueError) as error:
        raise ValueError(f"not a work summary: {text[:80]!r}") from error


def _others(reply: list[Any], replica: str) -> dict[str, RemoteWork]:
    """One model's reply (other replicas' ids and fields), summed per lane."""
    by_lane: dict[str, list[LaneWork]] = {}
    for index in range(0, len(reply), 2):
        if reply[index].rpartition(".")[0] == replica:
            continue  # an earlier session of this replica, not yet expired
        fields = reply[index + 1]
        for at in range(0, len(fields), 2):
            try:
                work = decode_work(fields[at + 1])
            except ValueError as error:
                _log.debug("replica %s, lane %s: %s", reply[index], fields[at], error)
                continue
            by_lane.setdefault(fields[at], []).append(work)
    return {lane: RemoteWork(works) for lane, works in by_lane.items()}


async def exchange_work(
    store: RedisStore, local: Mapping[str, Mapping[str, LaneWork]], *, replica: str, ttl_ms: int
) -> dict[str, dict[str, RemoteWork]]:
    """Publish this replica's work (model → lane → ``LaneWork``; lanes with no work are not
    written) and read the other live replicas' back, summed: model → lane →
    ``RemoteWork`` (a lane no other replica holds work in is absent). One round trip.

    ``replica`` is this replica's id without its session (``store.replica`` is
    ``<replica>.<n>``); ``ttl_ms`` how long the summary outlives its writer.

    Raises:
        StoreUnavailableError: the store failed or did not answer within its timeout.
    """
    args: dict[str, list[str | int | float]] = {}
    for model, lanes in local.items():
        args[model] = [store.replica, ttl_ms]
        for lane, work in lanes.items():
            if work.running or work.waiting:
                args[model] += [lane, encode_work(work)]
    replies = await store.run_each("work", args)
    summed = {model: _others(reply, replica) for model, reply in zip(args, replies, strict=True)}
    return {model: lanes for model, lanes in summed.items() if lanes}
