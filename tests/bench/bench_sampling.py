"""Sampling benchmark: alias-table build and weighted draws/s against numpy.

Run by hand against the release extension (`make bench`). For 1M and 100M
weights it measures, in the same run:

- our alias build (first use of a snapshot's weights: built, stored, mapped);
- our weighted draws/s with replacement (`Dataset.draws`, no payload read),
  and the other modes' draws/s;
- numpy's `Generator.choice(n, size, p=...)` draws/s on the same weights;
- end to end, our alias build plus the draws against numpy's choice for the
  same count (what a first epoch costs either way).

Targets (issue 4): >= 10x numpy's draws/s at 100M rows; alias build <= 2 s at
100M rows.
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

import datasetrt as drt


class Tiny:
    name = "sampling-bench"

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        for i in range(self.n):
            yield i.to_bytes(4, "little"), {}


def verdict(applies: bool, met: bool, target: str) -> str:
    if not applies:
        return ""
    return f"   target {target}: {'met' if met else 'MISSED'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 100_000_000])
    parser.add_argument("--draws", type=int, default=10_000_000)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="drt-bench-sampling-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # caches can be GBs

    ds = drt.build(tmp, [Tiny(1_000_000)], progress=False)
    base = ds.get_metadata().select("cache_id", "sample_id")
    rng = np.random.default_rng(0)
    for rows in args.rows:
        reps = -(-rows // base.height)
        weights = rng.random(rows) + 0.01
        frame = pl.concat([base] * reps).head(rows).with_columns(pl.Series("weight", weights))
        t0 = time.perf_counter()
        ds.update_metadata(frame)
        publish = time.perf_counter() - t0
        del frame

        # floor for the build: allocating and touching as many bytes as the
        # table has (12 per row) on this machine, right now
        t0 = time.perf_counter()
        scratch = np.ones(rows * 12 // 8)
        touch = time.perf_counter() - t0
        del scratch

        # builds, stores and maps the alias table of every partition (64 draws
        # per partition or more make them all before drawing; one draw would
        # make one, and leave the others to the timed draws below)
        history = ds.history()
        partitions = history.filter(pl.col("version") == ds.version)["partitions"][0]
        t0 = time.perf_counter()
        ds.draws(1, count=64 * partitions)
        build = time.perf_counter() - t0
        t0 = time.perf_counter()
        drt.open(tmp).draws(1, count=1)  # a new reader maps the stored table
        remap = time.perf_counter() - t0

        t0 = time.perf_counter()
        ours = ds.draws(2, count=args.draws)
        ours_rate = args.draws / (time.perf_counter() - t0)

        p = weights / weights.sum()
        t0 = time.perf_counter()
        theirs = np.random.default_rng(1).choice(rows, size=args.draws, p=p)
        numpy_rate = args.draws / (time.perf_counter() - t0)
        assert ours.len() == len(theirs) == args.draws

        print(f"\n-- {rows:,} weights (snapshot published in {publish:.2f}s) --")
        big = rows >= 100_000_000
        print(
            f"alias build + store + map  {build:8.3f} s   "
            f"(a new reader opens it: {remap * 1e3:.1f} ms){verdict(big, build <= 2, '<= 2 s')}"
        )
        print(f"  floor: touching {rows * 12 / 2**20:,.0f} MiB of fresh memory takes {touch:.3f} s")
        print(f"weighted draws, ours       {ours_rate:14,.0f}/s (on the engine's threads)")
        ratio = ours_rate / numpy_rate
        print(
            f"numpy choice(p=)           {numpy_rate:14,.0f}/s   ours/numpy {ratio:6.1f}x"
            f"{verdict(big, ratio >= 10, '>= 10x')}"
        )
        # what a user pays for a first epoch: our build plus the draws against
        # numpy's choice(p=), which does its own setup (a cumulative sum) per call
        ours_total = build + args.draws / ours_rate
        numpy_total = args.draws / numpy_rate
        print(
            f"build + {args.draws:,} draws: ours {ours_total:.3f} s, numpy {numpy_total:.3f} s "
            f"({numpy_total / ours_total:.1f}x faster end to end)"
        )
        for mode in ("permutation", "balanced", "weighted_without_replacement"):
            count = min(args.draws, rows)
            t0 = time.perf_counter()
            ds.draws(3, count=count, sampling=mode)
            rate = count / (time.perf_counter() - t0)
            print(f"{mode:<26} {rate:14,.0f}/s (incl. per-epoch setup)")


if __name__ == "__main__":
    main()
