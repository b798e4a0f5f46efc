# sluicegate — the two commands: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install llama-server system-deps lint typecheck test test-compiled test-ray test-fast demo bench bench-micro clean

ENGINE_STAMP := $(VENV)/.installed-engine

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# llama.cpp for the real-engine tests: compiled from source the first time (~15-20 min on
# 2 cores); pip caches the wheel, so later installs take seconds.
$(ENGINE_STAMP): $(STAMP)
	@echo "installing llama-cpp-python (the first time compiles llama.cpp: ~15-20 minutes)"
	CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(BIN)/python -m pip install --quiet -e '.[dev,engine-tests]'
	touch $(ENGINE_STAMP)

install: $(STAMP)

# llama.cpp's own server (llama-server), a continuous-batching engine for tests/realengine
# (issue #19): built from the pinned llama-cpp-python sdist's vendor/llama.cpp the first time
# (measured: see the README), cached outside the work tree by version; later runs reuse it.
LLAMA_CPP_VERSION := 0.3.36
LLAMA_SERVER_DIR := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/sluicegate/llama-server-$(LLAMA_CPP_VERSION)
LLAMA_SERVER := $(LLAMA_SERVER_DIR)/llama-server
export SLUICEGATE_LLAMA_SERVER := $(LLAMA_SERVER)

$(LLAMA_SERVER): | $(STAMP)
	scripts/build-llama-server.sh $(LLAMA_CPP_VERSION) $(LLAMA_SERVER_DIR) $(BIN)/python

llama-server: $(LLAMA_SERVER)

# Programs the tests run for real, from Debian's packages when missing (CI runs as root, no
# stdin): redis-server (distributed mode; each test starts its own on a free port) and redis-cli
# (the cluster tests create their own Redis Cluster with it), promtool and
# prometheus (the alert rules and a live Prometheus), chromium (the dashboard in a real browser),
# kubectl (rendering the manifests; Debian's kubernetes-client is an old kubectl, so prefer your
# distribution's or the Kubernetes project's). A policy-rc.d that exits 101 keeps the packages
# from starting system services. A no-op when every command is present.
SYSTEM_DEPS := redis-server:redis-server redis-cli:redis-tools promtool:prometheus \
	prometheus:prometheus chromium:chromium kubectl:kubernetes-client cmake:cmake
system-deps:
	@missing=; for pair in $(SYSTEM_DEPS); do \
	  command -v $${pair%%:*} >/dev/null 2>&1 || missing="$$missing $${pair#*:}"; \
	done; \
	[ -z "$$missing" ] && exit 0; \
	missing=$$(printf '%s\n' $$missing | sort -u | tr '\n' ' '); \
	if [ "$$(id -u)" != 0 ]; then \
	  echo "missing Debian packages: $$missing- install them (sudo apt-get install $$missing)," \
	    "or run make as root to have them installed" >&2; exit 1; \
	fi; \
	echo "installing Debian packages: $$missing"; \
	policy=/usr/sbin/policy-rc.d; made=; \
	if [ ! -e $$policy ]; then printf '#!/bin/sh\nexit 101\n' >$$policy && chmod +x $$policy && made=1; fi; \
	export DEBIAN_FRONTEND=noninteractive; \
	apt-get install -y -q --no-install-recommends $$missing </dev/null \
	  || { apt-get update -q </dev/null && apt-get install -y -q --no-install-recommends $$missing </dev/null; }; \
	status=$$?; [ -z "$$made" ] || rm -f $$policy; exit $$status

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks fuzz deploy
	$(BIN)/ruff format --check src tests benchmarks fuzz deploy
	$(BIN)/vulture

typecheck: $(STAMP)
	$(BIN)/mypy

test: system-deps lint typecheck $(ENGINE_STAMP) $(LLAMA_SERVER)
	$(BIN)/pytest --ignore=tests/rayserve
	$(MAKE) test-compiled
	$(MAKE) test-ray

# A real Ray Serve (its own cluster of processes, ~10 s to start, ~20 s in all) between
# the gateway and an emulator; kept out of the main suite's run for its weight.
test-ray: $(STAMP)
	$(BIN)/pytest -q -p no:cacheprovider -m rayserve tests/rayserve

# The wheel, which compiles the core with mypyc by default (setup.py), must pass the same
# core suite. Built with pip's build isolation, as a user's `pip install .` is.
test-compiled: $(STAMP)
	rm -rf build/wheel build/wheel-site && mkdir -p build/wheel
	$(BIN)/python -m pip wheel --quiet --no-deps -w build/wheel .
	$(BIN)/python -m pip install --quiet --no-deps --target build/wheel-site build/wheel/*.whl
	PYTHONPATH=build/wheel-site $(BIN)/python -c "import sluicegate.core.scheduler as s; assert s.__file__.endswith('.so'), s.__file__"
	PYTHONPATH=build/wheel-site $(BIN)/pytest -q -p no:cacheprovider tests/core

# Everything but the real-engine tests; needs no llama.cpp build.
test-fast: system-deps $(STAMP)
	$(BIN)/pytest -x -q -m "not realengine" --ignore=tests/rayserve

demo: $(STAMP)
	$(BIN)/sluicegate demo

# The live benchmarks (issues #6 and #18), quick versions: about 15 minutes.
# `make bench FULL=1` runs the longer versions; `make bench-micro` the core and simulator ones.
BENCH_MODE = $(if $(FULL),--full,)
bench: $(STAMP)
	$(BIN)/python benchmarks/bench_overhead.py $(if $(FULL),,--quick) --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/bench_floor.py $(if $(FULL),,--quick) --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/bench_overload.py $(BENCH_MODE) --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/bench_policies.py $(BENCH_MODE) --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/bench_scale.py $(BENCH_MODE) --write docs/BENCHMARKS.md

bench-micro: $(STAMP)
	$(BIN)/python benchmarks/bench_core.py --write docs/BENCHMARKS.md
	$(BIN)/python benchmarks/bench_sim.py --write docs/BENCHMARKS.md

clean:
	rm -rf $(VENV) build dist .mypy_cache .pytest_cache .ruff_cache .hypothesis demo-out sim-out
