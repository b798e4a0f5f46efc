"""Load request traces from files: Azure LLM inference CSV, BurstGPT CSV, our JSONL.

This module reads the CSV traces and picks a file's format (``load_workload``);
reading and writing our JSONL is ``jsonl.py``'s job, and the error every loader
raises is in ``workload_errors.py``.

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
import math
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.workloads.csv_table import csv_table
from sluicegate.sim.workloads.jsonl import load_jsonl
from sluicegate.sim.workloads.transform import (
    MaxTokensPolicy,
    check_max_tokens_policy,
    resolve_max_tokens,
)
from sluicegate.sim.workloads.workload_errors import WorkloadError, backwards

__all__ = ["load_azure_csv", "load_burstgpt_csv", "load_workload"]

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens")
_EPOCH = datetime(1970, 1, 1)
_ONE_SECOND = timedelta(seconds=1)


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
            raise backwards(path, line, raw_ts, previous[1])
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
            raise backwards(path, line, raw_ts, previous[1])
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


def _first_line(path: Path) -> str:
    with path.open(encoding="utf-8-sig") as stream:
        for text in stream:
            if text.strip():
                return text.strip()
    raise WorkloadError(path, None, "file is empty")


def _csv_records(path: Path, required: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield ``(line, {column: text})`` for the required columns of each data row."""
    with path.open(encoding="utf-8-sig", newline="") as stream:
        rows = 0
        for line, row in csv_table(path, stream, {c: c for c in required}, _missing_columns):
            rows += 1
            yield line, row
    if rows == 0:
        raise WorkloadError(path, None, "no requests: the file has a header but no rows")


def _missing_columns(columns: list[str]) -> str:
    return f"missing column(s) {', '.join(map(repr, columns))}"


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
