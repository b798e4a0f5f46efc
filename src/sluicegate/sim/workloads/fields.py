"""Load any CSV or JSONL trace through a field mapping (``--field NAME=COLUMN[:UNIT]``).

A public trace names its columns its own way; a mapping says which column
holds what, so it loads without a converter. For example a Mooncake trace::

    --field arrival=timestamp:ms --field prompt=input_length \\
    --field output=output_length --field prefix=hash_ids

Names (``arrival``, ``prompt`` and ``output`` are required):

* ``arrival``: arrival time; UNIT ``s`` (default), ``ms`` or ``us`` for numbers,
  ``iso`` for ISO 8601 datetimes (``2024-05-01T12:00:00.5``, a zone allowed).
  Without a unit a value that is not a number is read as an ISO datetime.
  Arrivals are rebased to the first row and must not go backwards.
* ``prompt``, ``output``: token counts, integers ``>= 1``.
* ``prefix``: the prompt's KV block hashes, in order: a JSON list of integers,
  or in a CSV a list of integers separated by commas, semicolons or spaces,
  optionally in brackets (``"[1, 2, 3]"``). Empty means none. ``prefix=COLUMN:N``
  says each hash names a block of N tokens (Mooncake's ``hash_ids`` name 512-token
  blocks: ``prefix=hash_ids:512``); without ``:N`` a hash names one block of the
  engine's own size. The simulator expands each N-token hash into N ÷ block size
  engine-block hashes (``sim/workloads/trace_blocks.py``).
* ``tenant``, ``lane``: strings (a JSON number is taken as its text).
* ``priority``: an integer 0 … 5.
* ``deadline``: a deadline relative to arrival, UNIT ``ms`` (default), ``s`` or ``us``.

Columns not mapped are ignored; an optional field mapped to a column no row has
is an error naming the column (a misspelt mapping would otherwise be silently
dropped). The format is JSONL when the file ends in
``.jsonl``/``.ndjson`` or starts with ``{``, else CSV with a header row. Every
error is a :class:`~sluicegate.sim.workloads.workload_errors.WorkloadError` naming the file,
the line (the CSV header is line 1) and the field.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.workloads.csv_table import csv_table
from sluicegate.sim.workloads.jsonl import json_lines
from sluicegate.sim.workloads.trace_blocks import MAX_PREFIX_BLOCK_TOKENS
from sluicegate.sim.workloads.transform import (
    MaxTokensPolicy,
    check_max_tokens_policy,
    resolve_max_tokens,
)
from sluicegate.sim.workloads.workload_errors import WorkloadError

__all__ = ["FIELD_NAMES", "FieldMap", "load_mapped", "parse_fields"]

FIELD_NAMES = ("arrival", "prompt", "output", "prefix", "tenant", "lane", "priority", "deadline")
_REQUIRED = ("arrival", "prompt", "output")
_SCALE = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_UNITS = {"arrival": (*_SCALE, "iso"), "deadline": tuple(_SCALE)}
_DEFAULT_UNIT = {"arrival": "", "deadline": "ms"}
_SEPARATORS = re.compile(r"[,;\s]+")
_BLOCK_SUFFIX = re.compile(r".:\d+$")


@dataclass(frozen=True)
class FieldMap:
    """Which column holds each field, and the unit of ``arrival`` and ``deadline``.

    Attributes:
        columns: field name → column (CSV header name or JSON key).
        units: ``arrival`` (``""`` = seconds, or ISO for non-numbers) and ``deadline`` units.
        prefix_block_tokens: tokens each ``prefix`` hash names (``prefix=COLUMN:N``);
            ``None``: one engine block.
    """

    columns: Mapping[str, str]
    units: Mapping[str, str] = field(default_factory=lambda: dict(_DEFAULT_UNIT))
    prefix_block_tokens: int | None = None


def parse_fields(specs: Sequence[str]) -> FieldMap:
    """Parse ``NAME=COLUMN[:UNIT]`` options into a :class:`FieldMap`.

    Only ``arrival`` and ``deadline`` take a unit, and ``prefix`` a block size
    (``prefix=COLUMN:N``, N a whole number of tokens); for the others, and for a
    ``prefix`` suffix that is not a number, a ``:`` is part of the column name.

    Raises:
        ValueError: a malformed option, an unknown or repeated name, an unknown
            unit, a prefix block size out of range, or a required name (arrival,
            prompt, output) missing.
    """
    columns: dict[str, str] = {}
    units = dict(_DEFAULT_UNIT)
    block_tokens: int | None = None
    for spec in specs:
        name, eq, column = spec.partition("=")
        name = name.strip()
        if not eq or not column.strip():
            raise ValueError(f"--field must look like NAME=COLUMN[:UNIT], got {spec!r}")
        if name not in FIELD_NAMES:
            raise ValueError(f"--field {spec!r}: unknown name {name!r}; choose from {FIELD_NAMES}")
        if name in columns:
            raise ValueError(f"--field {spec!r}: {name} is mapped twice")
        if name in _UNITS and ":" in column:
            column, _, unit = column.rpartition(":")
            if unit not in _UNITS[name]:
                raise ValueError(
                    f"--field {spec!r}: unit {unit!r} of {name} is not one of {_UNITS[name]}"
                )
            units[name] = unit
        if name == "prefix" and _BLOCK_SUFFIX.search(column):
            column, _, size = column.rpartition(":")
            block_tokens = int(size)
            if not 1 <= block_tokens <= MAX_PREFIX_BLOCK_TOKENS:
                raise ValueError(
                    f"--field {spec!r}: the prefix block size must be 1 … "
                    f"{MAX_PREFIX_BLOCK_TOKENS} tokens, got {block_tokens}"
                )
        columns[name] = column.strip()
    missing = [n for n in _REQUIRED if n not in columns]
    if missing:
        raise ValueError(f"--field: {', '.join(missing)} must be mapped (NAME=COLUMN)")
    return FieldMap(columns, units, block_tokens)


def load_mapped(
    path: str | Path, fields: FieldMap, *, max_tokens: MaxTokensPolicy = "exact"
) -> list[WorkloadRequest]:
    """Load a CSV or JSONL trace through ``fields`` (module docstring).

    Args:
        path: the file.
        fields: the mapping (:func:`parse_fields`).
        max_tokens: how each request's cap is derived from its output length.

    Raises:
        WorkloadError: a malformed file, a missing column (a JSON key no record
            has), or a bad value (the message names the line and field).
    """
    check_max_tokens_policy(max_tokens)
    path = Path(path)
    out: list[WorkloadRequest] = []
    first: float | None = None
    keys = _KeysSeen()
    for line, row in _rows(path, fields, keys):
        value = _Row(path, line, row, fields)
        stamp = value.arrival()
        first = stamp if first is None else first
        arrival = stamp - first
        if out and arrival < out[-1].arrival_s:
            raise WorkloadError(path, line, f"arrival goes backwards ({row['arrival']!r})")
        output, cap = resolve_max_tokens(value.count("output"), max_tokens)
        extra: dict[str, Any] = {}
        for name in ("tenant", "lane"):
            if name in row:
                extra[name] = value.text(name)
        if "priority" in row:
            extra["priority"] = value.priority()
        if "deadline" in row:
            extra["deadline_ms"] = value.deadline_ms()
        if "prefix" in row:
            extra["prefix"] = value.prefix()
            extra["prefix_block_tokens"] = fields.prefix_block_tokens
        out.append(WorkloadRequest(arrival, value.count("prompt"), output, cap, **extra))
    if not out:
        raise WorkloadError(path, None, "file is empty (no requests)")
    keys.check(path, fields)
    return out


class _KeysSeen:
    """Which mapped JSON keys some record has, and the first record's keys (for the error)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.first: tuple[int, list[str]] | None = None

    def add(self, line: int, obj: Mapping[str, Any], fields: FieldMap) -> None:
        """Note the mapped keys record ``obj`` (at ``line``) has."""
        if self.first is None:
            self.first = (line, list(obj))
        self.seen.update(name for name, key in fields.columns.items() if key in obj)

    def check(self, path: Path, fields: FieldMap) -> None:
        """Raise :class:`WorkloadError` for a mapped key no record has (none for a CSV,
        whose header has every mapped column or was refused)."""
        if self.first is None:
            return
        line, present = self.first
        for name, key in fields.columns.items():
            if name not in self.seen:
                raise WorkloadError(
                    path, line, f"{name}: no record has key {key!r} (this one has {present})"
                )


