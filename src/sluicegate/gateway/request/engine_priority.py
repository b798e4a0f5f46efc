"""The request's priority handed to the engine (``priority_passthrough``): the engine's own
priority field set from the ticket's sluicegate priority, so an engine started with its
priority scheduler (vLLM's ``--scheduling-policy priority``) orders its waiting queue and
picks KV-preemption victims by the same rule inside the batch."""

from __future__ import annotations

import orjson


def with_priority(body: bytes, field: str, value: int) -> bytes:
    """``body`` with ``field`` set to ``value`` (a client's own value replaced: a tenant
    must not jump the engine's queue); ``body`` as it is if it is not a JSON object (the
    engine refuses it as it would anyway)."""
    try:
        request = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if not isinstance(request, dict):
        return body
    request[field] = value
    try:
        return orjson.dumps(request)
    except TypeError:  # nested deeper than orjson writes
        return body
