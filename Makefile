# sluicegate — the two commands: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install lint typecheck test test-compiled test-fast demo bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/pytest
	$(MAKE) test-compiled

# The mypyc build of the core (setup.py) must pass the same core suite.
test-compiled: $(STAMP)
	rm -rf build/mypyc && mkdir -p build/mypyc
	cp -r src setup.py pyproject.toml build/mypyc/
	cd build/mypyc && SLUICEGATE_COMPILE=1 ../../$(BIN)/python setup.py -q build_ext --inplace >/dev/null
	PYTHONPATH=build/mypyc/src $(BIN)/python -c "import sluicegate.core.scheduler as s; assert s.__file__.endswith('.so'), s.__file__"
	PYTHONPATH=build/mypyc/src $(BIN)/pytest -q -p no:cacheprovider tests/core

test-fast: $(STAMP)
	$(BIN)/pytest -x -q

demo: $(STAMP)
	$(BIN)/sluicegate demo

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_core.py --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/bench_sim.py --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/bench_overhead.py --quick --write docs/BENCHMARKS.md

clean:
	rm -rf $(VENV) build dist .mypy_cache .pytest_cache .ruff_cache .hypothesis demo-out sim-out
