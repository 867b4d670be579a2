"""Imports at disk speed: ``drt.build`` over ``drt.sources.Parquet`` against
reading the same files alone (polars, the same batches), in the same run,
alternating, on about 1 GiB of payloads.

Run by hand: ``python tests/bench/bench_imports.py`` (``make bench`` runs it).
The target (issue 38): the build's throughput at least 0.8x that of reading
the source alone. Payloads are incompressible by default, as JPEG or
preprocessed tensors are, and written with ``codec="none"`` unless
``--codec`` says otherwise: the ratio then measures what the import adds to
the read (the records' copy, checksums, the shard writes, the metadata), not
zstd's speed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import polars as pl

import datasetrt as drt


def make_files(directory: Path, total_bytes: int, record_bytes: int, files: int) -> int:
    """``files`` Parquet files of random payloads; returns the record count."""
    per_file = max(1, total_bytes // record_bytes // files)
    for k in range(files):
        data = [os.urandom(record_bytes) for _ in range(per_file)]
        frame = pl.DataFrame(
            {
                "data": pl.Series(data, dtype=pl.Binary),
                "label": [i % 10 for i in range(per_file)],
                "caption": [f"file {k} record {i}" for i in range(per_file)],
            }
        )
        frame.write_parquet(directory / f"part-{k:03d}.parquet", compression="uncompressed")
    return per_file * files


def read_alone(pattern: str, batch_rows: int) -> float:
    """Read every batch's payload and metadata, as the import does, and drop it."""
    t = time.perf_counter()
    rows = 0
    for batch in pl.scan_parquet(pattern).collect_batches(chunk_size=batch_rows):
        rows += batch.height
        batch["data"].bin.size().sum()  # touch the payloads
    return time.perf_counter() - t


def build(pattern: str, root: Path, name: str, codec: str, batch_rows: int) -> float:
    src = drt.sources.Parquet(pattern, name=name, batch_rows=batch_rows)
    t = time.perf_counter()
    drt.build(root, [src], codec=codec, progress=False)
    elapsed = time.perf_counter() - t
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--record-kib", type=int, default=64)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--batch-rows", type=int, default=4096)
    p.add_argument("--codec", default="none")
    p.add_argument("--trials", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="drt-imports-") as tmp:
        tmp = Path(tmp)
        (tmp / "src").mkdir()
        n = make_files(tmp / "src", int(args.gib * (1 << 30)), args.record_kib << 10, args.files)
        pattern = os.fspath(tmp / "src" / "*.parquet")
        size = sum(f.stat().st_size for f in (tmp / "src").iterdir())
        print(
            f"{args.files} Parquet files, {n} records of {args.record_kib} KiB, "
            f"{size / (1 << 30):.2f} GiB, codec={args.codec}"
        )
        reads, builds = [], []
        for trial in range(args.trials):
            reads.append(read_alone(pattern, args.batch_rows))
            builds.append(
                build(pattern, tmp / f"cache-{trial}", "pq-v1", args.codec, args.batch_rows)
            )
        for what, times in (("read alone", reads), ("build", builds)):
            print(
                f"{what:>10}: median {statistics.median(times):.2f} s "
                f"({size / statistics.median(times) / (1 << 20):.0f} MiB/s), "
                f"trials {', '.join(f'{t:.2f}' for t in times)}"
            )
        ratios = [r / b for r, b in zip(reads, builds, strict=True)]
        print(
            f"build throughput / read throughput: median {statistics.median(ratios):.2f}x "
            f"(trials {min(ratios):.2f}-{max(ratios):.2f}x; target >= 0.8x)"
        )


if __name__ == "__main__":
    main()
