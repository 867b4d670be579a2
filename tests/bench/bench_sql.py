"""SQL benchmark: our SQL against polars on 10M metadata rows, and SQL payload
reads against a get_item loop.

Run by hand against the release extension (`make bench`). In the same run:

- filter + group-by over 10M metadata rows in our SQL vs the same in polars;
- `SELECT p.data FROM metadata m JOIN payloads p USING (cache_id, sample_id)
  WHERE m.label = 3` (planned to PayloadTakeExec) vs `get_item` in a Python
  loop over the same identities, in MiB/s.

Targets (issue 5): our SQL within 1.5x of polars or faster; the SQL payload
read >= 5x the get_item loop.
"""

from __future__ import annotations

import atexit
import random
import shutil
import tempfile
from pathlib import Path

import polars as pl
from bench_seed import timed

import datasetrt as drt

PAYLOAD = 16 * 1024


class Records:
    def __init__(self, k: int, n: int):
        self.name = f"bench-sql-{k}"
        self.k = k
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        splits = ("train", "train", "train", "train", "val")
        for i in range(self.n):
            yield (
                random.Random(self.k * 10_000_000 + i).randbytes(PAYLOAD),
                {"label": i % 10, "split": splits[i % 5], "quality": (i * 37 % 100) / 100},
            )


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="drt-bench-sql-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # caches can be GBs
    ds = drt.build(tmp, [Records(0, 8192), Records(1, 8192)], codec="none", progress=False)

    # payload reads: SQL join vs get_item loop over the same identities
    for where in ("m.label = 3", "m.label < 5"):
        query = (
            "SELECT m.cache_id, m.sample_id, p.data FROM metadata m "
            f"JOIN payloads p USING (cache_id, sample_id) WHERE {where}"
        )
        plan = ds.sql("EXPLAIN " + query).filter(pl.col("plan_type") == "physical_plan")
        assert "PayloadTakeExec" in plan["plan"][0], plan
        result = ds.sql(query)  # warm
        ids = result.select("cache_id", "sample_id").rows()
        mib = len(ids) * PAYLOAD / 2**20
        sql_s = timed(lambda q=query: ds.sql(q))
        loop_s = timed(lambda ids=ids: [ds.get_item(c, s).data for c, s in ids])
        print(f"payload read WHERE {where}: {len(ids):,} rows ({mib:.0f} MiB), median of 5")
        print(f"  SQL join -> PayloadTakeExec  {mib / sql_s:9.0f} MiB/s")
        print(
            f"  get_item loop                {mib / loop_s:9.0f} MiB/s   "
            f"SQL/loop {loop_s / sql_s:5.1f}x   target >= 5x: "
            f"{'met' if loop_s / sql_s >= 5 else 'MISSED'}"
        )

    # 10M metadata rows: filter + group-by, ours vs polars
    meta = ds.get_metadata()
    ds.update_metadata(pl.concat([meta] * (10_000_000 // meta.height + 1)).head(10_000_000))
    frame = ds.get_metadata()
    sql = (
        "SELECT label, count(*) AS n, avg(quality) AS q, sum(weight) AS w FROM metadata "
        "WHERE split = 'train' AND quality >= 0.5 GROUP BY label ORDER BY label"
    )
    ours = timed(lambda: ds.sql(sql))
    theirs = timed(
        lambda: (
            frame.filter((pl.col("split") == "train") & (pl.col("quality") >= 0.5))
            .group_by("label")
            .agg(
                pl.len().alias("n"),
                pl.col("quality").mean().alias("q"),
                pl.col("weight").sum().alias("w"),
            )
            .sort("label")
        )
    )
    a = ds.sql(sql)
    b = (
        frame.filter((pl.col("split") == "train") & (pl.col("quality") >= 0.5))
        .group_by("label")
        .agg(pl.len().alias("n"))
        .sort("label")
    )
    assert a["n"].to_list() == b["n"].to_list()
    print(f"\nfilter + group-by over {frame.height:,} rows, median of 5")
    print(f"  datasetrt SQL {ours * 1e3:8.1f} ms")
    print(
        f"  polars        {theirs * 1e3:8.1f} ms   ours/polars {ours / theirs:4.2f}x   "
        f"target <= 1.5x: {'met' if ours / theirs <= 1.5 else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
