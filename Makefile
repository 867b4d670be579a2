# Everything a fresh machine needs: `make demo` runs the main demo, `make test`
# runs every check and test (Rust and Python). Builds go to a target directory
# and a virtualenv outside the clone, so later runs and fresh clones reuse them.
SHELL := /bin/bash
export CARGO_TARGET_DIR ?= $(HOME)/.cache/datasetrt-target
VENV ?= $(HOME)/.cache/datasetrt-venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.datasetrt-deps
PY_DEPS := "maturin>=1.7,<2" "polars>=1.20" numpy scikit-learn tqdm "pytest>=8" ruff torch pyarrow duckdb "datafusion>=55,<56"

.PHONY: venv develop release demo test lint rust-test py-test bench

$(STAMP): Makefile
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(PY_DEPS)
	touch $(STAMP)

venv: $(STAMP)

# The extension in the dev profile (what the tests run against).
develop: $(STAMP)
	VIRTUAL_ENV=$(VENV) $(VENV)/bin/maturin develop --quiet

# The optimised extension (what benchmarks run against).
release: $(STAMP)
	VIRTUAL_ENV=$(VENV) $(VENV)/bin/maturin develop --quiet --release

demo: develop
	$(PY) examples/quickstart.py

lint: $(STAMP)
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

rust-test:
	cargo test --workspace

py-test: develop
	$(PY) -m pytest

test: lint rust-test py-test

bench: release
	$(PY) tests/bench/bench_seed.py
	$(PY) tests/bench/bench_loader.py
	$(PY) tests/bench/bench_sampling.py
	$(PY) tests/bench/bench_sql.py
