"""Names that frameworks or serialisation use and vulture cannot see (`make lint`)."""

# ruff: noqa
_ = object()

# Fields of result records read through dataclasses.asdict / JSON, not by name.
_.error_counts  # bench/analysis.py: per-code error counts in the bench summary JSON
_.launch_lag_p50_s  # bench/loadgen.py: the generator's own lag, in its summary JSON
_.max_running_seen  # emulator/runner.py: served by the emulator's /stats endpoint
_.finished_total  # emulator/runner.py: served by the emulator's /stats endpoint
_.prefix_cache_query_tokens  # emulator/runner.py: served by the emulator's /stats endpoint
_.prefix_cache_hit_tokens  # emulator/runner.py: served by the emulator's /stats endpoint
_.prefix_cache_hit_rate  # emulator/runner.py: served by the emulator's /stats endpoint
_.plot_paths  # sim/comparison.py: what a simulation wrote, for callers of run_simulation

# Framework hooks.
_.media_type  # starlette Response subclasses
_.should_exit  # uvicorn.Server, set to stop a test server
_.teardown  # hypothesis RuleBasedStateMachine
pytestmark  # pytest module marks
run_once  # benchmarks/bench_core.py: called by name in a subprocess
_.row_factory  # sqlite3.Connection: rows readable by column name
