"""Tests for load-generator records and their CSV form."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluicegate.bench import COLUMNS, RequestRecord, read_csv, write_csv

_TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"))
_FLOAT = st.floats(allow_nan=False, allow_infinity=False)
_INT = st.integers(min_value=-(2**40), max_value=2**40)

_RECORDS = st.builds(
    RequestRecord,
    index=_INT,
    tenant=_TEXT,
    lane=_TEXT,
    priority=_INT,
    prompt_tokens=_INT,
    max_tokens=_INT,
    deadline_ms=st.none() | _FLOAT,
    scheduled_s=_FLOAT,
    launch_lag_s=_FLOAT,
    status=_INT,
    error=_TEXT,
    queue_ms=st.none() | _FLOAT,
    retry_after_s=st.none() | _FLOAT,
    ttft_s=st.none() | _FLOAT,
    e2e_s=_FLOAT,
    output_tokens=_INT,
    itl_mean_s=st.none() | _FLOAT,
    itl_max_s=st.none() | _FLOAT,
    finish_reason=_TEXT,
)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(_RECORDS, max_size=5))
def test_csv_round_trips_every_field(tmp_path: Path, records: list[RequestRecord]) -> None:
    """``read_csv(write_csv(records))`` gives the same records (None, floats and text exact)."""
    path = tmp_path / "run.csv"
    write_csv(records, path)
    assert read_csv(path) == records


def test_csv_header_names_the_record_fields(tmp_path: Path) -> None:
    """The header row is the field names in order."""
    path = tmp_path / "run.csv"
    write_csv([], path)
    assert path.read_text(encoding="utf-8").strip() == ",".join(COLUMNS)


def test_missing_column_is_reported(tmp_path: Path) -> None:
    """A file without one of the columns is refused, naming the column."""
    path = tmp_path / "run.csv"
    path.write_text(",".join(c for c in COLUMNS if c != "e2e_s") + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="e2e_s"):
        read_csv(path)


def test_unparseable_cell_names_its_column(tmp_path: Path) -> None:
    """A cell that does not parse is reported with its column."""
    path = tmp_path / "run.csv"
    row = ["0", "t", "l", "2", "1", "1", "", "0.0", "0.0", "OK", "", "", "", "", "0.1"]
    row += ["1", "", "", ""]
    path.write_text(",".join(COLUMNS) + "\n" + ",".join(row) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="'status'"):
        read_csv(path)


def test_ok_requires_2xx_and_no_error() -> None:
    """A 200 whose stream broke off is not ok; a plain 200 is."""
    base = RequestRecord(
        0, "t", "l", 2, 1, 1, None, 0.0, 0.0, 200, "", None, None, 0.1, 0.2, 1, None, None, ""
    )
    broken = RequestRecord(
        0, "t", "l", 2, 1, 1, None, 0.0, 0.0, 200, "stream_interrupted", None, None, 0.1, 0.2, 1,
        None, None, "",
    )  # fmt: skip
    assert base.ok
    assert not broken.ok
