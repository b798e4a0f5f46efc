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
``[[key…], before, after]`` in a lane without fairness, ``[tenant, seconds]`` pairs in
a ``vtc`` lane (the ``MAX_TENANTS`` − 1 with the most work, the rest summed under
``""``). A field that does not parse (another version of sluicegate) is skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import orjson

from sluicegate.core.work_ahead import LaneWork, Mark, RemoteWork
from sluicegate.store.redis_store import RedisStore

__all__ = ["MAX_TENANTS", "decode_work", "encode_work", "exchange_work"]

MAX_TENANTS = 64
"""Most tenants a ``vtc`` lane's summary names (the rest are summed under ``""``)."""
_log = logging.getLogger("sluicegate.store")


def encode_work(work: LaneWork) -> str:
    """``work`` as the JSON of its hash field."""
    tenants = sorted(work.tenants, key=lambda pair: -pair[1])
    if len(tenants) > MAX_TENANTS:
        rest = sum(seconds for _, seconds in tenants[MAX_TENANTS - 1 :])
        tenants = [*tenants[: MAX_TENANTS - 1], ("", rest)]
    marks = [[list(key), before, after] for key, before, after in work.marks]
    fields = (work.running, work.running_s, work.waiting, work.waiting_s, marks, tenants)
    return orjson.dumps(fields).decode()


def decode_work(text: str) -> LaneWork:
    """The ``LaneWork`` a hash field holds.

    Raises:
        ValueError: the field is not one (malformed, or another layout).
    """
    try:
        running, running_s, waiting, waiting_s, marks, tenants = orjson.loads(text)
        decoded_marks: tuple[Mark, ...] = tuple(
            (tuple(float(part) for part in key), float(before), float(after))
            for key, before, after in marks
        )
        return LaneWork(
            int(running),
            float(running_s),
            int(waiting),
            float(waiting_s),
            marks=decoded_marks,
            tenants=tuple((str(tenant), float(seconds)) for tenant, seconds in tenants),
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
