"""Seed-workflow benchmark: build, get_metadata, update_metadata and SQL group-by.

Run by hand against the release extension (`make bench`). Every figure is
printed beside a baseline measured in the same run on the same data, so the
ratios mean something on a noisy machine:

- build of N x 16-byte records vs. the floor: the same Python source loop that
  only collects the bytes and metadata and writes the bytes to one file;
- get_metadata vs. polars reading the same snapshot file memory-mapped;
- update_metadata (reweight) vs. polars writing the same frame as Arrow IPC;
- SQL group-by vs. the same group-by in polars.

Targets (issue 2): 10M rows get_metadata <= 50 ms, update_metadata <= 500 ms,
SQL group-by <= 200 ms; build of 1M x 16-byte records <= 2 s.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import polars as pl

import datasetrt as drt

SPLITS = ("train", "train", "train", "train", "val")


class Tiny:
    """N records of 16 bytes with three metadata keys."""

    def __init__(self, n: int):
        self.name = f"tiny-{n}"
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        for i in range(self.n):
            yield (
                i.to_bytes(16, "little"),
                {"label": i % 10, "split": SPLITS[i % 5], "quality": (i % 100) / 100.0},
            )


def timed(fn: Callable[[], object], repeat: int = 5) -> float:
    """Median wall time in seconds over `repeat` runs."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def floor_build(n: int, path: Path) -> None:
    datas, labels, splits, qualities = [], [], [], []
    for data, meta in Tiny(n):
        datas.append(data)
        labels.append(meta["label"])
        splits.append(meta["split"])
        qualities.append(meta["quality"])
    path.write_bytes(b"".join(datas))


def child_seconds(code: str) -> float:
    """Seconds a fresh interpreter spends in ``code`` after ``t=T()`` (imports
    excluded)."""
    script = f"import time; T=time.perf_counter\n{code}\nprint(T()-t)"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return float(out.stdout.split()[-1])


def row(what: str, ours: float, base: float, baseline: str, target: float | None = None) -> None:
    verdict = ""
    if target is not None:
        verdict = f"  target <= {target * 1e3:.0f} ms: {'met' if ours <= target else 'MISSED'}"
    print(
        f"{what:<34} {ours * 1e3:9.3f} ms   {baseline:<30} {base * 1e3:9.3f} ms   "
        f"ratio {ours / base:6.3f}x{verdict}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--build-records", type=int, default=1_000_000)
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="drt-bench-") as tmp:
        root = Path(tmp)
        n = args.build_records
        base = timed(lambda: floor_build(n, root / "floor.bin"), 1)
        t0 = time.perf_counter()
        ds = drt.build(root / "cache", [Tiny(n)], progress=False)
        ours = time.perf_counter() - t0
        print(
            f"python {sys.version.split()[0]}, polars {pl.__version__}, datasetrt "
            f"{drt.__version__}\n"
        )
        row(
            f"build {n:,} x 16 B",
            ours,
            base,
            "python loop + one file write",
            2.0 if n == 1_000_000 else None,
        )

        full = ds.get_metadata()
        for rows in args.rows:
            reps = -(-rows // full.height)
            frame = pl.concat([full] * reps).head(rows)
            ds.update_metadata(frame)
            print(f"\n-- {rows:,} metadata rows (snapshot {ds.version}) --")
            target = rows == 10_000_000

            meta = pl.DataFrame(ds._native.get_metadata())
            ours = timed(lambda: pl.DataFrame(ds._native.get_metadata()), args.repeat)
            path = root / "meta.arrow"
            meta.write_ipc(path)
            base = timed(lambda p=path: pl.read_ipc(p), args.repeat)
            row("get_metadata", ours, base, "polars read_ipc (same rows)", 0.05 if target else None)

            # open in a fresh process: maps the snapshot and checks every
            # column file's checksum once (later opens in the process skip it)
            ours = statistics.median(
                child_seconds(f"import datasetrt as d; t=T(); d.open({str(root / 'cache')!r})")
                for _ in range(args.repeat)
            )
            base = statistics.median(
                child_seconds(f"import polars as pl; t=T(); pl.read_ipc({str(path)!r})")
                for _ in range(args.repeat)
            )
            row("open (fresh process)", ours, base, "polars read_ipc in a fresh process")

            # a distinct reweight per repetition: identical columns would be deduplicated
            reps_update = max(3, args.repeat // 2)
            frames = [
                meta.with_columns((float(k + 1) / pl.len().over("label")).alias("weight"))
                for k in range(reps_update)
            ]
            pending = iter(frames)
            ours = timed(lambda p=pending: ds.update_metadata(next(p)), reps_update)
            out = root / "baseline.arrow"
            base = timed(lambda f=frames[0], o=out: f.write_ipc(o), reps_update)
            row(
                "update_metadata (reweight)",
                ours,
                base,
                "polars write_ipc",
                0.5 if target else None,
            )

            query = (
                "SELECT label, count(*) AS n, sum(weight) AS w FROM metadata "
                "GROUP BY label ORDER BY label"
            )
            ours = timed(lambda q=query: ds.sql(q), args.repeat)
            cur = ds.get_metadata()
            base = timed(
                lambda m=cur: (
                    m.group_by("label")
                    .agg(pl.len().alias("n"), pl.col("weight").sum().alias("w"))
                    .sort("label")
                ),
                args.repeat,
            )
            row("SQL group-by", ours, base, "polars group_by", 0.2 if target else None)


if __name__ == "__main__":
    main()
