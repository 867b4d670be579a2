# Everything a fresh machine needs: `make demo` runs the main demo, `make test`
# runs every check and test (Rust and Python). Builds go to a target directory
# and a virtualenv outside the clone, so later runs and fresh clones reuse them.
SHELL := /bin/bash
export CARGO_TARGET_DIR ?= $(HOME)/.cache/datasetrt-target
VENV ?= $(HOME)/.cache/datasetrt-venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.datasetrt-deps
# Everything the tests use is the `dev` extra of pyproject.toml (one list):
# `make test` installs all of it, so a skip for a missing package is a failure.
PY_DEPS := $(shell python3 -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print(" ".join(f"\"{r}\"" for r in ["maturin>=1.7,<2", *p["dependencies"], *p["optional-dependencies"]["dev"]]))')
# The installed-product check: a second virtualenv that holds only the built
# wheel and what the quickstart needs, used from a directory outside the clone.
WHEEL_VENV ?= $(HOME)/.cache/datasetrt-wheel-venv
WHEEL_DIR ?= $(HOME)/.cache/datasetrt-wheels

.PHONY: venv develop release demo test lint style rust-test py-test installed-test sdist-test fuzz bench bench-loop

$(STAMP): Makefile pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(PY_DEPS)
	touch $(STAMP)

venv: $(STAMP)

# The demo's own set-up, and nothing more: maturin, polars and the `demo`
# extra (numpy, scikit-learn), and the one extension the quickstart imports
# (not the companion with SQL on workers), built in the cargo profile `demo`
# (Cargo.toml: the fastest build from nothing) without the feature `ffi`
# (DataFusion interop). `make test` installs the rest and builds the full
# extension in the dev profile (a build of its own).
DEMO_STAMP := $(VENV)/.datasetrt-demo-deps
DEMO_DEPS := $(shell python3 -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print(" ".join(f"\"{r}\"" for r in ["maturin>=1.7,<2", *p["dependencies"], *p["optional-dependencies"]["demo"]]))')

$(DEMO_STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet $(DEMO_DEPS)
	touch $(DEMO_STAMP)

# The extension in the dev profile (what the tests run against), and its
# companion with SQL on workers (python/distributed/: the same crate with the
# feature `distributed`, a module of its own; see python/src/runtime.rs).
develop: $(STAMP)
	VIRTUAL_ENV=$(VENV) $(VENV)/bin/maturin develop --quiet
	cd python/distributed && VIRTUAL_ENV=$(VENV) $(VENV)/bin/maturin develop --quiet

# The optimised extension (what benchmarks run against).
release: $(STAMP)
	VIRTUAL_ENV=$(VENV) $(VENV)/bin/maturin develop --quiet --release

demo: $(DEMO_STAMP)
	VIRTUAL_ENV=$(VENV) $(VENV)/bin/maturin develop --quiet --profile demo --no-default-features
	$(PY) examples/quickstart.py

# Clippy over its own check builds: DataFusion checked twice more (once per
# feature set). `make test` lints in the builds it needs anyway instead
# (LINTED, below), so `lint` is for a lint on its own.
lint: style
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy --workspace --all-targets --features datasetrt-python/distributed -- -D warnings

style: $(STAMP)
	cargo fmt --all --check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The builds the tests run are linted as they compile: clippy-driver as
# cargo's wrapper for the workspace's crates (what `cargo clippy` does over
# a check build), warnings as errors. A fresh machine so compiles DataFusion
# twice (the extension, and the tests with `distributed`: its tokio is
# another build of everything above tokio) instead of four times.
CLIPPY_DRIVER := $(shell command -v clippy-driver 2>/dev/null)
LINTED := rust-test develop installed-test
$(LINTED): export RUSTC_WORKSPACE_WRAPPER := $(CLIPPY_DRIVER)
$(LINTED): export CLIPPY_ARGS := -D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__

rust-test:
	@test -n "$(CLIPPY_DRIVER)" || { echo "clippy-driver not found: rustup component add clippy"; exit 1; }
	cargo test --workspace --all-targets --features datasetrt-python/distributed

# Every optional dependency is installed here: a skip for a missing one fails.
# Then damage, updates, snapshots, draws and resume again over snapshots cut
# into partitions of 7 rows (at the default, 2^22, every test population is
# one partition; the whole suite passes so too, these take ~40 s).
# PYTEST_WORKERS processes run the test files side by side (pytest-xdist, a
# file to a process: its module fixtures are made once): one process leaves
# a second core idle most of the time (686 s on 2 cores, 1.2 cores busy;
# 403 s in two processes, the same tree, 2026-12-07).
PYTEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile
py-test: develop
	DATASETRT_REQUIRE_ALL=1 $(PYTEST)
	DATASETRT_PARTITION_ROWS=7 DATASETRT_REQUIRE_ALL=1 $(PYTEST) -p no:cacheprovider \
		tests/test_damage.py tests/test_update_properties.py tests/test_snapshots.py \
		tests/test_sampling_modes.py tests/test_resume.py

# The readers of stored files under many more mutated inputs than the
# 300 per reader that `make test` runs (engine/tests/it/fuzz.rs), and the
# property tests randomized at ten times the count `make test` runs
# derandomized (failures are saved in tests/hypothesis-examples: commit them).
fuzz: develop
	DATASETRT_FUZZ_ITERS=$${DATASETRT_FUZZ_ITERS:-20000} cargo test --workspace --release --test it fuzz
	DATASETRT_HYPOTHESIS=fuzz $(PY) -m pytest -p no:cacheprovider tests/test_update_properties.py tests/test_tar_properties.py
	DATASETRT_SQL_FUZZ=$${DATASETRT_SQL_FUZZ:-5000} $(PY) -m pytest -p no:cacheprovider -rs tests/test_sql_differential.py

# Build a wheel (dev profile: it reuses the build the tests made), install it
# into its own virtualenv and run tests/installed/check_installed.py from a
# temporary directory: recipes, stubs and the quickstart as users get them.
installed-test: develop
	rm -rf $(WHEEL_DIR)
	VIRTUAL_ENV=$(VENV) $(VENV)/bin/maturin build --quiet --interpreter $(PY) -o $(WHEEL_DIR)
	test -d $(WHEEL_VENV) || (python3 -m venv $(WHEEL_VENV) && $(WHEEL_VENV)/bin/pip install --quiet numpy scikit-learn)
	$(WHEEL_VENV)/bin/pip install --quiet --force-reinstall $(WHEEL_DIR)/datasetrt-*.whl
	tmp=$$(mktemp -d) && cd $$tmp && $(WHEEL_VENV)/bin/python $(CURDIR)/tests/installed/check_installed.py $(CURDIR) && rm -rf $$tmp

# The source distribution builds and installs too (slow: a release build from scratch).
sdist-test: $(STAMP)
	rm -rf $(WHEEL_DIR)/sdist && VIRTUAL_ENV=$(VENV) $(VENV)/bin/maturin sdist -o $(WHEEL_DIR)/sdist
	rm -rf $(WHEEL_VENV)-sdist && python3 -m venv $(WHEEL_VENV)-sdist
	$(WHEEL_VENV)-sdist/bin/pip install --quiet numpy scikit-learn $(WHEEL_DIR)/sdist/datasetrt-*.tar.gz
	tmp=$$(mktemp -d) && cd $$tmp && $(WHEEL_VENV)-sdist/bin/python $(CURDIR)/tests/installed/check_installed.py $(CURDIR) && rm -rf $$tmp

test: style rust-test py-test installed-test

# The S3 server the remote benchmark runs against (s3s-fs: ranges read from the
# file, as S3 serves them; 0.17 needs a newer rustc). Built for benchmarks only:
# `make test` keeps moto, so CI's cold path does not grow.
TOOLS ?= $(HOME)/.cache/datasetrt-tools
S3S_FS := $(TOOLS)/bin/s3s-fs

$(S3S_FS):
	CARGO_TARGET_DIR=$(TOOLS)/target cargo install --root $(TOOLS) --locked s3s-fs@0.14.1 --features binary

bench: release $(S3S_FS)
	$(PY) tests/bench/bench_seed.py
	$(PY) tests/bench/bench_build.py
	$(PY) tests/bench/bench_loader.py
	$(PY) tests/bench/bench_sampling.py
	$(PY) tests/bench/bench_sql.py
	$(PY) tests/bench/bench_remote.py
	DATASETRT_TEST_S3S_FS=$(S3S_FS) $(PY) -m pytest -q tests/test_remote.py -k racing
	$(PY) tests/bench/bench_cold.py
	$(PY) tests/bench/bench_mixture.py
	$(PY) tests/bench/bench_imports.py
	$(PY) tests/bench/bench_typed.py

# Does the hard-example loop pay? Fashion-MNIST with 40 % label noise, 5 seeds
# (tests/bench/bench_loop.py; needs torch and Debian's dataset-fashion-mnist,
# exit 2 without it). Not in `make bench`: it trains for tens of minutes.
bench-loop: release
	$(PY) tests/bench/bench_loop.py
