"""Preset files: a written preset loads back equal, names still resolve, and every bad
file is refused naming the file and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluicegate.calibrate.preset_file import (
    PRESET_FORMAT,
    PresetFileError,
    load_engine_config,
    write_preset_file,
)
from sluicegate.config import ConfigError, parse_config
from sluicegate.engine import EngineConfig, preset

CONFIG = EngineConfig(
    max_num_seqs=4, max_num_batched_tokens=512, kv_capacity_tokens=4096, block_size=16,
    base_s=0.004, per_prefill_token_s=2e-6, per_decode_seq_s=1e-3, per_kv_token_s=2e-7,
    per_prefill_attn_s=1e-9, request_overhead_s=0.003, response_overhead_s=0.002,
)  # fmt: skip


def test_a_written_preset_loads_back_equal(tmp_path: Path) -> None:
    """``write_preset_file`` then ``load_engine_config(path)`` gives the same config, and
    the provenance is kept in the file as given."""
    path = tmp_path / "engine.json"
    write_preset_file(path, CONFIG, {"url": "http://127.0.0.1:1", "repeats": 3})
    assert load_engine_config(str(path)) == CONFIG
    assert json.loads(path.read_text())["measured"] == {"url": "http://127.0.0.1:1", "repeats": 3}


def test_a_name_is_the_builtin_preset() -> None:
    """A key of ``PRESETS`` resolves to that preset."""
    assert load_engine_config("tiny") is preset("tiny")


def write(tmp_path: Path, document: object) -> str:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    return str(path)


def engine(**changes: object) -> dict[str, object]:
    fields = {"max_num_seqs": 4, "max_num_batched_tokens": 512, "kv_capacity_tokens": 4096}
    return {"format": PRESET_FORMAT, "engine": {**fields, **changes}}


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({**engine(), "format": "other/2"}, "field 'format' must be"),
        ({**engine(), "extra": 1}, "unknown key 'extra'"),
        (engine(speed=3), "unknown field 'engine.speed'"),
        ({"format": PRESET_FORMAT, "engine": {"max_num_seqs": 4}},
         "missing field 'engine.max_num_batched_tokens'"),
        (engine(base_s="fast"), "field 'engine.base_s' must be a number"),
        (engine(max_num_seqs=2.5), "field 'engine.max_num_seqs' must be an integer"),
        (engine(enable_chunked_prefill=1), "field 'engine.enable_chunked_prefill' must be true"),
        (engine(per_decode_seq_s=-1.0), "'engine.per_decode_seq_s': per_decode_seq_s must be"),
        (engine(base_s=0.0), "field 'engine.base_s': base_s must be > 0"),
        ({**engine(), "measured": []}, "field 'measured' must be an object"),
        ([1, 2], "must hold a JSON object"),
    ],
)  # fmt: skip
def test_a_bad_file_is_refused_naming_the_field(
    tmp_path: Path, document: object, message: str
) -> None:
    """Each flaw is refused with the file's path and the offending field."""
    path = write(tmp_path, document)
    with pytest.raises(PresetFileError) as refused:
        load_engine_config(path)
    assert path in str(refused.value)
    assert message in str(refused.value)


def test_not_json_and_unknown_names_are_refused(tmp_path: Path) -> None:
    """A file that is not JSON, and a name that is neither a preset nor a file."""
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(PresetFileError, match="cannot read it as JSON"):
        load_engine_config(str(path))
    with pytest.raises(PresetFileError, match="'tinyy' is neither a preset name"):
        load_engine_config("tinyy")


def test_simulation_preset_takes_a_file_and_refuses_a_bad_one(tmp_path: Path) -> None:
    """``simulation.preset`` accepts a preset file's path; a bad one fails at load, the
    error naming the field."""
    good = tmp_path / "engine.json"
    write_preset_file(good, CONFIG, {})
    body = "models:\n  - name: m\n    backends: [{name: a, url: 'http://127.0.0.1:1'}]\n"
    config = parse_config(body + f"simulation: {{preset: '{good}'}}\n")
    assert load_engine_config(config.simulation.preset) == CONFIG
    bad = write(tmp_path, engine(speed=3))
    with pytest.raises(ConfigError, match=r"simulation\.preset.*unknown field 'engine.speed'"):
        parse_config(body + f"simulation: {{preset: '{bad}'}}\n")
