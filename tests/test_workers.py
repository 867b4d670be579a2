"""Distributed SQL: workers in this process (``drt.Worker``) and in another
(``datasetrt worker``) run a dataset's scans of ``metadata``; every answer
and every commit equals the one-process one, and a process that ran it still
forks DataLoader workers that read."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys

import polars as pl
import pytest

import datasetrt as drt
from datasetrt.cli import main as cli


def sorted_frame(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.sort(frame.columns, nulls_last=True)


@pytest.fixture
def two_workers():
    with drt.Worker() as a, drt.Worker() as b:
        yield [a, b]


@pytest.fixture
def partitioned(two_caches, monkeypatch):
    """The two caches' 800 rows in partitions of 100: a scan a plan can
    spread over two workers."""
    monkeypatch.setenv("DATASETRT_PARTITION_ROWS", "100")
    _, root, _ = two_caches
    ds = drt.open(root)
    ds.update_metadata(
        ds.get_metadata().with_columns(
            label=pl.col("sample_id") % 7, quality=pl.col("sample_id") / 100
        )
    )
    return ds, root


def test_sql_and_select_on_two_workers_equal_one_process(partitioned, two_workers):
    ds, root = partitioned
    there = drt.open(root, workers=[w.url for w in two_workers])
    for query in [
        "SELECT label, count(*) AS n, sum(weight) AS w FROM metadata GROUP BY label",
        "SELECT cache_id, sample_id FROM metadata WHERE quality > 2.5",
        "SELECT m.sample_id, p.raw_len FROM metadata m "
        "JOIN payloads p USING (cache_id, sample_id) WHERE m.label = 3",
        # the shaped recipes' window function, where the workers' plans hold it
        "SELECT sample_id, drt_shape_weights(quality - 1.0, 'rank', 0.1, 2.0, 0.0) "
        "OVER (PARTITION BY label) AS w FROM metadata",
    ]:
        assert sorted_frame(there.sql(query)).equals(sorted_frame(ds.sql(query))), query
    # a filter-and-reweight commit: the workers compute, this process commits
    query = (
        "SELECT cache_id, sample_id, label, quality, weight * 2 AS weight "
        "FROM metadata WHERE label < 3"
    )
    version = there.select(query)
    assert there.version == version
    expected = sorted_frame(ds.sql(query))
    assert sorted_frame(there.get_metadata()).equals(expected)
    # the workers store the partitions: a bad row is still the caller's
    # typed error, with the row of the update, and nothing is committed
    bad = (
        "SELECT cache_id, sample_id, CASE WHEN sample_id = 1 THEN -1.0 ELSE weight END "
        "AS weight FROM metadata"
    )
    with pytest.raises(drt.InvalidInputError, match=r"weight -1\.0 is invalid"):
        there.select(bad)
    assert there.version == version
    # a worker's dataset is pickled with its workers
    import pickle

    again = pickle.loads(pickle.dumps(there))
    assert sorted_frame(again.sql("SELECT * FROM metadata")).equals(expected)


def test_bad_worker_lists_are_refused_when_opened(two_caches):
    _, root, _ = two_caches
    for workers in [["not a url"], ["ftp://127.0.0.1:1"], "http://127.0.0.1:1"]:
        with pytest.raises(drt.InvalidInputError, match="worker"):
            drt.open(root, workers=workers)
    with pytest.raises(drt.InvalidInputError, match="port"):
        drt.Worker(port=70000)
    # the extension DataLoader workers use runs nothing on workers itself
    with pytest.raises(drt.InvalidInputError, match="datasetrt_distributed"):
        drt._native.Dataset([str(root)], workers=["http://127.0.0.1:1"])


def test_a_stopped_worker_is_an_error_not_a_hang(partitioned, two_workers):
    _, root = partitioned
    there = drt.open(root, workers=[w.url for w in two_workers])
    query = "SELECT label, count(*) FROM metadata GROUP BY label"
    assert there.sql(query).height == 7
    for w in two_workers:
        w.stop()
        assert not w.running
    # the query did run on them: without them it cannot
    with pytest.raises(drt.QueryError, match=r"127\.0\.0\.1"):
        there.sql(query)


def test_the_worker_command_serves_what_sql_worker_sends(two_caches, capsys):
    _, root, _ = two_caches
    proc = subprocess.Popen(
        [sys.executable, "-m", "datasetrt", "worker", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("datasetrt worker serving on http://127.0.0.1:"), line
        url = line.split()[-1]
        query = "SELECT count(*) AS n FROM metadata WHERE sample_id < 100"
        capsys.readouterr()
        assert cli(["sql", str(root), query, "--format", "csv", "--worker", url]) == 0
        assert capsys.readouterr().out.splitlines() == ["n", "200"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _distributed_sql_in_a_forked_child(there, query, out):
    try:
        there.sql(query)
        out.put("ran")
    except drt.InvalidInputError as e:
        out.put(str(e))


def test_a_process_that_ran_distributed_sql_forks_loader_workers_that_read(
    partitioned, two_workers
):
    """The coordinator's threads park with parking_lot (datafusion-distributed's
    tokio): forked children read through datasetrt._native, untouched by it,
    and distributed SQL in a child is a clear error, never a crash."""
    torch = pytest.importorskip("torch")
    ds, root = partitioned
    there = drt.open(root, workers=[w.url for w in two_workers])
    query = "SELECT label, count(*) FROM metadata GROUP BY label"
    assert there.sql(query).height == 7  # this process's coordinator has run
    tds = there.to_torch(batch_size=16, seed=3, sampling="permutation")
    for _ in range(3):  # the crash this guards against came in most runs, not all
        loader = torch.utils.data.DataLoader(
            tds, batch_size=None, num_workers=4, multiprocessing_context="fork", timeout=120
        )
        ids = sorted(i for batch in loader for i in batch["sample_id"].tolist())
        assert ids == sorted(ds.get_metadata()["sample_id"].to_list())
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_distributed_sql_in_a_forked_child, args=(there, query, out))
    child.start()
    try:
        said = out.get(timeout=120)
    finally:
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    assert "forked" in said, said
    # and the parent still runs it
    assert there.sql(query).height == 7