def _rows(path: Path, fields: FieldMap, keys: _KeysSeen) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line, {field name: raw value})`` for each record, in file order; JSON records'
    keys are noted in ``keys``."""
    with path.open(encoding="utf-8-sig", newline="") as stream:
        head = stream.read(1)
        stream.seek(0)
        if path.suffix.lower() in (".jsonl", ".ndjson") or head == "{":
            yield from _json_rows(path, stream, fields, keys)
        else:
            yield from _csv_rows(path, stream, fields)


def _json_rows(
    path: Path, stream: Any, fields: FieldMap, keys: _KeysSeen
) -> Iterator[tuple[int, dict[str, Any]]]:
    for line, obj in json_lines(path, stream):
        if not isinstance(obj, dict):
            raise WorkloadError(path, line, f"expected a JSON object, got {type(obj).__name__}")
        keys.add(line, obj, fields)
        row: dict[str, Any] = {}
        for name, key in fields.columns.items():
            if key in obj and obj[key] is not None:
                row[name] = obj[key]
            elif name in _REQUIRED:
                raise WorkloadError(path, line, f"{name}: key {key!r} is missing")
        yield line, row


def _csv_rows(path: Path, stream: Any, fields: FieldMap) -> Iterator[tuple[int, dict[str, Any]]]:
    def absent(names: list[str]) -> str:
        return "no column for " + ", ".join(f"{n}={fields.columns[n]!r}" for n in names)

    for line, cells in csv_table(path, stream, fields.columns, absent):
        row = {n: cell.strip() for n, cell in cells.items()}
        yield line, {n: v for n, v in row.items() if v or n in _REQUIRED}


class _Row:
    """One record's raw values, converted field by field with errors naming line and field."""

    def __init__(self, path: Path, line: int, row: dict[str, Any], fields: FieldMap) -> None:
        self.path, self.line, self.row, self.fields = path, line, row, fields

    def _fail(self, name: str, why: str) -> WorkloadError:
        column = self.fields.columns[name]
        return WorkloadError(self.path, self.line, f"{name} (column {column!r}): {why}")

    def _number(self, name: str) -> float:
        raw = self.row[name]
        try:
            value = float(raw) if not isinstance(raw, bool) else math.nan
        except (TypeError, ValueError):
            value = math.nan
        if not math.isfinite(value):
            raise self._fail(name, f"{raw!r} is not a finite number")
        return value

    def arrival(self) -> float:
        """Seconds on the trace's own scale (a datetime: seconds since 1970, UTC if no zone)."""
        unit = self.fields.units["arrival"]
        raw = self.row["arrival"]
        if unit == "iso" or (unit == "" and isinstance(raw, str) and not _is_number(raw)):
            try:
                stamp = datetime.fromisoformat(str(raw))
            except ValueError:
                raise self._fail("arrival", f"{raw!r} is not an ISO 8601 datetime") from None
            if stamp.tzinfo is None:
                stamp = stamp.replace(tzinfo=UTC)
            return stamp.timestamp()
        return self._number("arrival") * _SCALE[unit or "s"]

    def count(self, name: str) -> int:
        """A token count, an integer ``>= 1``."""
        value = self._number(name)
        if value != int(value) or value < 1:
            raise self._fail(name, f"{self.row[name]!r} is not an integer >= 1")
        return int(value)

    def text(self, name: str) -> str:
        """A non-empty string (a JSON number as its text)."""
        raw = self.row[name]
        if isinstance(raw, bool) or not isinstance(raw, str | int | float) or raw == "":
            raise self._fail(name, f"{raw!r} is not a non-empty string")
        return str(raw)

    def priority(self) -> int:
        """An integer 0 … 5."""
        value = self._number("priority")
        if value != int(value) or not 0 <= value <= 5:
            raise self._fail("priority", f"{self.row['priority']!r} is not an integer in [0, 5]")
        return int(value)

    def deadline_ms(self) -> float:
        """The deadline in milliseconds, ``> 0``."""
        value = self._number("deadline") * _SCALE[self.fields.units["deadline"]] * 1000.0
        if value <= 0.0:
            raise self._fail("deadline", f"{self.row['deadline']!r} must be > 0")
        return value

    def prefix(self) -> tuple[int, ...]:
        """Block hashes: a JSON list of integers, or integers in a CSV cell."""
        raw = self.row["prefix"]
        if isinstance(raw, str):
            parts = [p for p in _SEPARATORS.split(raw.strip().strip("[]")) if p]
            try:
                return tuple(int(p) for p in parts)
            except ValueError:
                raise self._fail("prefix", f"{raw!r} is not a list of integers") from None
        if isinstance(raw, list) and all(
            isinstance(h, int) and not isinstance(h, bool) for h in raw
        ):
            return tuple(raw)
        raise self._fail("prefix", f"{raw!r} is not a list of integers")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
