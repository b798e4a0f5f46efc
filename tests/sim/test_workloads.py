"""Tests for the trace loaders (DESIGN §12): Azure and BurstGPT CSV, our JSONL, validation."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.workloads import (
    WorkloadError,
    load_azure_csv,
    load_burstgpt_csv,
    load_jsonl,
    load_workload,
    write_jsonl,
)

TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _assert_sorted_from_zero(requests: list[WorkloadRequest]) -> None:
    arrivals = [r.arrival_s for r in requests]
    assert arrivals[0] == 0.0
    assert all(a <= b for a, b in itertools.pairwise(arrivals))


@pytest.mark.parametrize(
    ("name", "rows", "span_s"),
    [
        # 18:15:46.6805900 to 19:14:08.4025270
        ("AzureLLMInferenceTrace_conv.csv", 19_366, 3501.721937),
        # 18:17:03.9799600 to 19:14:19.9280160
        ("AzureLLMInferenceTrace_code.csv", 8_819, 3435.948056),
    ],
)
def test_real_azure_trace_loads_sorted_from_zero(name: str, rows: int, span_s: float) -> None:
    """Each row of a real Azure trace is a request; arrivals start at 0, never decrease, and
    end at the span from the file's first timestamp to its last (just under an hour), to the
    microsecond."""
    requests = load_azure_csv(TRACES / name)
    assert len(requests) == rows
    _assert_sorted_from_zero(requests)
    assert requests[-1].arrival_s == pytest.approx(span_s, abs=1e-6)
    assert all(r.output_tokens == r.max_tokens >= 1 for r in requests)


def test_azure_first_row_matches_file() -> None:
    """Prompt and output come from ContextTokens and GeneratedTokens of the same row."""
    first = load_azure_csv(TRACES / "AzureLLMInferenceTrace_conv.csv")[0]
    assert (first.prompt_tokens, first.output_tokens) == (374, 44)


def test_load_workload_sniffs_azure() -> None:
    """A CSV whose header starts with TIMESTAMP is loaded as an Azure trace."""
    path = TRACES / "AzureLLMInferenceTrace_code.csv"
    assert load_workload(path) == load_azure_csv(path)


def test_azure_seven_digit_fractions_across_a_second(tmp_path: Path) -> None:
    """Arrivals subtract full datetimes with 7 fractional digits, across second boundaries."""
    path = _write(
        tmp_path,
        "a.csv",
        AZURE_HEADER + "2023-11-16 18:15:46.9000000,10,5\n"
        "2023-11-16 18:15:47.1000001,10,5\n"
        "2023-11-16 18:16:00,10,5\n",
    )
    arrivals = [r.arrival_s for r in load_azure_csv(path)]
    assert arrivals == pytest.approx([0.0, 0.2000001, 13.1], abs=1e-9)


def test_azure_integer_cap_truncates_output(tmp_path: Path) -> None:
    """A fixed max_tokens cap becomes max_tokens and truncates longer outputs."""
    path = _write(tmp_path, "a.csv", AZURE_HEADER + "2023-11-16 18:15:46,10,500\n")
    [request] = load_azure_csv(path, max_tokens=256)
    assert (request.output_tokens, request.max_tokens) == (256, 256)


def test_azure_pow2_cap_rounds_up(tmp_path: Path) -> None:
    """The pow2 policy rounds the output up to the next power of two for max_tokens."""
    path = _write(tmp_path, "a.csv", AZURE_HEADER + "2023-11-16 18:15:46,10,300\n")
    [request] = load_azure_csv(path, max_tokens="pow2")
    assert (request.output_tokens, request.max_tokens) == (300, 512)


def _burst_file(tmp_path: Path) -> Path:
    return _write(
        tmp_path,
        "burst.csv",
        BURST_HEADER + "5.0,ChatGPT,100,0,100,Conversation log\n"
        "7.5,ChatGPT,200,50,250,Conversation log\n"
        "8.0,GPT-4,300,60,360,API log\n"
        "9.25,ChatGPT,400,70,470,Conversation log\n",
    )


def test_burstgpt_skips_failures_and_rebases(tmp_path: Path) -> None:
    """Rows with 0 response tokens are skipped; arrivals count from the first kept row."""
    requests = load_burstgpt_csv(_burst_file(tmp_path))
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in requests] == [
        (0.0, 200, 50),
        (0.5, 300, 60),
        (1.75, 400, 70),
    ]


def test_burstgpt_model_filter(tmp_path: Path) -> None:
    """The model filter keeps only that model's rows."""
    requests = load_burstgpt_csv(_burst_file(tmp_path), model="GPT-4")
    assert [(r.arrival_s, r.prompt_tokens) for r in requests] == [(0.0, 300)]


