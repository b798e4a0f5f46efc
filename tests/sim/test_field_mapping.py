"""Loading any CSV/JSONL trace through ``--field`` mappings, and ``--max-tokens`` everywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sluicegate.cli import app
from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.workload_options import build_workload, workload_options
from sluicegate.sim.workloads import WorkloadError, load_workload, write_jsonl
from sluicegate.sim.workloads.fields import load_mapped, parse_fields

MOONCAKE = [
    "--field=arrival=timestamp:ms",
    "--field=prompt=input_length",
    "--field=output=output_length",
    "--field=prefix=hash_ids",
]
runner = CliRunner()


def mooncake(tmp_path: Path, rows: list[dict[str, object]]) -> Path:
    """A Mooncake-style JSONL trace (extra keys are ignored by a mapping)."""
    path = tmp_path / "mooncake.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def fields(*specs: str) -> list[str]:
    """``--field=X`` options without the flag."""
    return [s.removeprefix("--field=") for s in specs]


def test_a_mooncake_trace_loads_with_ms_arrivals_and_hashes(tmp_path: Path) -> None:
    """Arrivals in ms are rebased seconds; hash_ids become the prefix; other keys ignored."""
    path = mooncake(
        tmp_path,
        [
            {"timestamp": 1000, "input_length": 40, "output_length": 5, "hash_ids": [1, 2]},
            {"timestamp": 1500, "input_length": 70, "output_length": 9, "hash_ids": [1, 2, 3, 4]},
        ],
    )
    got = load_mapped(path, parse_fields(fields(*MOONCAKE)))
    assert got == [
        WorkloadRequest(0.0, 40, 5, 5, prefix=(1, 2)),
        WorkloadRequest(0.5, 70, 9, 9, prefix=(1, 2, 3, 4)),
    ]


@pytest.mark.parametrize(
    ("unit", "raw", "seconds"),
    [("s", "2.5", 2.5), ("ms", "2500", 2.5), ("us", "2500000", 2.5), ("", "2.5", 2.5)],
)
def test_arrival_units_scale_numbers(tmp_path: Path, unit: str, raw: str, seconds: float) -> None:
    """s, ms, us and no unit (seconds) give the same rebased arrival."""
    path = tmp_path / "t.csv"
    path.write_text(f"t,p,o\n0,10,3\n{raw},10,3\n")
    spec = f"arrival=t:{unit}" if unit else "arrival=t"
    got = load_mapped(path, parse_fields([spec, "prompt=p", "output=o"]))
    assert [r.arrival_s for r in got] == [0.0, pytest.approx(seconds)]


def test_iso_arrivals_with_and_without_a_zone(tmp_path: Path) -> None:
    """ISO datetimes (no unit, or :iso) are seconds apart; a zone is honoured."""
    path = tmp_path / "t.csv"
    path.write_text(
        "when,p,o\n2024-05-01T12:00:00,10,3\n2024-05-01T12:00:01.5,10,3\n"
        "2024-05-01T14:00:02+02:00,10,3\n"
    )
    for spec in ("arrival=when", "arrival=when:iso"):
        got = load_mapped(path, parse_fields([spec, "prompt=p", "output=o"]))
        assert [r.arrival_s for r in got] == [0.0, 1.5, 2.0]


def test_csv_optional_fields_and_deadline_units(tmp_path: Path) -> None:
    """tenant, lane, priority, deadline (s → ms) and a bracketed hash list from a CSV."""
    path = tmp_path / "t.csv"
    path.write_text('ts,in,out,who,cls,prio,slo,h\n0,32,4,acme,batch,4,1.5,"[7, 8]"\n')
    specs = ["arrival=ts", "prompt=in", "output=out", "tenant=who", "lane=cls",
             "priority=prio", "deadline=slo:s", "prefix=h"]  # fmt: skip
    [got] = load_mapped(path, parse_fields(specs))
    assert got == WorkloadRequest(
        0.0, 32, 4, 4, tenant="acme", lane="batch", priority=4, deadline_ms=1500.0, prefix=(7, 8)
    )


def test_empty_optional_cells_keep_the_defaults(tmp_path: Path) -> None:
    """An empty CSV cell of an optional field means the field's default."""
    path = tmp_path / "t.csv"
    path.write_text("ts,in,out,who,h\n0,32,4,,\n")
    specs = ["arrival=ts", "prompt=in", "output=out", "tenant=who", "prefix=h"]
    assert load_mapped(path, parse_fields(specs)) == [WorkloadRequest(0.0, 32, 4, 4)]


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (["arrival=t", "prompt=p"], "output must be mapped"),
        (["arrival=t", "prompt=p", "output=o", "colour=c"], "unknown name 'colour'"),
        (["arrival=t:hours", "prompt=p", "output=o"], "unit 'hours' of arrival"),
        (["arrival=t", "prompt=p", "output=o", "deadline=d:iso"], "unit 'iso' of deadline"),
        (["arrival=t", "prompt=p", "prompt=q", "output=o"], "prompt is mapped twice"),
        (["arrival", "prompt=p", "output=o"], "NAME=COLUMN"),
    ],
)
def test_bad_mappings_are_refused(specs: list[str], message: str) -> None:
    """Each malformed mapping is refused with a message naming the problem."""
    with pytest.raises(ValueError, match=message):
        parse_fields(specs)


