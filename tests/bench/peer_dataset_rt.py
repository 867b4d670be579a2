"""Peer benchmark: read throughput of the PyPI package `dataset-rt` (import `dataset_rt`).

Measures the peer on our published comparison workload, in its own process:

- 8,192 records in two caches (two sources of 4,096 records each), every payload
  exactly 16,384 bytes from `random.Random(seed).randbytes` with a distinct seed
  per record and source, metadata `{"label": i % 10}`;
- read path "native iterator": `for sample in dataset`, the plain iteration the
  peer's README recommends, one pass of 8,192 samples, each payload hashed once
  with `hashlib.blake2b(data).digest()`;
- startup: wall time from creating the peer's runtime and opening the dataset
  (`DatasetRuntime` + `cached_dataset`) through creating the iterator to the
  first delivered sample;
- one warm-up pass (warms the page cache), then `--trials` (default 5) timed
  passes; steady-state samples/s of a pass excludes its first sample (the
  iterator has no batches), the reported figure is the median over the trials,
  and MiB/s = samples/s * 16384 / 2**20;
- peak RSS of the whole process (`ru_maxrss`, KiB), read at the end;
- the peer's torch DataLoader integration is skipped (torch is not installed).

The peer's iterator samples with replacement by default (`ReaderConfig(shuffle=True)`,
weighted multinomial draws, like our own `Dataset.iter`). Each iterator emits
exactly `len(dataset)` draws, which is the active row count, 8,192. Pass `--ordered`
to measure `shuffle=False` instead (each row exactly once per pass, in table order).

Set-up and run, from the repository root (never install torch into this venv):

    python3 -m venv $HOME/.cache/datasetrt-peer-venv
    $HOME/.cache/datasetrt-peer-venv/bin/pip install dataset-rt==0.4.8 polars numpy
    $HOME/.cache/datasetrt-peer-venv/bin/python tests/bench/peer_dataset_rt.py

Human-readable lines come first; the last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import dataset_rt as drt

SOURCES = 2
RECORDS_PER_SOURCE = 4096
SAMPLES = SOURCES * RECORDS_PER_SOURCE
PAYLOAD_BYTES = 16384


def payload(source: int, i: int) -> bytes:
    """Deterministic pseudo-random payload of record `i` of source `source`."""
    return random.Random(source * 1_000_000 + i).randbytes(PAYLOAD_BYTES)


class Source:
    """One peer `CacheSource`: 4,096 records of 16 KiB with a `label` column."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.name = f"bench-src{index}"

    def __iter__(self) -> Iterator[drt.CacheInput]:
        """Yield the source's records in order, generating each payload on the fly."""
        for i in range(RECORDS_PER_SOURCE):
            yield drt.CacheInput(data=payload(self.index, i), metadata={"label": i % 10})


def build(root: Path, native_workers: int) -> list[Path]:
    """Write both caches under `root` with the peer's serial native writer."""
    runtime = drt.DatasetRuntime(num_workers=native_workers)
    results = runtime.write_cache(
        [Source(k) for k in range(SOURCES)],
        root,
        writer_config=drt.WriterConfig(show_progress=False),
    )
    paths = []
    for result in results:
        match result:
            case drt.CacheWriteSuccess(path=path):
                paths.append(path)
            case drt.CacheWriteError(source_name=name, message=message):
                raise RuntimeError(f"peer failed to write {name}: {message}")
    return paths


def run_pass(iterator: Iterator[drt.CachedSample], digests: list[bytes]) -> tuple[int, float]:
    """Consume one pass, hashing every payload; return (samples, steady-state seconds).

    The clock starts once the first sample has been delivered and hashed, so the
    steady-state rate is (samples - 1) / seconds.
    """
    first = next(iterator)
    digests.append(hashlib.blake2b(first.data).digest())
    t0 = time.perf_counter()
    n = 1
    for sample in iterator:
        digests.append(hashlib.blake2b(sample.data).digest())
        n += 1
    return n, time.perf_counter() - t0