def test_load_workload_sniffs_burstgpt(tmp_path: Path) -> None:
    """A CSV whose header starts with Timestamp,Model is loaded as BurstGPT."""
    path = _burst_file(tmp_path)
    assert load_workload(path, model="ChatGPT") == load_burstgpt_csv(path, model="ChatGPT")


def test_burstgpt_all_failed_is_an_error(tmp_path: Path) -> None:
    """A BurstGPT file with no successful row has no requests to replay."""
    path = _write(tmp_path, "b.csv", BURST_HEADER + "1.0,ChatGPT,10,0,10,API log\n")
    with pytest.raises(WorkloadError, match="no successful requests"):
        load_burstgpt_csv(path)


def test_jsonl_fields_and_defaults(tmp_path: Path) -> None:
    """JSONL keys map to WorkloadRequest; absent optional keys take the defaults."""
    path = _write(
        tmp_path,
        "w.jsonl",
        '{"arrival_s": 0.5, "prompt_tokens": 10, "output_tokens": 4}\n\n'
        '{"arrival_s": 1, "prompt_tokens": 20, "output_tokens": 8, "max_tokens": 16,'
        ' "tenant": "acme", "lane": "batch", "priority": 4, "deadline_ms": 2500}\n',
    )
    assert load_jsonl(path) == [
        WorkloadRequest(0.5, 10, 4, 4),
        WorkloadRequest(
            1.0, 20, 8, 16, tenant="acme", lane="batch", priority=4, deadline_ms=2500.0
        ),
    ]


def test_jsonl_round_trip(tmp_path: Path) -> None:
    """write_jsonl then load_jsonl gives back the same requests."""
    requests = [
        WorkloadRequest(0.0, 1, 1, 1),
        WorkloadRequest(0.1 + 0.2, 7, 3, 8, tenant="t", lane="l", priority=0, deadline_ms=1.5),
    ]
    path = tmp_path / "out.jsonl"
    write_jsonl(requests, path)
    assert load_jsonl(path) == requests


def test_load_workload_sniffs_jsonl_by_content(tmp_path: Path) -> None:
    """A file whose first character is '{' is JSONL whatever its extension."""
    path = _write(tmp_path, "w.txt", '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}\n')
    assert load_workload(path) == [WorkloadRequest(0.0, 1, 1, 1)]


def test_load_workload_rejects_unknown_header(tmp_path: Path) -> None:
    """A CSV that is neither Azure nor BurstGPT is an error naming the header."""
    path = _write(tmp_path, "x.csv", "time,prompt,output\n1,2,3\n")
    with pytest.raises(WorkloadError, match="unrecognised workload header"):
        load_workload(path)


def test_load_workload_rejects_model_filter_for_azure(tmp_path: Path) -> None:
    """The model filter applies only to BurstGPT, so asking for it elsewhere is an error."""
    path = _write(tmp_path, "a.csv", AZURE_HEADER + "2023-11-16 18:15:46,10,5\n")
    with pytest.raises(WorkloadError, match="BurstGPT"):
        load_workload(path, model="ChatGPT")


AZ_ROW = "2023-11-16 18:15:46.6805900,374,44\n"
BU_ROW = "1.5,ChatGPT,10,5,15,API log\n"
JS_ROW = '{"arrival_s": 1.0, "prompt_tokens": 10, "output_tokens": 5}\n'

