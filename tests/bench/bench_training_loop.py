"""The training loop at scale: a reweight committed between epochs reaches a
DataLoader with persistent workers that follows the head.

A population of ``--rows`` rows (default 10^7; rows repeat the samples of
one small cache, as a population that duplicates samples does) is read by
``DataLoader(tds, num_workers=2, persistent_workers=True)`` with
``follow="head"``. Between epochs the script commits a reweight (a new
``weight`` column) and times, in alternating trials:

- **follow**: from ``update_metadata`` returning to the first batch of the
  next epoch through the same DataLoader (``set_epoch`` picks up the head;
  the main process builds the new alias table once, the workers map it);
- **restart** (the baseline, what users had to do before): from the commit
  to the first batch of a new ``TorchDataset`` + ``DataLoader`` + workers.

It also counts the alias tables built per reweight (one per host, not one
per worker) from the files in the snapshot's column directory.

Run by hand against the release build: ``make release`` then
``python tests/bench/bench_training_loop.py``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
from torch.utils.data import DataLoader

import datasetrt as drt

BASE = 100_000
TARGET_S = 1.0


class Tiny:
    name = "loop-base"

    def __len__(self) -> int:
        return BASE

    def __iter__(self):
        for i in range(BASE):
            yield i.to_bytes(16, "little"), {"label": i % 10}


def first_batch(loader) -> float:
    """Seconds to the first batch of a new iteration (the rest is drained)."""
    t = time.perf_counter()
    it = iter(loader)
    next(it)
    took = time.perf_counter() - t
    for _ in it:
        pass
    return took


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        ds = drt.build(tmp, [Tiny()], progress=False)
        meta = ds.get_metadata()
        reps = args.rows // BASE
        big = pl.concat([meta] * reps, rechunk=True)
        ds.update_metadata(big)
        print(f"population: {len(ds):,} rows; {args.workers} persistent workers (fork)")
        # short epochs: the figure is the time to the first batch, not the epoch
        options = dict(batch_size=256, seed=1, epoch_len=256 * 4 * args.workers)
        tds = ds.to_torch(follow="head", **options)
        loader = DataLoader(
            tds,
            batch_size=None,
            num_workers=args.workers,
            persistent_workers=True,
            multiprocessing_context="fork",
        )
        first_batch(loader)  # start the workers
        columns = Path(ds.snapshot_path).parent / "columns"  # alias tables live there
        follow, restart, tables = [], [], []
        for trial in range(2 * args.trials):
            weights = pl.Series("weight", rng.random(len(ds)) + 0.01)
            before = set(columns.glob("*.alias")) if columns.exists() else set()
            ds.update_metadata(ds.get_metadata().with_columns(weights))
            t = time.perf_counter()
            if trial % 2 == 0:
                tds.set_epoch(trial + 1)
                first_batch(loader)
                follow.append(time.perf_counter() - t)
                after = set(columns.glob("*.alias")) if columns.exists() else set()
                tables.append(len(after - before))
            else:
                fresh = ds.to_torch(**options)
                dl = DataLoader(
                    fresh, batch_size=None, num_workers=args.workers, multiprocessing_context="fork"
                )
                first_batch(dl)
                restart.append(time.perf_counter() - t)
                del dl
        del loader

    def show(xs: list[float]) -> str:
        return f"median {statistics.median(xs):.3f} s (min {min(xs):.3f}, max {max(xs):.3f})"

    print(f"commit -> first batch, follow the head: {show(follow)}")
    print(f"commit -> first batch, new DataLoader:  {show(restart)}  (baseline)")
    ratio = statistics.median(follow) / statistics.median(restart)
    print(f"follow / restart: {ratio:.2f}x")
    worst = max(follow)
    met = "met" if worst <= TARGET_S else "missed"
    at = f"{args.rows:,} rows"
    print(f"target: every follow trial <= {TARGET_S:.1f} s at {at}: {met} ({worst:.3f} s)")
    print(f"alias tables written per reweight (follow): {tables} (target: 1 per host)")


if __name__ == "__main__":
    main()
