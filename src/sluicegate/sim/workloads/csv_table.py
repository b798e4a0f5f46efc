"""Reading a CSV trace with a header row: the cells of the columns a loader needs, row by
row, checked as they are read. Shared by the Azure and BurstGPT loaders (``traces.py``)
and field mappings (``fields.py``), so that a bad CSV is reported the same way by both.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

from sluicegate.sim.workloads.workload_errors import WorkloadError

__all__ = ["csv_table"]


def csv_table(
    path: Path,
    stream: Iterable[str],
    columns: Mapping[str, str],
    absent: Callable[[list[str]], str],
) -> Iterator[tuple[int, dict[str, str]]]:
    """``(line, {key: cell})`` for each non-blank row after the header, where ``columns``
    maps each key to its header name; cells are as written (not stripped).

    The header is the first non-blank row. Raises :class:`WorkloadError` for an empty
    file, a header without some of the columns (the message is ``absent(keys)`` of the
    missing keys, then the header), a row with another number of cells than the header,
    or malformed CSV.
    """
    reader = csv.reader(stream)
    try:
        header = next((row for row in reader if any(c.strip() for c in row)), None)
        if header is None:
            raise WorkloadError(path, None, "file is empty")
        names = [c.strip() for c in header]
        missing = [key for key, column in columns.items() if column not in names]
        if missing:
            raise WorkloadError(path, reader.line_num, f"{absent(missing)}; header is {names}")
        index = {key: names.index(column) for key, column in columns.items()}
        for row in reader:
            if not any(c.strip() for c in row):
                continue
            if len(row) != len(names):
                raise WorkloadError(
                    path, reader.line_num, f"expected {len(names)} fields, got {len(row)}"
                )
            yield reader.line_num, {key: row[i] for key, i in index.items()}
    except csv.Error as exc:
        raise WorkloadError(path, reader.line_num, f"malformed CSV: {exc}") from exc
