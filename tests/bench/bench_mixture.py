"""What mixtures and a run that follows the head cost the loader.

A population of ``--rows`` rows (default 10^7; rows repeat the samples of one
small cache, as a population that duplicates samples does) with a ``source``
column of three groups. In alternating trials it times:

- **reach**: from ``set_mixture`` returning to the first delivered batch
  drawn by the new mixture, through a loader that follows the head within
  the epoch (``run=``): the change is placed at the next block no reader has
  claimed, so the batches read ahead before it are delivered first. Also the
  commit itself (``set_mixture``: the same rows, a new manifest).
- **exposures**: what a checkpoint trained on, from its state alone: every
  sample of a 10^6-row population counted over 100 epochs of permutations
  (10^8 draws; target <= 10 s), and the same for a state taken by 2 ranks.
- **speed**: draws per second of one epoch slice (``--draws`` draws, batch
  256) over the population without a mixture (the baseline), with a
  mixture, and with a mixture under ``run=`` (the schedule's claim per
  block). Ratios against the baseline measured in the same run.

Run by hand against the release build: ``make release`` then
``python tests/bench/bench_mixture.py``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import polars as pl

import datasetrt as drt

BASE = 100_000


class Tiny:
    name = "tiny"

    def __len__(self) -> int:
        return BASE

    def __iter__(self):
        for i in range(BASE):
            yield drt.CacheInput(i.to_bytes(8, "little"), {"label": i % 10})


def epoch_speed(ds: drt.Dataset, draws: int, seed: int, run: str | None = None) -> float:
    start = time.perf_counter()
    n = 0
    for batch in ds.loader(256, seed=seed, epoch_len=draws, run=run):
        n += len(batch)
    return n / (time.perf_counter() - start)


def exposures_time(root: str) -> None:
    ds = drt.build(root + "-exposures", [Tiny()], progress=False)
    base = ds.get_metadata()
    ds.update_metadata(pl.concat([base] * 10, rechunk=False))  # 10^6 rows
    loader = ds.loader(1000, seed=5, epoch=99, sampling="permutation")
    for _ in range(10):
        next(loader)
    state = loader.state_dict()
    start = time.perf_counter()
    counted = ds.exposures(state)
    took = time.perf_counter() - start
    total = counted["count"].sum()
    print(
        f"exposures: {ds.get_metadata().height:,} rows, epochs 0-99 ({total:,} draws) counted "
        f"in {took:.2f} s (target <= 10 s); {counted.height:,} distinct samples"
    )
    ranks = [
        ds.loader(1000, seed=5, epoch=99, sampling="permutation", rank=r, world_size=2)
        for r in range(2)
    ]
    for r in ranks:
        for _ in range(5):
            next(r)
    same = ds.exposures(ranks[0].state_dict(), world_size=2).equals(counted)
    print(f"exposures of the same point taken by 2 ranks: the same answer: {same}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=float, default=1e7)
    parser.add_argument("--draws", type=int, default=500_000)
    parser.add_argument("--trials", type=int, default=7)
    args = parser.parse_args()
    rows = int(args.rows)
    root = tempfile.mkdtemp(prefix="bench-mixture-")
    exposures_time(root)
    ds = drt.build(root, [Tiny()], progress=False)
    base = ds.get_metadata()
    start = time.perf_counter()
    population = pl.concat([base] * (rows // BASE), rechunk=False).with_columns(
        pl.Series("source", ["web", "code", "books"] * (rows // 3) + ["web"] * (rows % 3))
    )
    ds.update_metadata(population)
    print(f"population: {rows:,} rows committed in {time.perf_counter() - start:.1f} s")
    plain = ds.version
    start = time.perf_counter()
    mixed = ds.set_mixture("source", {"web": 0.6, "code": 0.3, "books": 0.1})
    print(f"first set_mixture (finds the groups' rows): {time.perf_counter() - start:.2f} s")

    # reach: a change during the epoch, to the first batch drawn by it
    commits, reaches = [], []
    loader = ds.loader(64, seed=1, epoch_len=rows, run=f"reach-{time.time_ns()}")
    next(loader)
    for trial in range(args.trials * 3):
        shares = {"web": 1 + trial % 4, "code": 2, "books": 1 + trial % 3}
        start = time.perf_counter()
        number = ds.set_mixture("source", shares)
        committed = time.perf_counter()
        while number not in next(loader).snapshots:
            pass
        reached = time.perf_counter()
        commits.append((committed - start) * 1e3)
        reaches.append((reached - committed) * 1e3)
    print(
        f"reach at {rows:,} rows, {len(reaches)} changes: set_mixture median "
        f"{statistics.median(commits):.1f} ms (max {max(commits):.1f}); from its return to "
        f"the first batch drawn by it median {statistics.median(reaches):.1f} ms "
        f"(max {max(reaches):.1f}; target <= 50 ms)"
    )
    mixed = ds.version

    # speed: alternating trials, ratios against the same run's baseline
    ds.checkout(plain)
    epoch_speed(ds, args.draws // 10, 0)  # warm: tables and pages
    ds.checkout(mixed)
    epoch_speed(ds, args.draws // 10, 0, run=f"warm-{time.time_ns()}")
    speeds: dict[str, list[float]] = {"plain": [], "mixture": [], "mixture + run": []}
    for trial in range(args.trials):
        ds.checkout(plain)
        speeds["plain"].append(epoch_speed(ds, args.draws, trial))
        ds.checkout(mixed)
        speeds["mixture"].append(epoch_speed(ds, args.draws, trial))
        speeds["mixture + run"].append(
            epoch_speed(ds, args.draws, trial, run=f"speed-{trial}-{time.time_ns()}")
        )
    baseline = statistics.median(speeds["plain"])
    for name, got in speeds.items():
        ratios = [g / p for g, p in zip(got, speeds["plain"], strict=True)]
        print(
            f"{name:>14}: median {statistics.median(got) / 1e6:.2f} M draws/s, "
            f"{statistics.median(got) / baseline:.3f}x plain (per-trial ratios "
            f"{min(ratios):.3f}..{max(ratios):.3f}; target >= 0.98)"
        )


if __name__ == "__main__":
    main()
