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


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
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


def _measured(**fields: object) -> RequestRecord:
    """A streamed 200 launched 0.5 s late at 10.5 s: TTFT 0.25 s, end-to-end 2 s."""
    values: dict[str, object] = {
        "index": 7, "tenant": "t", "lane": "interactive", "priority": 1, "prompt_tokens": 30,
        "max_tokens": 64, "deadline_ms": None, "scheduled_s": 10.0, "launch_lag_s": 0.5,
        "status": 200, "error": "", "queue_ms": 100.0, "retry_after_s": None, "ttft_s": 0.25,
        "e2e_s": 2.0, "output_tokens": 40, "itl_mean_s": 0.01, "itl_max_s": 0.02,
        "finish_reason": "stop",
    }  # fmt: skip
    values.update(fields)
    return RequestRecord(**values)  # type: ignore[arg-type]


def test_as_outcome_measures_from_the_launch() -> None:
    """Arrival is the launch; admission, first token, finish and deadline follow from it."""
    outcome = _measured().as_outcome(3000.0)
    assert outcome.outcome == "completed"
    assert (outcome.index, outcome.tenant, outcome.priority) == (7, "t", 1)
    assert outcome.lane == "interactive"
    assert (outcome.arrival_s, outcome.admit_s) == (10.5, pytest.approx(10.6))
    assert (outcome.first_token_s, outcome.finish_s, outcome.deadline_s) == (10.75, 12.5, 13.5)
    assert (outcome.ttft_s, outcome.e2e_s, outcome.queue_wait_s) == (0.25, 2.0, pytest.approx(0.1))
    assert (outcome.prompt_tokens, outcome.output_tokens, outcome.generated_tokens) == (30, 64, 40)
    assert (outcome.replica, outcome.requeues) == (None, 0)
    assert outcome.good


def test_as_outcome_prefers_the_own_deadline_and_may_have_none() -> None:
    """Own ``deadline_ms`` beats the lane's SLO; with neither there is no deadline."""
    assert _measured(deadline_ms=1000.0).as_outcome(3000.0).deadline_s == 11.5
    assert not _measured(deadline_ms=1000.0).as_outcome(3000.0).good
    no_deadline = _measured().as_outcome(None)
    assert no_deadline.deadline_s is None
    assert no_deadline.good


@pytest.mark.parametrize(
    ("status", "error", "expected"),
    [
        (429, "rate_limited", "rate_limited"),
        (503, "queue_timeout", "queue_timeout"),
        (500, "", "http_500"),
        (0, "connection_error", "connection_error"),
        (200, "stream_interrupted", "stream_interrupted"),
    ],
)
def test_as_outcome_names_a_failure_by_its_error(status: int, error: str, expected: str) -> None:
    """Anything but a clean 2xx ends with its error code (or its status), never completed."""
    outcome = _measured(status=status, error=error).as_outcome(3000.0)
    assert outcome.outcome == expected
    assert not outcome.good
    assert outcome.e2e_s is None
