"""A trace's block size in its mapping (``prefix=hash_ids:512``), engine-block expansion,
whole-block credit in the engine model, and mapped keys no record has."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from sluicegate.cli import app
from sluicegate.config import parse_config
from sluicegate.engine import preset
from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.virtual_driver import simulate
from sluicegate.sim.workloads import WorkloadError, load_workload, write_jsonl
from sluicegate.sim.workloads.fields import load_mapped, parse_fields
from sluicegate.sim.workloads.trace_blocks import EngineBlocks

MOONCAKE_512 = [
    "arrival=timestamp:ms",
    "prompt=input_length",
    "output=output_length",
    "prefix=hash_ids:512",
]
ONE_REPLICA = """\
models:
  - name: default
simulation:
  preset: llama-3.1-8b-h100
  replicas: 1
"""


def mooncake(tmp_path: Path, rows: list[dict[str, object]]) -> Path:
    """A Mooncake-style JSONL trace."""
    path = tmp_path / "mooncake.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_prefix_block_size_is_parsed_off_the_column() -> None:
    """``prefix=hash_ids:512``: column ``hash_ids``, 512-token blocks; without a number the
    colon stays in the column name, and without a suffix the size is the engine's."""
    mapped = parse_fields(MOONCAKE_512)
    assert mapped.columns["prefix"] == "hash_ids"
    assert mapped.prefix_block_tokens == 512
    named = parse_fields(["arrival=t", "prompt=p", "output=o", "prefix=a:b"])
    assert (named.columns["prefix"], named.prefix_block_tokens) == ("a:b", None)
    plain = parse_fields(["arrival=t", "prompt=p", "output=o", "prefix=hash_ids"])
    assert (plain.columns["prefix"], plain.prefix_block_tokens) == ("hash_ids", None)


@pytest.mark.parametrize("size", ["0", "2097152"])
def test_a_block_size_out_of_range_is_refused(size: str) -> None:
    """0 tokens or more than 1 Mi tokens per block is refused, naming the option."""
    with pytest.raises(ValueError, match=r"prefix block size must be 1 … 1048576 tokens"):
        parse_fields(["arrival=t", "prompt=p", "output=o", f"prefix=hash_ids:{size}"])


def test_hash_ids_with_a_block_size_load_their_hashes(tmp_path: Path) -> None:
    """The regression: ``prefix=hash_ids:512`` used to look for a key ``hash_ids:512`` and
    load no prefix at all; now every request carries its hashes and their block size."""
    path = mooncake(
        tmp_path,
        [
            {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [4, 5, 6]},
            {"timestamp": 20, "input_length": 600, "output_length": 5, "hash_ids": [4, 7]},
        ],
    )
    got = load_mapped(path, parse_fields(MOONCAKE_512))
    assert got == [
        WorkloadRequest(0.0, 1100, 5, 5, prefix=(4, 5, 6), prefix_block_tokens=512),
        WorkloadRequest(0.02, 600, 5, 5, prefix=(4, 7), prefix_block_tokens=512),
    ]


def test_a_mapped_key_no_record_has_is_an_error_naming_it(tmp_path: Path) -> None:
    """A misspelt optional key fails naming the field, the key, the first record's line and
    its keys, instead of silently loading no prefixes."""
    path = mooncake(
        tmp_path,
        [{"timestamp": 0, "input_length": 40, "output_length": 5, "hash_ids": [1]}] * 2,
    )
    specs = [*MOONCAKE_512[:3], "prefix=hash_id"]
    with pytest.raises(WorkloadError, match=r"line 1: prefix: no record has key 'hash_id'") as err:
        load_mapped(path, parse_fields(specs))
    assert "'hash_ids'" in str(err.value)
    tenant = [*MOONCAKE_512, "tenant=user"]
    with pytest.raises(WorkloadError, match=r"tenant: no record has key 'user'"):
        load_mapped(path, parse_fields(tenant))


def test_a_key_some_records_have_is_fine(tmp_path: Path) -> None:
    """An optional key present in one record only is used there and defaulted elsewhere."""
    path = mooncake(
        tmp_path,
        [
            {"timestamp": 0, "input_length": 40, "output_length": 5},
            {"timestamp": 1, "input_length": 40, "output_length": 5, "hash_ids": [1, 2]},
        ],
    )
    got = load_mapped(path, parse_fields(MOONCAKE_512))
    assert [r.prefix for r in got] == [(), (1, 2)]


def test_our_jsonl_round_trips_the_block_size(tmp_path: Path) -> None:
    """``prefix_block_tokens`` is written and read back; absent means None."""
    requests = [
        WorkloadRequest(0.0, 1024, 4, 4, prefix=(1, 2), prefix_block_tokens=512),
        WorkloadRequest(1.0, 64, 4, 4, prefix=(3,)),
    ]
    path = tmp_path / "w.jsonl"
    write_jsonl(requests, path)
    assert load_workload(path) == requests


