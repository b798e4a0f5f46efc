"""The request's priority as the engine gets it. With ``priority_passthrough`` the engine's
own priority field is set from the ticket's sluicegate priority, so an engine started with
its priority scheduler (vLLM's ``--scheduling-policy priority``) orders its waiting queue
and picks KV-preemption victims by the same rule inside the batch. Without it, the
request's ``priority`` — sluicegate's own field, read at admission — is taken out: vLLM
refuses a non-zero priority unless started with its priority scheduler, and an engine
that has one must not be steered by a client past the gateway's caps."""

from __future__ import annotations

import orjson

SLUICEGATE_FIELD = "priority"
_MARK = b'"priority"'


def without_priority(body: bytes) -> bytes:
    """``body`` without sluicegate's ``priority`` field; as it is (the same object) when it
    has none, which a scan of its bytes tells without parsing it."""
    if _MARK not in body:
        return body
    try:
        request = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if not isinstance(request, dict) or SLUICEGATE_FIELD not in request:
        return body
    del request[SLUICEGATE_FIELD]
    try:
        return orjson.dumps(request)
    except TypeError:  # nested deeper than orjson writes
        return body


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
    request.pop(SLUICEGATE_FIELD, None)
    request[field] = value
    try:
        return orjson.dumps(request)
    except TypeError:  # nested deeper than orjson writes
        return body
