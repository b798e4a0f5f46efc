"""Our JSONL workload format: reading it (checked line by line) and writing it.

One object per line with ``arrival_s``, ``prompt_tokens``, ``output_tokens`` and
optionally ``max_tokens`` (default ``output_tokens``), ``tenant``, ``lane``,
``priority``, ``deadline_ms``, ``prefix`` (block hashes, a list of integers),
``prefix_block_tokens`` (tokens each of those hashes names; default one engine block).
Arrival times are kept as written, not rebased. ``json_lines`` is also what a
field mapping (``fields.py``) reads other JSONL traces with.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.workloads.trace_blocks import MAX_PREFIX_BLOCK_TOKENS
from sluicegate.sim.workloads.workload_errors import WorkloadError, backwards

__all__ = ["json_lines", "load_jsonl", "write_jsonl"]

_JSONL_REQUIRED = ("arrival_s", "prompt_tokens", "output_tokens")
_JSONL_OPTIONAL = (
    "max_tokens", "tenant", "lane", "priority", "deadline_ms", "prefix", "prefix_block_tokens",
)  # fmt: skip


def load_jsonl(path: str | Path) -> list[WorkloadRequest]:
    """Load our JSONL workload format (see the module docstring for the keys).

    Blank lines are ignored. Optional keys default to :class:`WorkloadRequest`'s
    defaults; ``max_tokens`` defaults to ``output_tokens``; ``deadline_ms`` may be
    ``null``.

    Raises:
        WorkloadError: malformed JSON, a line that is not an object, a missing,
            unknown or ill-typed key, an out-of-range value, ``output_tokens >
            max_tokens``, arrivals that go backwards, or no requests at all.
    """
    out: list[WorkloadRequest] = []
    with Path(path).open(encoding="utf-8-sig") as stream:
        for line, obj in json_lines(path, stream):
            request = _jsonl_request(path, line, obj)
            if out and request.arrival_s < out[-1].arrival_s:
                raise backwards(path, line, request.arrival_s, out[-1].arrival_s)
            out.append(request)
    if not out:
        raise WorkloadError(path, None, "file is empty (no requests)")
    return out


def write_jsonl(requests: Iterable[WorkloadRequest], path: str | Path) -> None:
    """Write requests in the format :func:`load_jsonl` reads, one object per line, all keys."""
    with Path(path).open("w", encoding="utf-8") as stream:
        for r in requests:
            obj = {
                "arrival_s": r.arrival_s,
                "prompt_tokens": r.prompt_tokens,
                "output_tokens": r.output_tokens,
                "max_tokens": r.max_tokens,
                "tenant": r.tenant,
                "lane": r.lane,
                "priority": r.priority,
                "deadline_ms": r.deadline_ms,
            }
            if r.prefix:
                obj["prefix"] = list(r.prefix)
            if r.prefix_block_tokens is not None:
                obj["prefix_block_tokens"] = r.prefix_block_tokens
            stream.write(json.dumps(obj) + "\n")


def json_lines(path: str | Path, stream: Iterable[str]) -> Iterator[tuple[int, Any]]:
    """``(line number, parsed value)`` of each non-blank line of a JSONL stream.

    Raises:
        WorkloadError: a line is not JSON (naming the file and line).
    """
    for line, text in enumerate(stream, start=1):
        if not text.strip():
            continue
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise WorkloadError(path, line, f"malformed JSON: {exc.msg}") from exc
        yield line, value


def _jsonl_request(path: str | Path, line: int, obj: Any) -> WorkloadRequest:
    """Validate one decoded JSONL object and build its request."""
    if not isinstance(obj, dict):
        raise WorkloadError(path, line, f"expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(_JSONL_REQUIRED) - set(_JSONL_OPTIONAL))
    if unknown:
        raise WorkloadError(path, line, f"unknown key(s) {', '.join(map(repr, unknown))}")
    missing = [k for k in _JSONL_REQUIRED if k not in obj]
    if missing:
        raise WorkloadError(path, line, f"missing key(s) {', '.join(map(repr, missing))}")
    arrival = _json_float(path, line, obj, "arrival_s", low=0.0)
    prompt = _json_int(path, line, obj, "prompt_tokens", low=1)
    output = _json_int(path, line, obj, "output_tokens", low=1)
    cap = _json_int(path, line, obj, "max_tokens", low=1) if "max_tokens" in obj else output
    if output > cap:
        raise WorkloadError(path, line, f"output_tokens {output} > max_tokens {cap}")
    fields: dict[str, Any] = {}
    for key in ("tenant", "lane"):
        if key in obj:
            if not isinstance(obj[key], str) or not obj[key]:
                raise WorkloadError(path, line, f"{key} must be a non-empty string")
            fields[key] = obj[key]
    if "priority" in obj:
        fields["priority"] = _json_int(path, line, obj, "priority", low=0, high=5)
    if "prefix" in obj:
        hashes = obj["prefix"]
        if not isinstance(hashes, list) or not all(
            isinstance(h, int) and not isinstance(h, bool) for h in hashes
        ):
            raise WorkloadError(path, line, f"prefix must be a list of integers, got {hashes!r}")
        fields["prefix"] = tuple(hashes)
    if obj.get("prefix_block_tokens") is not None:
        fields["prefix_block_tokens"] = _json_int(
            path, line, obj, "prefix_block_tokens", low=1, high=MAX_PREFIX_BLOCK_TOKENS
        )
    if obj.get("deadline_ms") is not None:
        fields["deadline_ms"] = _json_float(path, line, obj, "deadline_ms", low=0.0, strict=True)
    return WorkloadRequest(arrival, prompt, output, cap, **fields)


def _json_int(
    path: str | Path, line: int, obj: dict[str, Any], key: str, *, low: int, high: int | None = None
) -> int:
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise WorkloadError(path, line, f"{key} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise WorkloadError(path, line, f"{key} must be {bounds}, got {value}")
    return value


def _json_float(
    path: str | Path, line: int, obj: dict[str, Any], key: str, *, low: float, strict: bool = False
) -> float:
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise WorkloadError(path, line, f"{key} must be a finite number, got {value!r}")
    if value < low or (strict and value == low):
        raise WorkloadError(
            path, line, f"{key} must be {'>' if strict else '>='} {low}, got {value}"
        )
    return float(value)
