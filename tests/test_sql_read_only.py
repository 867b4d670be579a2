"""SQL reads the dataset and what was registered, nothing else: no statement
reads or writes a file, and none changes a table behind the catalog's back."""

from __future__ import annotations

import pytest

import datasetrt as drt
from datasetrt import QueryError


@pytest.fixture
def ds(two_caches):
    return two_caches[0]


ESCAPES = [
    ("COPY (SELECT * FROM metadata) TO '{out}' STORED AS CSV", "COPY"),
    (
        "COPY (SELECT encode(p.data, 'hex') FROM metadata m JOIN payloads p "
        "USING (cache_id, sample_id)) TO '{out}'",
        "COPY",
    ),
    ("CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '/etc/passwd'", "CREATE EXTERNAL TABLE"),
    ("INSERT INTO metadata SELECT * FROM metadata", "INSERT"),
    ("DELETE FROM metadata WHERE label = 1", "DELETE"),
    ("UPDATE metadata SET weight = 0", "UPDATE"),
    ("SET datafusion.execution.target_partitions = 1", "SET"),
    ("EXPLAIN ANALYZE COPY (SELECT 1) TO '{out}'", "COPY"),
    ("CREATE SCHEMA elsewhere", "schemas"),
    ("CREATE VIEW v AS SELECT * FROM metadata", "CREATE VIEW"),
]


@pytest.mark.parametrize(("query", "what"), ESCAPES)
def test_statements_that_reach_outside_are_refused_before_anything_runs(ds, tmp_path, query, what):
    out = tmp_path / "out.csv"
    meta, version = ds.get_metadata(), ds.version
    for run in (ds.sql, ds.select):
        with pytest.raises(QueryError, match="read-only") as err:
            run(query.format(out=out))
        assert what in str(err.value)
        assert not out.exists()
    assert ds.version == version and ds.get_metadata().equals(meta)
    assert ds.sql("SELECT count(*) AS n FROM metadata")["n"][0] == meta.height
    assert len(drt.open(ds.caches[0]["path"].parent)) == meta.height


def test_session_tables_still_work(ds):
    ds.sql("CREATE TABLE few AS SELECT * FROM metadata WHERE label = 1")
    ds.sql("CREATE TABLE fewer AS SELECT * FROM few WHERE split = 'train'")
    assert ds.sql("SELECT count(*) AS n FROM fewer")["n"][0] == 80
    ds.select("SELECT * FROM fewer")
    assert len(ds) == 80
    ds.sql("DROP TABLE fewer")
    ds.sql("DROP TABLE few")
    with pytest.raises(QueryError):
        ds.sql("SELECT * FROM few")
