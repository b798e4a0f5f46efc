"""``sluicegate calibrate``: measure a running engine and write its engine preset as a file.

Modules, each one job: ``preset_file`` (presets as JSON files, and ``load_engine_config``,
which every place that names a preset resolves it through), ``engine_client`` (one timed,
streamed completion), ``engine_facts`` (which engine it is and what it publishes of its
capacity), ``probe_plan`` (what to measure and the engine model's features for it),
``probes`` (running the plan), ``fit`` (non-negative least squares on relative error),
``calibration`` (one run, end to end) and ``calibrate_command`` (the CLI).

Imports ``engine`` and ``errors`` only; the emulator, the configuration and the simulator
import ``preset_file`` from here.
"""

from sluicegate.calibrate.preset_file import (
    PRESET_FORMAT,
    PresetFileError,
    load_engine_config,
    write_preset_file,
)

__all__ = ["PRESET_FORMAT", "PresetFileError", "load_engine_config", "write_preset_file"]