def test_a_colon_is_part_of_the_column_of_fields_without_units(tmp_path: Path) -> None:
    """Only arrival and deadline take a unit: ``prompt=a:b`` names the column ``a:b``."""
    assert parse_fields(["arrival=t", "prompt=a:b", "output=o"]).columns["prompt"] == "a:b"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"ts": 0, "n": "x", "m": 3}, r"line 2: prompt \(column 'n'\): 'x' is not a finite"),
        ({"ts": 0, "n": 0, "m": 3}, r"line 2: prompt \(column 'n'\): 0 is not an integer >= 1"),
        ({"ts": 0, "n": 2.5, "m": 3}, r"line 2: prompt .*2.5 is not an integer"),
        ({"ts": 0, "m": 3}, r"line 2: prompt: key 'n' is missing"),
        ({"ts": "noon", "n": 2, "m": 3}, r"line 2: arrival .*'noon' is not an ISO 8601"),
        ({"ts": 0, "n": 2, "m": 3, "h": "1,x"}, r"line 2: prefix .*not a list of integers"),
        ({"ts": 0, "n": 2, "m": 3, "h": [1, True]}, r"line 2: prefix"),
        ({"ts": -1, "n": 2, "m": 3}, r"line 2: arrival goes backwards"),
    ],
)
def test_bad_values_name_the_line_and_field(
    tmp_path: Path, row: dict[str, object], message: str
) -> None:
    """The error names the file's line and the field (and its column)."""
    path = mooncake(tmp_path, [{"ts": 0, "n": 2, "m": 3}, row])
    specs = ["arrival=ts", "prompt=n", "output=m", "prefix=h"]
    with pytest.raises(WorkloadError, match=message):
        load_mapped(path, parse_fields(specs))


def test_a_missing_csv_column_is_named(tmp_path: Path) -> None:
    """A mapped column absent from the header is refused on line 1."""
    path = tmp_path / "t.csv"
    path.write_text("ts,in\n0,3\n")
    with pytest.raises(WorkloadError, match=r"line 1: no column for output='out'"):
        load_mapped(path, parse_fields(["arrival=ts", "prompt=in", "output=out"]))


@pytest.mark.parametrize(("policy", "caps"), [("pow2", [8, 16]), (8, [8, 8])])
def test_max_tokens_applies_to_mapped_traces(
    tmp_path: Path, policy: str | int, caps: list[int]
) -> None:
    """``pow2`` rounds the cap up; an integer caps and truncates the output."""
    path = mooncake(tmp_path, [{"a": 0, "p": 4, "o": 5}, {"a": 1, "p": 4, "o": 9}])
    got = load_mapped(
        path,
        parse_fields(["arrival=a", "prompt=p", "output=o"]),
        max_tokens=policy,  # type: ignore[arg-type]
    )
    assert [r.max_tokens for r in got] == caps
    assert [r.output_tokens for r in got] == ([5, 9] if policy == "pow2" else [5, 8])


def test_max_tokens_applies_to_our_jsonl_and_exact_keeps_its_caps(tmp_path: Path) -> None:
    """Our JSONL: ``exact`` keeps the file's max_tokens; pow2 and N replace them."""
    path = tmp_path / "w.jsonl"
    write_jsonl([WorkloadRequest(0.0, 4, 5, 100), WorkloadRequest(1.0, 4, 9, 9)], path)
    assert [r.max_tokens for r in load_workload(path)] == [100, 9]
    assert [r.max_tokens for r in load_workload(path, max_tokens="pow2")] == [8, 16]
    capped = load_workload(path, max_tokens=6)
    assert [(r.output_tokens, r.max_tokens) for r in capped] == [(5, 6), (6, 6)]


def test_our_jsonl_round_trips_a_prefix(tmp_path: Path) -> None:
    """write_jsonl writes ``prefix`` only when there is one; load_jsonl reads it back."""
    path = tmp_path / "w.jsonl"
    requests = [WorkloadRequest(0.0, 40, 5, 5, prefix=(3, 4)), WorkloadRequest(1.0, 4, 9, 9)]
    write_jsonl(requests, path)
    assert "prefix" not in path.read_text().splitlines()[1]
    assert load_workload(path) == requests


def test_build_workload_uses_the_mapping_only_for_traces(tmp_path: Path) -> None:
    """--field goes with --trace; with a trace the mapping and --max-tokens both apply."""
    path = mooncake(tmp_path, [{"a": 0, "p": 4, "o": 5}])
    opts = workload_options(
        trace=path, poisson_rate=None, gamma=None, duration_s=10.0, window=None,
        rate_scale=1.0, mix=None, seed=0, max_tokens="pow2",
        fields=("arrival=a", "prompt=p", "output=o"),
    )  # fmt: skip
    assert build_workload(opts) == [WorkloadRequest(0.0, 4, 5, 8)]
    bad = workload_options(
        trace=None, poisson_rate=1.0, gamma=None, duration_s=10.0, window=None,
        rate_scale=1.0, mix=None, seed=0, fields=("arrival=a",),
    )  # fmt: skip
    with pytest.raises(ValueError, match="--field applies only to --trace"):
        build_workload(bad)


def test_simulate_loads_a_mapped_trace_from_the_cli(tmp_path: Path) -> None:
    """``sluicegate simulate --trace … --field …`` runs; a bad mapping exits 1 naming it."""
    path = mooncake(
        tmp_path,
        [{"timestamp": t * 100, "input_length": 64, "output_length": 8, "hash_ids": [1, 2, 3]}
         for t in range(20)],
    )  # fmt: skip
    out = tmp_path / "out"
    args = ["simulate", "--trace", str(path), *MOONCAKE, "--policy", "fifo", "--out", str(out),
            "--workers", "1"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (out / "results.json").exists()
    bad = runner.invoke(app, ["simulate", "--trace", str(path), "--field", "arrival=x"])
    assert bad.exit_code == 1
    assert "prompt, output must be mapped" in bad.output
