"""The error every workload loader raises: :class:`WorkloadError`, naming the file and line.

Shared by the CSV traces (``traces.py``), our JSONL (``jsonl.py``) and field
mappings (``fields.py``), so that each reports a bad file the same way.
"""

from __future__ import annotations

from pathlib import Path

from sluicegate.errors import SluicegateError

__all__ = ["WorkloadError", "backwards"]


class WorkloadError(SluicegateError, ValueError):
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


def backwards(path: str | Path, line: int, current: object, previous: object) -> WorkloadError:
    """The error for a timestamp earlier than the one on the line before."""
    return WorkloadError(path, line, f"timestamp goes backwards ({current} < {previous})")
