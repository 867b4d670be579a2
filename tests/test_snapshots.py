"""Named snapshots: tags, checkout, diff and cleanup."""

from __future__ import annotations

import polars as pl
import pytest

import datasetrt as drt
from conftest import run_child


def test_diff_reports_added_removed_and_reweighted_samples(two_caches):
    ds, _, _ = two_caches
    meta = ds.get_metadata()
    a = ds.version
    changed = pl.concat(
        [
            meta.filter(pl.col("sample_id") >= 2),  # samples 0, 1 removed
            meta.filter(pl.col("sample_id") == 5),  # sample 5 added once more
        ]
    ).with_columns(
        pl.when(pl.col("sample_id") == 9).then(3.0).otherwise(pl.col("weight")).alias("weight")
    )
    b = ds.update_metadata(changed)
    diff = ds.diff(a, b)
    by_change = {c: diff.filter(pl.col("change") == c) for c in ("added", "removed", "reweighted")}
    assert sorted(by_change["removed"]["sample_id"].to_list()) == [0, 0, 1, 1]  # both caches
    assert sorted(by_change["added"]["sample_id"].to_list()) == [5, 5]
    assert by_change["added"]["rows_b"].to_list() == [2, 2]
    assert sorted(by_change["reweighted"]["sample_id"].to_list()) == [9, 9]
    assert by_change["reweighted"]["weight_b"].to_list() == [3.0, 3.0]
    assert diff.height == 8
    assert ds.diff(b, b).height == 0


def test_tags_name_snapshots_and_survive_cleanup(two_caches):
    ds, root, _ = two_caches
    meta = ds.get_metadata()
    for n in (700, 600, 500, 400):
        ds.update_metadata(meta.head(n))
    ds.tag("paper-run", 2)
    assert ds.tags() == {"paper-run": 2}
    fingerprint_2 = ds.history().filter(pl.col("version") == 2)["fingerprint"][0]
    columns = ds.snapshot_path.parent / "columns"
    before = len(list(columns.iterdir()))
    removed = ds.cleanup(keep=1)
    assert removed == [0, 1, 3]
    assert ds.history()["version"].to_list() == [2, 4]
    assert len(list(columns.iterdir())) < before
    # the kept snapshots still open, read and reproduce their populations
    assert len(drt.open(root)) == 400
    ds.checkout("paper-run")
    assert len(ds) == 600 and ds.fingerprint == fingerprint_2
    assert sum(len(b) for b in ds.loader(100, seed=1)) == 600
    with pytest.raises(drt.InvalidInputError, match="no tag 'nope'"):
        ds.checkout("nope")
    with pytest.raises(drt.InvalidInputError, match="invalid tag"):
        ds.tag("../escape")
    with pytest.raises(drt.InvalidInputError, match="no snapshot 0"):
        ds.tag("gone", 0)


def test_sql_sees_the_active_population_whenever_it_is_first_used(two_caches):
    ds, root, _ = two_caches

    def rows(d) -> int:
        return d.sql("SELECT count(*) AS n FROM metadata")["n"][0]

    meta = ds.get_metadata()
    ds.update_metadata(meta.head(300))  # before the first query
    assert rows(ds) == 300
    ds.update_metadata(meta.head(200))  # after it
    assert rows(ds) == 200
    ds.checkout(1)
    assert rows(ds) == 300
    fresh = drt.open(root)
    fresh.checkout(0)  # a checkout before the first query
    assert rows(fresh) == 800
    fresh.select("SELECT * FROM metadata WHERE label = 1")
    assert rows(fresh) == 80 and len(fresh) == 80


CONCURRENT_WRITERS = """
import sys, threading
import datasetrt as drt
ds = drt.open(sys.argv[1])
meta = ds.get_metadata()
errors = []
def work(k):
    try:
        for i in range(10):
            ds.update_metadata(meta.head(100 + 10 * k + i))
            ds.sql("SELECT count(*) FROM metadata")
            ds.checkout(ds.version)  # may move the head back: the last commit still exists
    except Exception as e:
        errors.append(repr(e))
threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(ds.history()["version"].max(), len(ds.history()))
sys.exit("; ".join(errors) or None)
"""


def test_threads_that_update_one_dataset_at_once_all_land(two_caches):
    _, root, _ = two_caches
    assert run_child(CONCURRENT_WRITERS, root).split() == ["30", "31"]