def test_each_trace_block_becomes_its_engine_blocks_chained() -> None:
    """512-token trace blocks at 16-token engine blocks: 32 derived hashes each, equal
    for equal leading trace hashes, different after the first differing one, and cut to
    the prompt's full engine blocks."""
    blocks = EngineBlocks(16)
    a = blocks.expand((1, 2), 512, 1024)
    b = blocks.expand((1, 3), 512, 1024)
    c = blocks.expand((9, 2), 512, 1024)
    assert len(a) == len(set(a)) == 64
    assert a[:32] == b[:32]
    assert a[32:] != b[32:]
    assert not set(a) & set(c)  # the same second trace hash after another first block
    assert blocks.expand((1, 2), 512, 700) == a[:43]  # 700 // 16 full engine blocks
    assert EngineBlocks(16).expand((1, 2), 512, 1024) == a  # the same in a fresh expander
    assert blocks.expand((1, 2, 3), None, 40) == (1, 2)
    assert blocks.expand((1, 2, 3), 16, 48) == (1, 2, 3)


@given(
    st.lists(st.integers(0, 5), max_size=6),
    st.lists(st.integers(0, 5), max_size=6),
    st.sampled_from([32, 64, 512]),
)
def test_engine_prefixes_agree_exactly_as_far_as_trace_prefixes_do(
    x: list[int], y: list[int], size: int
) -> None:
    """Two prompts' engine-block hashes agree on exactly ``k · size/16`` leading blocks,
    where ``k`` is the number of leading trace hashes they share."""
    blocks = EngineBlocks(16)
    ex = blocks.expand(x, size, len(x) * size)
    ey = blocks.expand(y, size, len(y) * size)
    k = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
    shared = next((i for i, (p, q) in enumerate(zip(ex, ey, strict=False)) if p != q), None)
    if shared is None:
        shared = min(len(ex), len(ey))
    assert shared == k * size // 16


def test_a_trace_block_that_is_not_whole_engine_blocks_is_refused() -> None:
    """500-token trace blocks straddle 16-token engine blocks: refused, saying so."""
    with pytest.raises(ValueError, match="500 tokens are not a whole number of the engine's 16"):
        EngineBlocks(16).expand((1,), 500, 1000)


def _cached(prefix_block_tokens: int | None) -> tuple[int, int]:
    """Simulate two 1024-token prompts sharing their first 512-token trace block, the second
    after the first finished; (cached tokens, queried tokens)."""
    config = parse_config(ONE_REPLICA, source="<test>", simulation=True)
    workload = [
        WorkloadRequest(0.0, 1024, 4, 4, prefix=(7, 8), prefix_block_tokens=prefix_block_tokens),
        WorkloadRequest(5.0, 1024, 4, 4, prefix=(7, 9), prefix_block_tokens=prefix_block_tokens),
    ]
    engine = preset(config.simulation.preset)
    result = simulate(config.scheduler_spec(), "default", workload, engine, 1)
    return result.prompt_tokens_cached, result.prompt_tokens_queried


def test_a_shared_trace_block_credits_all_its_tokens() -> None:
    """With the block size, the shared 512-token block saves 512 tokens of prefill; read
    as engine blocks (no size) it saved 16, 1/32 of it."""
    assert _cached(512) == (512, 2048)
    assert _cached(None) == (16, 2048)


def test_simulate_runs_a_mooncake_trace_with_512_token_blocks(tmp_path: Path) -> None:
    """``simulate --field prefix=hash_ids:512`` caches whole blocks (results.json's
    prefix_cache); a misspelt key exits 1 naming it."""
    rows = [
        {"timestamp": t * 500, "input_length": 1100, "output_length": 4, "hash_ids": [1, 2, t]}
        for t in range(10)
    ]
    path = mooncake(tmp_path, rows)
    out = tmp_path / "out"
    fields = [f"--field={spec}" for spec in MOONCAKE_512]
    args = ["simulate", "--trace", str(path), *fields, "--out", str(out), "--workers", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    prefix = json.loads((out / "results.json").read_text())["policies"]["config"]["prefix_cache"]
    # 9 later requests each find the two shared 512-token blocks (64 engine blocks) cached.
    assert prefix["cached_tokens"] == 9 * 1024
    assert prefix["hit_requests"] == 9
    bad = [*fields[:3], "--field=prefix=hash_id:512"]
    failed = CliRunner().invoke(app, ["simulate", "--trace", str(path), *bad, "--out", str(out)])
    assert failed.exit_code == 1
    assert "no record has key 'hash_id'" in failed.output
