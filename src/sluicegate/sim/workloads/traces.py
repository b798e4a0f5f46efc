"""Load request traces from files: Azure LLM inference CSV, BurstGPT CSV, our JSONL.

Every loader returns a ``list[WorkloadRequest]`` sorted by ``arrival_s`` and
checks the file as it reads it. Any problem raises :class:`WorkloadError`, whose
message names the file and, where there is one, the 1-based line number
(the header is line 1): missing columns, non-numeric, negative or zero token
counts, ``output_tokens > max_tokens``, timestamps that go backwards, an empty
or header-only file, malformed JSON, unknown JSON keys.

Formats:

* **Azure** (Azure Public Dataset, Splitwise): ``TIMESTAMP,ContextTokens,GeneratedTokens``;
  ``TIMESTAMP`` is a wall-clock datetime ``YYYY-MM-DD HH:MM:SS[.fraction]`` (no zone),
  arrivals are seconds since the first row.
* **BurstGPT**: ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``;
  ``Timestamp`` is float seconds, arrivals are seconds since the first kept row.
  Rows with 0 response tokens are failed requests in BurstGPT and are skipped.
* **JSONL** (ours): one object per line with ``arrival_s``, ``prompt_tokens``,
  ``output_tokens`` and optionally ``max_tokens`` (default ``output_tokens``),
  ``tenant``, ``lane``, ``priority``, ``deadline_ms``, ``prefix`` (block hashes, a
  list of integers). Arrival times are kept as written (they are already
  relative to the workload's start), not rebased.

Any other CSV or JSONL trace loads through a field mapping (``fields.py``).

The CSV traces record only the output length, not the client's cap, so
``max_tokens`` comes from a :data:`~sluicegate.sim.workloads.transform.MaxTokensPolicy`
(default ``"exact"``: the cap equals the output). For JSONL ``"exact"`` keeps
the file's own ``max_tokens``; another policy replaces it.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.workloads.transform import (
    MaxTokensPolicy,
    check_max_tokens_policy,
    resolve_max_tokens,
)

__all__ = [
    "WorkloadError",
    "load_azure_csv",
    "load_burstgpt_csv",
    "load_jsonl",
    "load_workload",
    "write_jsonl",
]

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens")
_JSONL_REQUIRED = ("arrival_s", "prompt_tokens", "output_tokens")
_JSONL_OPTIONAL = ("max_tokens", "tenant", "lane", "priority", "deadline_ms", "prefix")
_EPOCH = datetime(1970, 1, 1)
_ONE_SECOND = timedelta(seconds=1)


class WorkloadError(ValueError):
    """A workload file that cannot be loaded; the message names the file and line.

    Attributes:
        path: the file.
        line: the 1-based line number of the problem, or ``None`` for the whole file.
        reason: the problem, without the location.
    """

    def __init__(self, path: str | Path, line: int | None, reason: str) -> None:
        self.path = str(path)
        self.line = line
        self.reason = reason
        where = f"{self.path}: line {line}: " if line is not None else f"{self.path}: "
        super().__init__(where + reason)


def load_azure_csv(
    path: str | Path, *, max_tokens: MaxTokensPolicy = "exact"
) -> list[WorkloadRequest]:
    """Load an Azure LLM inference trace (``TIMESTAMP,ContextTokens,GeneratedTokens``).

    Args:
        path: the CSV file.
        max_tokens: how to derive each request's cap from its output length.

    Returns:
        One request per row; ``arrival_s`` is seconds since the first row's timestamp.

    Raises:
        WorkloadError: a malformed file (see the module docstring).
    """
    check_max_tokens_policy(max_tokens)
    out: list[WorkloadRequest] = []
    first: tuple[int, float] | None = None
    previous: tuple[tuple[int, float], str] | None = None
    for line, row in _csv_records(Path(path), AZURE_COLUMNS):
        raw_ts = row["TIMESTAMP"].strip()
        stamp = _parse_datetime(path, line, raw_ts)
        if previous is not None and stamp < previous[0]:
            raise _backwards(path, line, raw_ts, previous[1])
        previous = (stamp, raw_ts)
        if first is None:
            first = stamp
        prompt = _token_count(path, line, "ContextTokens", row["ContextTokens"])
        output = _token_count(path, line, "GeneratedTokens", row["GeneratedTokens"])
        output, cap = resolve_max_tokens(output, max_tokens)
        arrival = (stamp[0] - first[0]) + (stamp[1] - first[1])
        out.append(WorkloadRequest(arrival, prompt, output, cap))
    return out


def load_burstgpt_csv(
    path: str | Path, *, model: str | None = None, max_tokens: MaxTokensPolicy = "exact"
) -> list[WorkloadRequest]:
    """Load a BurstGPT trace (``Timestamp,Model,Request tokens,Response tokens,…``).

    Rows with 0 response tokens (BurstGPT's failed requests) are skipped, as are
    rows of other models when ``model`` is given. The whole file must be sorted,
    skipped rows included.

    Args:
        path: the CSV file.
        model: keep only rows whose ``Model`` equals this (e.g. ``"ChatGPT"``).
        max_tokens: how to derive each request's cap from its output length.

    Returns:
        One request per kept row; ``arrival_s`` is seconds since the first kept row.

    Raises:
        WorkloadError: a malformed file, or no row left after skipping.
    """
    check_max_tokens_policy(max_tokens)
    out: list[WorkloadRequest] = []
    first: float | None = None
    previous: tuple[float, str] | None = None
    for line, row in _csv_records(Path(path), BURSTGPT_COLUMNS):
        raw_ts = row["Timestamp"].strip()
        stamp = _number(path, line, "Timestamp", raw_ts)
        if previous is not None and stamp < previous[0]:
            raise _backwards(path, line, raw_ts, previous[1])
        previous = (stamp, raw_ts)
        response = _token_count(path, line, "Response tokens", row["Response tokens"], low=0)
        prompt = _token_count(path, line, "Request tokens", row["Request tokens"], low=0)
        if response == 0 or (model is not None and row["Model"].strip() != model):
            continue
        if prompt == 0:
            raise WorkloadError(
                path, line, "Request tokens must be >= 1 in a successful row, got 0"
            )
        first = stamp if first is None else first
        output, cap = resolve_max_tokens(response, max_tokens)
        out.append(WorkloadRequest(stamp - first, prompt, output, cap))
    if not out:
        which = f"of model {model!r} " if model is not None else ""
        raise WorkloadError(path, None, f"no successful requests {which}in the file")
    return out


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
                raise _backwards(path, line, request.arrival_s, out[-1].arrival_s)
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
            stream.write(json.dumps(obj) + "\n")


def load_workload(
    path: str | Path, *, model: str | None = None, max_tokens: MaxTokensPolicy = "exact"
) -> list[WorkloadRequest]:
    """Load a workload file, choosing the format by extension and header.

    ``.jsonl``/``.ndjson``, or a file whose first non-blank character is ``{``, is
    JSONL; a CSV whose header starts with ``TIMESTAMP`` is Azure; one that starts
    with ``Timestamp,Model`` is BurstGPT.

    Args:
        path: the file.
        model: BurstGPT only: keep rows of this model.
        max_tokens: how to derive the cap from the output length (JSONL: ``"exact"``
            keeps the file's caps).

    Raises:
        WorkloadError: an unrecognised or malformed file, or an option that does not
            apply to the detected format.
    """
    path = Path(path)
    first = _first_line(path)
    if path.suffix.lower() in (".jsonl", ".ndjson") or first.startswith("{"):
        if model is not None:
            raise WorkloadError(path, None, "the model filter applies only to BurstGPT traces")
        check_max_tokens_policy(max_tokens)
        requests = load_jsonl(path)
        if max_tokens == "exact":
            return requests
        capped = ((r, resolve_max_tokens(r.output_tokens, max_tokens)) for r in requests)
        return [replace(r, output_tokens=o, max_tokens=c) for r, (o, c) in capped]
    columns = [c.strip() for c in next(csv.reader([first]), [])]
    if columns[:1] == ["TIMESTAMP"]:
        if model is not None:
            raise WorkloadError(path, None, "the model filter applies only to BurstGPT traces")
        return load_azure_csv(path, max_tokens=max_tokens)
    if columns[:2] == ["Timestamp", "Model"]:
        return load_burstgpt_csv(path, model=model, max_tokens=max_tokens)
    raise WorkloadError(
        path, 1,
        f"unrecognised workload header {first[:80]!r}: expected JSONL, an Azure CSV "
        "(TIMESTAMP,ContextTokens,GeneratedTokens) or a BurstGPT CSV (Timestamp,Model,...)",
    )  # fmt: skip


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


def _first_line(path: Path) -> str:
    with path.open(encoding="utf-8-sig") as stream:
        for text in stream:
            if text.strip():
                return text.strip()
    raise WorkloadError(path, None, "file is empty")


def _csv_records(path: Path, required: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield ``(line, {column: text})`` for the required columns of each data row."""
    with path.open(encoding="utf-8-sig", newline="") as stream:
        reader = csv.reader(stream)
        rows = 0
        try:
            header = next((row for row in reader if any(c.strip() for c in row)), None)
            if header is None:
                raise WorkloadError(path, None, "file is empty")
            columns = [c.strip() for c in header]
            missing = [c for c in required if c not in columns]
            if missing:
                raise WorkloadError(
                    path, reader.line_num,
                    f"missing column(s) {', '.join(map(repr, missing))}; header is {columns}",
                )  # fmt: skip
            index = {c: columns.index(c) for c in required}
            for row in reader:
                if not any(c.strip() for c in row):
                    continue
                if len(row) != len(columns):
                    raise WorkloadError(
                        path, reader.line_num, f"expected {len(columns)} fields, got {len(row)}"
                    )
                rows += 1
                yield reader.line_num, {c: row[i] for c, i in index.items()}
        except csv.Error as exc:
            raise WorkloadError(path, reader.line_num, f"malformed CSV: {exc}") from exc
    if rows == 0:
        raise WorkloadError(path, None, "no requests: the file has a header but no rows")


def _parse_datetime(path: str | Path, line: int, text: str) -> tuple[int, float]:
    """``(whole seconds since 1970, fraction)`` of ``YYYY-MM-DD HH:MM:SS[.digits]``.

    The fraction is split off by hand because Python 3.11's ``fromisoformat``
    rejects more than 6 fractional digits (Azure writes 7), and kept apart from
    the whole seconds so subtracting two stamps loses no precision.
    """
    whole, _, digits = text.partition(".")
    try:
        if digits and not digits.isdigit():
            raise ValueError(digits)
        stamp = datetime.fromisoformat(whole)
        if stamp.tzinfo is not None:
            stamp = stamp.astimezone(UTC).replace(tzinfo=None)
    except ValueError as exc:
        raise WorkloadError(
            path, line, f"TIMESTAMP {text!r} is not a datetime YYYY-MM-DD HH:MM:SS[.fraction]"
        ) from exc
    seconds = (stamp - _EPOCH) // _ONE_SECOND
    return seconds, float(f"0.{digits}") if digits else 0.0


def _number(path: str | Path, line: int, column: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise WorkloadError(path, line, f"{column} {text.strip()!r} is not a finite number")
    return value


def _token_count(path: str | Path, line: int, column: str, text: str, *, low: int = 1) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise WorkloadError(
            path, line, f"{column} {text.strip()!r} is not an integer token count"
        ) from exc
    if value < low:
        raise WorkloadError(path, line, f"{column} must be >= {low}, got {value}")
    return value


def _backwards(path: str | Path, line: int, current: object, previous: object) -> WorkloadError:
    return WorkloadError(path, line, f"timestamp goes backwards ({current} < {previous})")


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