def check(digests: list[bytes], expected: set[bytes], ordered: bool) -> int:
    """Verify a pass delivered intact payloads; return the number of distinct records."""
    if len(digests) != SAMPLES:
        raise AssertionError(f"pass delivered {len(digests)} samples, expected {SAMPLES}")
    unique = set(digests)
    if not unique <= expected:
        raise AssertionError(f"{len(unique - expected)} delivered payloads match no record")
    if ordered and len(unique) != SAMPLES:
        raise AssertionError(f"ordered pass covered {len(unique)} records, expected {SAMPLES}")
    return len(unique)


def main() -> None:
    """Build the caches, run the warm-up and timed passes, print the results."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", type=Path, help="directory for the caches (default: fresh temp)")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument(
        "--native-workers",
        type=int,
        default=4,
        help="peer Rust reader/writer threads, DatasetRuntime(num_workers=...); README uses 4",
    )
    parser.add_argument("--prefetch-size", type=int, default=64, help="ReaderConfig.prefetch_size")
    parser.add_argument("--seed", type=int, default=42, help="ReaderConfig.seed")
    parser.add_argument(
        "--ordered", action="store_true", help="ReaderConfig(shuffle=False): ordered passes"
    )
    args = parser.parse_args()

    owned = args.root is None
    root: Path = Path(tempfile.mkdtemp(prefix="drt-peer-")) if owned else args.root
    root.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        paths = build(root, args.native_workers)
        build_s = time.perf_counter() - t0
        expected = {
            hashlib.blake2b(payload(k, i)).digest()
            for k in range(SOURCES)
            for i in range(RECORDS_PER_SOURCE)
        }

        config = drt.ReaderConfig(
            seed=args.seed, prefetch_size=args.prefetch_size, shuffle=not args.ordered
        )
        t0 = time.perf_counter()
        runtime = drt.DatasetRuntime(num_workers=args.native_workers)
        dataset = runtime.cached_dataset(paths, reader_config=config)
        t_open = time.perf_counter()
        iterator = iter(dataset)
        first = next(iterator)
        t_first = time.perf_counter()
        startup_s = t_first - t0
        if len(dataset) != SAMPLES:
            raise AssertionError(f"len(dataset) = {len(dataset)}, expected {SAMPLES}")

        # Warm-up: finish the pass whose first sample timed startup.
        digests = [hashlib.blake2b(first.data).digest()]
        run_pass(iterator, digests)
        unique = [check(digests, expected, args.ordered)]

        trials: list[float] = []
        for _ in range(args.trials):
            digests = []
            n, seconds = run_pass(iter(dataset), digests)
            unique.append(check(digests, expected, args.ordered))
            trials.append((n - 1) / seconds)
        samples_per_s = statistics.median(trials)
        peak_rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    finally:
        if owned:
            shutil.rmtree(root, ignore_errors=True)

    mode = "ordered (shuffle=False)" if args.ordered else "weighted with replacement (shuffle=True)"
    print(
        f"dataset-rt {version('dataset-rt')}, {os.cpu_count()} CPUs, "
        f"DatasetRuntime(num_workers={args.native_workers}), prefetch_size={args.prefetch_size}"
    )
    print(f"mode: {mode}; distinct records per pass: {unique}")
    print(f"build {SAMPLES} x {PAYLOAD_BYTES} B: {build_s:.3f} s")
    print(
        f"startup {startup_s * 1e3:.1f} ms (open {(t_open - t0) * 1e3:.1f} ms, "
        f"iterator to first sample {(t_first - t_open) * 1e3:.1f} ms)"
    )
    print("trials samples/s: " + ", ".join(f"{t:,.0f}" for t in trials))
    print(
        f"median {samples_per_s:,.0f} samples/s = "
        f"{samples_per_s * PAYLOAD_BYTES / 2**20:,.1f} MiB/s; peak RSS {peak_rss_kib} KiB"
    )
    print(
        json.dumps(
            {
                "package": "dataset-rt",
                "version": version("dataset-rt"),
                "samples": SAMPLES,
                "payload_bytes": PAYLOAD_BYTES,
                "startup_s": startup_s,
                "samples_per_s": samples_per_s,
                "mib_per_s": samples_per_s * PAYLOAD_BYTES / 2**20,
                "trials": trials,
                "peak_rss_kib": peak_rss_kib,
                "torch": "skipped: torch not installed",
            }
        )
    )


if __name__ == "__main__":
    main()
