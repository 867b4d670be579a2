"""SQL benchmark: our SQL against polars on 10M metadata rows, and SQL payload
reads against a get_item loop.

Run by hand against the release extension (`make bench`). In the same run:

- `SELECT m.cache_id, m.sample_id, p.data FROM metadata m JOIN payloads p
  USING (cache_id, sample_id) WHERE m.label = 3` (planned to PayloadTakeExec)
  vs `get_item` in a Python loop over the same identities, in MiB/s, on a
  256 MiB cache and on a 1 GiB dataset (four such caches) of 16 KiB payloads
  (10 labels, so a label is 10% of the rows), plus `label < 5` (50%) on the
  larger one. The loop is timed
  twice: keeping every payload (what the SQL result holds) and dropping each
  one as it comes (less work than the query does, the stricter baseline).
  The index-only join (`p.stored_len`, no payload bytes) shows the fixed cost
  of a query: parsing, planning, the metadata filter;
- filter + group-by over 10M metadata rows in our SQL vs the same in polars.

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


def payload_reads(ds: drt.Dataset, where: str) -> None:
    query = (
        "SELECT m.cache_id, m.sample_id, p.data FROM metadata m "
        f"JOIN payloads p USING (cache_id, sample_id) WHERE {where}"
    )
    plan = ds.sql("EXPLAIN " + query).filter(pl.col("plan_type") == "physical_plan")
    assert "PayloadTakeExec" in plan["plan"][0], plan
    result = ds.sql(query)  # warm: pages mapped, plan paths loaded
    ids = result.select("cache_id", "sample_id").rows()
    assert result["data"][0] == ds.get_item(*ids[0]).data
    mib = len(ids) * PAYLOAD / 2**20
    index_only = query.replace("p.data", "p.stored_len")
    fixed_s = timed(lambda: ds.sql(index_only))
    sql_s = timed(lambda: ds.sql(query))

    def drop_each() -> None:
        for c, s in ids:
            ds.get_item(c, s).data  # noqa: B018 - the read is the point

    keep_s = timed(lambda: [ds.get_item(c, s).data for c, s in ids])
    drop_s = timed(drop_each)
    total = sum(c["records"] for c in ds.caches) * PAYLOAD / 2**20
    print(f"WHERE {where}: {len(ids):,} rows, {mib:.0f} MiB of a {total:.0f} MiB dataset")
    print(f"  SQL join -> PayloadTakeExec   {mib / sql_s:7.0f} MiB/s  ({sql_s * 1e3:.1f} ms,")
    print(f"    of which ~{fixed_s * 1e3:.1f} ms is the same query without payload bytes)")
    for name, loop_s in (("keeping payloads", keep_s), ("dropping each one", drop_s)):
        ratio = loop_s / sql_s
        print(
            f"  get_item loop, {name:17} {mib / loop_s:7.0f} MiB/s  SQL/loop {ratio:5.1f}x  "
            f"target >= 5x: {'met' if ratio >= 5 else 'MISSED'}"
        )


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="drt-bench-sql-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # caches are GBs
    small = drt.build(tmp / "small", [Records(0, 16384)], codec="none", progress=False)
    large = drt.build(
        tmp / "large", [Records(k, 16384) for k in range(1, 5)], codec="none", progress=False
    )
    print("payload reads, median of 5\n")
    payload_reads(small, "m.label = 3")
    payload_reads(large, "m.label = 3")
    payload_reads(large, "m.label < 5")
    ds = small

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
