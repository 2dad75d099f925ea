# fx_assets — one entry point for set-up, demo, tests, UI and benchmarks.
# `make demo` and `make test` do all the set-up on a fresh machine (a .venv inside the project).

SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Dagster reads ./dagster.yaml from DAGSTER_HOME: keep the instance inside the project so the
# demo's runs show up in `make ui`.
export DAGSTER_HOME := $(CURDIR)
# Demo market: small enough to finish in a few minutes on 2 cores. The quarter dimension has no
# fixed end (it grows with the raw data); the demo itself synthesises and builds 2024-Q1..Q4.
DEMO_ENV := FX_DATA_ROOT=$(CURDIR)/data FX_SYMBOLS=ES.FUT FX_FIRST_QUARTER=2024-Q1

.PHONY: install instance demo test test-slow test-all test-e2e ui bench bench-quick bench-report bench-setup lint typecheck validate clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# Machines without CUDA get the CPU build of torch (it lies on disk here); with CUDA, pip's default.
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(PIP) install -q torch==2.13.0; fi
	$(PIP) install -q -e '.[dev]'
	# LightGBM's wheel links the system OpenMP runtime (libgomp1 on Debian).
	ldconfig -p | grep -q 'libgomp.so.1 ' || { apt-get update -qq && apt-get install -y -qq libgomp1; }
	touch $@

# Dagster's SQLite storage migrates itself on first use, and two first users at once break it
# for good: initialise the instance once, before anything runs in parallel.
instance: install
	$(PY) -c 'import dagster as dg; dg.DagsterInstance.get().dispose()'

demo: install instance
	$(DEMO_ENV) FX_LAST_QUARTER=2024-Q4 $(VENV)/bin/fx-assets demo

test: install instance
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=15

# Tests marked slow (end-to-end honesty on a larger synthetic market).
test-slow: install
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=15 -m "slow and not gpu and not postgres and not browser"

# Through a running Dagster: dagster dev (webserver + daemon) on 127.0.0.1, driven by GraphQL.
test-e2e: install
	$(PY) -m pytest -q -p no:xdist --durations=15 -m "e2e and not browser and not postgres" fx_assets_tests/e2e

# Everything that runs on a CPU machine.
test-all: install
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not gpu and not postgres and not browser"

ui: install instance
	$(DEMO_ENV) $(VENV)/bin/dagster dev -w workspace.yaml

validate: install
	$(DEMO_ENV) $(VENV)/bin/dagster definitions validate -w workspace.yaml

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy

# Benchmarks: results in benchmarks/results/*.json, then the tables and plots of
# benchmarks/README.md (and the main README's excerpt) regenerated from them. The peers of
# bench_peers get their own venvs (benchmarks/.venvs/, created by the benchmark from PyPI).
bench-setup: $(VENV)/.bench-installed

$(VENV)/.bench-installed: $(VENV)/.installed pyproject.toml benchmarks/bench_peers.py
	$(PIP) install -q -e '.[dev,bench]'
	$(PY) -m benchmarks.bench_peers --setup
	touch $@

bench: install bench-setup
	$(PY) -m benchmarks.run_all
	$(PY) -m benchmarks.report

# The modules with a quick mode, on a small market generated once (< 3 minutes).
bench-quick: install bench-setup
	$(PY) -m benchmarks.run_all --quick
	$(PY) -m benchmarks.report

bench-report:
	$(PY) -m benchmarks.report

clean:
	rm -rf data .dagster_home benchmarks/data
