"""Engine presets as files: a name from ``PRESETS`` or a JSON file ``sluicegate calibrate``
wrote, both read through ``load_engine_config``.

A preset file is one JSON object::

    {"format": "sluicegate-engine-preset/1",
     "engine": {<EngineConfig fields>},
     "measured": {<free-form provenance: url, model, engine kind, date, command, errors>}}

``engine`` must name ``max_num_seqs``, ``max_num_batched_tokens`` and
``kv_capacity_tokens``; every other ``EngineConfig`` field is optional and takes its
default. An unknown key, a missing one, a value of the wrong type or out of range is
refused with a ``PresetFileError`` naming the field and the file.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator

from sluicegate.engine.engine_config import EngineConfig
from sluicegate.engine.presets import PRESETS
from sluicegate.errors import SluicegateError

PRESET_FORMAT = "sluicegate-engine-preset/1"
"""The ``format`` a preset file declares; another is refused."""

_TOP_KEYS = ("format", "engine", "measured")
_FIELDS = {field.name: field for field in dataclasses.fields(EngineConfig)}
_REQUIRED = tuple(
    name
    for name, field in _FIELDS.items()
    if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
)


class PresetFileError(SluicegateError, ValueError):
    """A preset that is neither a known name nor a valid preset file; the message names
    the file and the offending field."""


def load_engine_config(name_or_path: str) -> EngineConfig:
    """The engine a preset names: a key of ``PRESETS``, else a path to a preset file.

    Raises:
        PresetFileError: neither a known name nor a readable, valid preset file.
    """
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        known = ", ".join(sorted(PRESETS))
        raise PresetFileError(
            f"engine preset {name_or_path!r} is neither a preset name ({known}) nor a preset file"
        )
    return read_preset_file(path)


def _loadable(name_or_path: str) -> str:
    load_engine_config(name_or_path)
    return name_or_path


PresetName = Annotated[str, AfterValidator(_loadable)]
"""A configuration field naming a preset: refused when it is neither a preset name nor a
valid preset file (a path relative to the working directory)."""


def read_preset_file(path: Path) -> EngineConfig:
    """The ``EngineConfig`` a preset file holds (its ``measured`` part is not checked).

    Raises:
        PresetFileError: unreadable, not JSON, another format, or a bad ``engine`` field.
    """
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PresetFileError(f"preset file {path}: cannot read it as JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise PresetFileError(f"preset file {path}: must hold a JSON object")
    unknown = sorted(set(document) - set(_TOP_KEYS))
    if unknown:
        raise PresetFileError(f"preset file {path}: unknown key {unknown[0]!r}")
    if document.get("format") != PRESET_FORMAT:
        raise PresetFileError(
            f"preset file {path}: field 'format' must be {PRESET_FORMAT!r}, "
            f"got {document.get('format')!r}"
        )
    engine = document.get("engine")
    if not isinstance(engine, dict):
        raise PresetFileError(f"preset file {path}: field 'engine' must be an object")
    measured = document.get("measured", {})
    if not isinstance(measured, dict):
        raise PresetFileError(f"preset file {path}: field 'measured' must be an object")
    return _engine_config(path, engine)


def _engine_config(path: Path, engine: dict[str, Any]) -> EngineConfig:
    for name in engine:
        if name not in _FIELDS:
            raise PresetFileError(f"preset file {path}: unknown field 'engine.{name}'")
    for name in _REQUIRED:
        if name not in engine:
            raise PresetFileError(f"preset file {path}: missing field 'engine.{name}'")
    for name, value in engine.items():
        _check_type(path, name, value)
    try:
        return EngineConfig(**engine)
    except ValueError as exc:
        field = next((name for name in _FIELDS if str(exc).startswith(f"{name} ")), None)
        where = f"field 'engine.{field}'" if field else "field 'engine'"
        raise PresetFileError(f"preset file {path}: {where}: {exc}") from exc


def _check_type(path: Path, name: str, value: object) -> None:
    """Refuse a value of the wrong JSON type: booleans are not numbers, integers are
    numbers of seconds."""
    default = _FIELDS[name].default
    if isinstance(default, bool):
        ok = isinstance(value, bool)
        kind = "true or false"
    elif isinstance(default, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        kind = "a number"
    elif isinstance(default, str):
        ok = isinstance(value, str)
        kind = "a string"
    else:
        ok = isinstance(value, int) and not isinstance(value, bool)
        kind = "an integer"
    if not ok:
        raise PresetFileError(
            f"preset file {path}: field 'engine.{name}' must be {kind}, got {value!r}"
        )


def preset_document(config: EngineConfig, measured: dict[str, Any]) -> dict[str, Any]:
    """The JSON object a preset file holds for ``config`` and its provenance."""
    engine = {name: getattr(config, name) for name in _FIELDS}
    return {"format": PRESET_FORMAT, "engine": engine, "measured": measured}


def write_preset_file(path: Path, config: EngineConfig, measured: dict[str, Any]) -> None:
    """Write ``config`` and its provenance ``measured`` (JSON-serialisable) to ``path``, so
    that ``load_engine_config(str(path))`` gives ``config`` back."""
    text = json.dumps(preset_document(config, measured), indent=2, ensure_ascii=False)
    path.write_text(text + "\n", encoding="utf-8")
