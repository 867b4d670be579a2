"""Shared fixtures: tiny caches built in temporary directories."""

from __future__ import annotations

import hashlib
import os
import pickle
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import datasetrt as drt

# Child processes (DataLoader workers, scripts the tests start) dump their
# Python stacks if they crash (SIGSEGV, SIGABRT...), so a crash in a worker
# shows where it happened instead of only "killed by signal".
os.environ.setdefault("PYTHONFAULTHANDLER", "1")

# Property tests: `make test` runs them derandomized (the same examples every
# run, plus every failure ever found, pinned with @example), so CI never
# passes or fails by chance; `make fuzz` runs them randomized at ten times
# the count and keeps what fails in tests/hypothesis-examples, to replay there
# and to pin as an @example with the fix.
HYPOTHESIS_PROFILE = os.environ.get("DATASETRT_HYPOTHESIS", "ci")
HYPOTHESIS_SCALE = 10 if HYPOTHESIS_PROFILE == "fuzz" else 1
try:
    from hypothesis import settings
    from hypothesis.database import DirectoryBasedExampleDatabase

    settings.register_profile("ci", derandomize=True, database=None, deadline=None)
    settings.register_profile(
        "fuzz",
        derandomize=False,
        database=DirectoryBasedExampleDatabase(Path(__file__).parent / "hypothesis-examples"),
        deadline=None,
    )
    settings.load_profile(HYPOTHESIS_PROFILE)
except ImportError:  # the property tests skip themselves (never inside `make test`)
    pass


class Source:
    """A source of `n` samples: payload and metadata are functions of the index."""

    def __init__(
        self,
        name: str,
        n: int,
        payload: Callable[[int], bytes] | None = None,
        meta: Callable[[int], dict[str, Any]] | None = None,
    ):
        self.name = name
        self.n = n
        self.payload = payload or (lambda i: pickle.dumps({"i": i, "name": name}))
        self.meta = meta or (
            lambda i: {
                "label": i % 10,
                "split": "train" if i % 5 else "val",
                "quality": (i * 37 % 100) / 100.0,
            }
        )
        self.iterations = 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[drt.CacheInput]:
        self.iterations += 1
        for i in range(self.n):
            yield drt.CacheInput(self.payload(i), self.meta(i))


def payload_digest(root: Path) -> dict[str, str]:
    """SHA-256 of every cache file (not snapshots) under `root`."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and "_snapshots" not in p.parts:
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def run_child(script: str, *args: object, env: dict[str, str] | None = None) -> str:
    """Run `script` in a fresh interpreter (with `env`, default this
    process's) and return its stdout. Tests of threads sharing one object
    run there, so a deadlock fails the test (after a timeout) instead of
    hanging the suite."""
    done = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def pytest_sessionstart(session: pytest.Session) -> None:
    """The suite needs Ctrl-C to raise KeyboardInterrupt (the cancellation
    tests send SIGINT). A shell that starts a job in the background starts it
    with SIGINT ignored, and Python then installs no handler: install
    Python's own here, so the suite passes however it is started."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


# `make test` installs every optional dependency and runs as root in CI, so
# there a skip for a missing package, or a full-disk test that could not
# mount its tmpfs as root, hides a broken set-up: it fails instead.
REQUIRE_ALL = os.environ.get("DATASETRT_REQUIRE_ALL") == "1"


def _fail_a_required_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    if not (REQUIRE_ALL and report.skipped) or hasattr(report, "wasxfail"):
        return
    reason = str(report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr)
    missing = "could not import" in reason
    no_disk = "tmpfs" in reason and hasattr(os, "geteuid") and os.geteuid() == 0
    if missing or no_disk:
        report.outcome = "failed"
        report.longrepr = f"skipped inside make test, where this must run: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    _fail_a_required_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield  # a module-level importorskip skips the whole module here
    _fail_a_required_skip(outcome.get_result())


@pytest.fixture(autouse=True)
def sigint_handler_is_restored():
    """A test that leaves Ctrl-C ignored (SIG_IGN/SIG_DFL) would make a later
    interrupt a no-op (and the Ctrl-C test run its query for minutes): put the
    handler the session installed back and fail the test that changed it."""
    yield
    handler = signal.getsignal(signal.SIGINT)
    if handler is not signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        pytest.fail(f"the test left SIGINT handled by {handler!r}")


@pytest.fixture
def source() -> type[Source]:
    return Source


@pytest.fixture
def two_caches(tmp_path: Path) -> tuple[drt.Dataset, Path, list[Source]]:
    """A dataset of two caches (500 + 300 samples) under one root."""
    sources = [Source("alpha-v1", 500), Source("beta-v1", 300)]
    ds = drt.build(tmp_path, sources, progress=False)
    return ds, tmp_path, sources


class _S3sFs:
    """An s3s-fs server (an S3 server over the file system) on a free port of
    127.0.0.1, serving a temporary directory."""

    def __init__(self, binary: str, root: Path):
        import socket
        import time

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.proc = subprocess.Popen(
            [
                binary,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--access-key",
                "testing",
                "--secret-key",
                "testing",
                str(root),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"s3s-fs did not start on port {self.port}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


#: The three groups of the `mixed` population, by sample_id.
MIXED_GROUPS = {"web": range(0, 60), "code": range(60, 90), "books": range(90, 100)}


def source_of(sample_id: int) -> str:
    """The group of sample `sample_id` in the `mixed` population."""
    return next(g for g, ids in MIXED_GROUPS.items() if sample_id in ids)


@pytest.fixture
def mixed(tmp_path: Path) -> drt.Dataset:
    """100 rows in three groups by `source`: web 60, code 30, books 10;
    weight 0 for every seventh row, 1-3 for the others."""
    ds = drt.build(tmp_path, [Source("mix-v1", 100, payload=lambda i: b"%d" % i)], progress=False)
    ds.update_metadata(
        ds.get_metadata().with_columns(
            pl.col("sample_id").map_elements(source_of, return_dtype=pl.String).alias("source"),
            pl.when(pl.col("sample_id") % 7 == 0)
            .then(0.0)
            .otherwise(1.0 + pl.col("sample_id") % 3)
            .alias("weight"),
        )
    )
    return ds


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """An S3 server on 127.0.0.1 (a free port), stopped after the session:
    (server, storage_options, boto3 client). moto's, or the s3s-fs binary
    that $DATASETRT_TEST_S3S_FS names (`make bench` runs the racing-machines
    test so)."""
    boto3 = pytest.importorskip("boto3")
    binary = os.environ.get("DATASETRT_TEST_S3S_FS")
    if binary:
        server = _S3sFs(binary, tmp_path_factory.mktemp("s3s-fs"))
        endpoint = f"http://127.0.0.1:{server.port}"
    else:
        moto_server = pytest.importorskip("moto.server")
        server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
    options = {
        "aws_endpoint": endpoint,
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
        "aws_region": "us-east-1",
        "aws_allow_http": "true",
    }
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    yield server, options, client
    server.stop()


@pytest.fixture
def bucket(s3):
    """A fresh bucket: (url of a dataset prefix in it, storage options, boto3 client, name)."""
    _, options, client = s3
    name = f"b-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name)
    return f"s3://{name}/datasets/demo", options, client, name