MALFORMED = [
    ("azure missing column", "a.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,10\n", 1,
     "'GeneratedTokens'"),
    ("azure non-numeric", "a.csv", AZURE_HEADER + AZ_ROW + "2023-11-16 18:15:47,ten,4\n", 3,
     "not an integer"),
    ("azure negative", "a.csv", AZURE_HEADER + "2023-11-16 18:15:47,10,-4\n", 2, ">= 1"),
    ("azure zero", "a.csv", AZURE_HEADER + AZ_ROW + AZ_ROW + "2023-11-16 18:15:47,0,4\n", 4,
     ">= 1"),
    ("azure bad datetime", "a.csv", AZURE_HEADER + "16/11/2023 18:15,10,4\n", 2, "TIMESTAMP"),
    ("azure bad fraction", "a.csv", AZURE_HEADER + "2023-11-16 18:15:46.12x,10,4\n", 2,
     "TIMESTAMP"),
    ("azure backwards", "a.csv", AZURE_HEADER + AZ_ROW + "2023-11-16 18:15:46.5,1,1\n", 3,
     "timestamp goes backwards (2023-11-16 18:15:46.5 < 2023-11-16 18:15:46.6805900)"),
    ("azure field count", "a.csv", AZURE_HEADER + AZ_ROW + "2023-11-16 18:15:47,1\n", 3,
     "expected 3 fields, got 2"),
    ("burst missing column", "b.csv", "Timestamp,Model,Request tokens\n1,ChatGPT,3\n", 1,
     "'Response tokens'"),
    ("burst bad timestamp", "b.csv", BURST_HEADER + BU_ROW + "soon,ChatGPT,1,1,2,x\n", 3,
     "not a finite number"),
    ("burst negative", "b.csv", BURST_HEADER + "1,ChatGPT,10,-5,5,x\n", 2, ">= 0"),
    ("burst backwards", "b.csv", BURST_HEADER + BU_ROW + "0.5,ChatGPT,1,1,2,x\n", 3,
     "timestamp goes backwards (0.5 < 1.5)"),
    ("jsonl malformed", "w.jsonl", JS_ROW + '{"arrival_s": 2,\n', 2, "malformed JSON"),
    ("jsonl not object", "w.jsonl", "[1, 2]\n", 1, "expected a JSON object"),
    ("jsonl unknown key", "w.jsonl", JS_ROW + JS_ROW.replace("}", ', "user": "x"}'), 2,
     "unknown key(s) 'user'"),
    ("jsonl missing key", "w.jsonl", '{"arrival_s": 0, "prompt_tokens": 3}\n', 1,
     "missing key(s) 'output_tokens'"),
    ("jsonl output over cap", "w.jsonl", JS_ROW.replace("}", ', "max_tokens": 4}'), 1,
     "output_tokens 5 > max_tokens 4"),
    ("jsonl negative", "w.jsonl", JS_ROW.replace('"prompt_tokens": 10', '"prompt_tokens": -1'),
     1, "prompt_tokens must be >= 1"),
    ("jsonl non-numeric", "w.jsonl", JS_ROW.replace('"output_tokens": 5', '"output_tokens": "5"'),
     1, "output_tokens must be an integer"),
    ("jsonl bool", "w.jsonl", JS_ROW.replace('"output_tokens": 5', '"output_tokens": true'), 1,
     "output_tokens must be an integer"),
    ("jsonl priority", "w.jsonl", JS_ROW.replace("}", ', "priority": 9}'), 1, "[0, 5]"),
    ("jsonl deadline", "w.jsonl", JS_ROW.replace("}", ', "deadline_ms": 0}'), 1,
     "deadline_ms must be > 0"),
    ("jsonl negative arrival", "w.jsonl", JS_ROW.replace("1.0", "-1.0"), 1, "arrival_s"),
    ("jsonl backwards", "w.jsonl", JS_ROW + JS_ROW.replace("1.0", "0.25"), 2,
     "timestamp goes backwards (0.25 < 1.0)"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "content", "line", "fragment"),
    [case[1:] for case in MALFORMED],
    ids=[case[0] for case in MALFORMED],
)
def test_malformed_file_names_file_and_line(
    tmp_path: Path, name: str, content: str, line: int, fragment: str
) -> None:
    """A malformed file raises WorkloadError naming the file, the line and the problem."""
    path = _write(tmp_path, name, content)
    with pytest.raises(WorkloadError) as info:
        load_workload(path)
    message = str(info.value)
    assert message.startswith(f"{path}: line {line}: "), message
    assert fragment in message
    assert info.value.line == line


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("a.csv", "", "empty"),
        ("a.csv", "\n\n", "empty"),
        ("w.jsonl", "", "empty"),
        ("w.jsonl", "\n  \n", "empty"),
        ("a.csv", AZURE_HEADER, "header but no rows"),
        ("b.csv", BURST_HEADER + "\n", "header but no rows"),
    ],
)
def test_empty_or_header_only_file(tmp_path: Path, name: str, content: str, fragment: str) -> None:
    """An empty or header-only file raises WorkloadError naming the file."""
    path = _write(tmp_path, name, content)
    with pytest.raises(WorkloadError) as info:
        load_workload(path)
    assert str(info.value).startswith(f"{path}: ")
    assert fragment in str(info.value)


def test_header_only_azure_via_direct_loader(tmp_path: Path) -> None:
    """The format-specific loaders reject a header-only file too (not just load_workload)."""
    path = _write(tmp_path, "a.csv", AZURE_HEADER)
    with pytest.raises(WorkloadError, match="header but no rows"):
        load_azure_csv(path)


def test_workload_error_is_a_value_error() -> None:
    """Callers that catch ValueError also catch WorkloadError."""
    assert issubclass(WorkloadError, ValueError)
