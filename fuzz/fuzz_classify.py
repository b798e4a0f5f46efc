"""Fuzz target: request body and scheduling headers → a parsed, classified request or a 4xx.

For any input, ``parse_body`` then ``classify`` (with lane, priority and
deadline headers decoded from bytes as Latin-1, as Starlette decodes them)
either return values that satisfy their contract or raise ``GatewayError``
with a 4xx status. Any other exception, or a broken invariant, is a crash.

Half the inputs are raw body bytes; the other half are JSON objects built
from the fuzzer's bytes (so the field checks are reached, not only the JSON
parser). Run: ``python fuzz/fuzz_classify.py [corpus_dir] -max_total_time=600``
(see fuzz/README.md).
"""

from __future__ import annotations

import math
import sys

import atheris  # type: ignore[import-untyped]

with atheris.instrument_imports(include=["sluicegate"]):
    import orjson

    from sluicegate.core.spec import LaneSpec, ModelSpec, TenantSpec
    from sluicegate.core.ticket import MAX_PRIORITY, MIN_PRIORITY
    from sluicegate.gateway.http_errors import GatewayError
    from sluicegate.gateway.request.auth import bearer
    from sluicegate.gateway.request.body import check_media_type
    from sluicegate.gateway.request.classify import (
        MAX_ITEMS,
        MAX_N,
        MAX_TOKENS_LIMIT,
        Endpoint,
        ParsedRequest,
        classify,
        estimate_prompt_tokens,
        parse_body,
    )

ENDPOINTS: tuple[Endpoint, ...] = ("chat", "completions", "embeddings")
LANES = ("interactive", "batch")
MODEL = ModelSpec(name="m", lanes=tuple(LaneSpec(name=name) for name in LANES))
TENANTS = (
    TenantSpec(name="open"),
    TenantSpec(name="capped", allowed_lanes=("interactive",), max_priority=3, default_lane="nope"),
)
MESSAGE = {"role": "user", "content": "hi"}
BASES: dict[Endpoint, dict[str, object]] = {
    "chat": {"model": "m", "messages": [MESSAGE]},
    "completions": {"model": "m", "prompt": "hi"},
    "embeddings": {"model": "m", "input": "hi"},
}
HEADER_VALUES = [*LANES, "express", "0", "3", "5", "6", "250", "1e3", "application/json",
                 "Bearer sk-x", "text/plain"]  # fmt: skip
KEYS = ["model", "messages", "prompt", "input", "stream", "max_tokens",
        "max_completion_tokens", "n", "priority", "content", "role", "text", "type"]  # fmt: skip


SCALARS = 4  # the depth from which _value makes only scalars


def _value(fdp: atheris.FuzzedDataProvider, depth: int) -> object:
    """A JSON value shaped by the fuzzer: scalars, and lists/objects up to a small depth."""
    kind = fdp.ConsumeIntInRange(0, 8 if depth < SCALARS else 5)
    if kind == 0:
        return None
    if kind == 1:
        return fdp.ConsumeBool()
    if kind == 2:
        if fdp.ConsumeBool():
            return fdp.ConsumeIntInRange(-2, 20)
        return fdp.ConsumeIntInRange(-(2**63), 2**63 - 1)
    if kind == 3:
        return fdp.ConsumeRegularFloat()
    if kind in (4, 5):
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 40))
    if kind == 6:
        if fdp.ConsumeIntInRange(0, 7) == 0:  # a long array of one item, past the item caps
            item = MESSAGE if fdp.ConsumeBool() else _value(fdp, SCALARS)
            return [item] * fdp.ConsumeIntInRange(0, 2 * MAX_ITEMS)
        return [_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 6))]
    return {
        fdp.PickValueInList(KEYS) if fdp.ConsumeBool() else fdp.ConsumeUnicodeNoSurrogates(8): (
            _value(fdp, depth + 1)
        )
        for _ in range(fdp.ConsumeIntInRange(0, 6))
    }


def _body(fdp: atheris.FuzzedDataProvider, endpoint: Endpoint) -> bytes:
    """Raw bytes, or a valid body for ``endpoint`` with a few fields replaced or removed."""
    if fdp.ConsumeIntInRange(0, 2) == 0:
        return bytes(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 4096)))
    body = dict(BASES[endpoint])
    for _ in range(fdp.ConsumeIntInRange(0, 4)):
        key = fdp.PickValueInList(KEYS)
        if fdp.ConsumeIntInRange(0, 4) == 0:
            body.pop(key, None)
        else:
            body[key] = _value(fdp, 1)
    return orjson.dumps(body)


def _header(fdp: atheris.FuzzedDataProvider) -> str | None:
    """Absent, a plausible value, or bytes decoded as Latin-1 (as Starlette decodes headers)."""
    choice = fdp.ConsumeIntInRange(0, 3)
    if choice == 0:
        return None
    if choice == 1:
        return str(fdp.PickValueInList(HEADER_VALUES))
    return bytes(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 12))).decode("latin-1")


def _check_refusal(exc: GatewayError) -> None:
    if not 400 <= exc.status < 500:
        raise AssertionError(f"refusal with status {exc.status}: {exc.message}")
    if not exc.code or not exc.message:
        raise AssertionError(f"refusal without code or message: {exc!r}")


def _check_parsed(parsed: ParsedRequest) -> None:
    assert parsed.model, parsed
    assert isinstance(parsed.stream, bool), parsed
    assert parsed.max_tokens is None or 1 <= parsed.max_tokens <= MAX_TOKENS_LIMIT, parsed
    assert 1 <= parsed.n <= MAX_N, parsed
    assert parsed.priority is None or MIN_PRIORITY <= parsed.priority <= MAX_PRIORITY, parsed
    assert parsed.prompt_chars >= 0, parsed
    assert 0 <= parsed.messages <= MAX_ITEMS, parsed
    parsed.prefix.encode()  # the handler hashes it: it must be encodable text
    assert estimate_prompt_tokens(parsed, 4.0) >= 0


def TestOneInput(data: bytes) -> None:  # noqa: N802 - the name atheris calls
    """One input: a body and three scheduling headers, through parse and classify."""
    fdp = atheris.FuzzedDataProvider(data)
    endpoint = fdp.PickValueInList(list(ENDPOINTS))
    tenant = fdp.PickValueInList(list(TENANTS))
    lane, priority, deadline, other = (_header(fdp) for _ in range(4))
    raw = _body(fdp, endpoint)
    bearer(other)
    try:
        check_media_type(other)
        parsed = parse_body(raw, endpoint)
    except GatewayError as exc:
        _check_refusal(exc)
        return
    _check_parsed(parsed)
    try:
        kind = classify(
            MODEL, tenant, lane_header=lane, priority_header=priority,
            deadline_header=deadline, body_priority=parsed.priority,
        )  # fmt: skip
    except GatewayError as exc:
        _check_refusal(exc)
        return
    assert kind.lane in LANES, kind
    assert tenant.allowed_lanes is None or kind.lane in tenant.allowed_lanes or not lane, kind
    assert max(MIN_PRIORITY, tenant.max_priority) <= kind.priority <= MAX_PRIORITY, kind
    assert kind.deadline_ms is None or (math.isfinite(kind.deadline_ms) and kind.deadline_ms > 0)


def main() -> None:
    """Run under libFuzzer with the command-line arguments (see fuzz/README.md)."""
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
