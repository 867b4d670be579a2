"""SQL over payloads: joins plan to PayloadTakeExec, index columns read no
payload bytes, registered tables join like metadata; Arrow interop."""

from __future__ import annotations

import polars as pl
import pytest

import datasetrt as drt

JOIN = (
    "SELECT m.cache_id, m.sample_id, p.data FROM metadata m "
    "JOIN payloads p USING (cache_id, sample_id)"
)


def physical_plan(ds, query: str) -> str:
    plans = ds.sql("EXPLAIN " + query)
    return plans.filter(pl.col("plan_type") == "physical_plan")["plan"][0]


def by_id(ds, sources):
    return {c["cache_id"]: next(s for s in sources if s.name == c["name"]) for c in ds.caches}


def test_a_join_with_payloads_plans_to_a_take_not_a_scan(two_caches):
    ds, _, _ = two_caches
    plan = physical_plan(ds, JOIN + " WHERE m.label = 3")
    assert "PayloadTakeExec" in plan
    assert "HashJoinExec" not in plan and "PayloadScanExec" not in plan


@pytest.mark.parametrize(
    "where", ["WHERE m.label = 3", "WHERE m.quality > 0.5 AND m.split = 'val'", ""]
)
def test_joined_payloads_are_the_bytes_written(two_caches, where):
    ds, _, sources = two_caches
    src = by_id(ds, sources)
    got = ds.sql(f"{JOIN} {where}")
    expected_rows = ds.sql(f"SELECT count(*) AS n FROM metadata m {where}")["n"][0]
    assert got.height == expected_rows
    for cid, sid, data in got.iter_rows():
        assert data == src[cid].payload(sid)


def test_order_by_and_limit_around_a_payload_join(two_caches):
    ds, _, sources = two_caches
    src = by_id(ds, sources)
    got = ds.sql(JOIN + " ORDER BY m.sample_id DESC, m.cache_id LIMIT 7")
    assert got["sample_id"].to_list() == sorted(got["sample_id"].to_list(), reverse=True)
    assert got.height == 7
    assert all(d == src[c].payload(s) for c, s, d in got.iter_rows())
    # the payloads side may come first in the query
    flipped = ds.sql(
        "SELECT p.data, m.sample_id FROM payloads p JOIN metadata m "
        "ON p.cache_id = m.cache_id AND p.sample_id = m.sample_id "
        "WHERE m.label = 1"
    )
    assert flipped.columns == ["data", "sample_id"] and flipped.height == 80
    assert "PayloadTakeExec" in physical_plan(
        ds, "SELECT p.data FROM payloads p JOIN metadata m USING (cache_id, sample_id)"
    )


def test_index_only_columns_read_no_payload_bytes(two_caches):
    ds, _, sources = two_caches
    src = by_id(ds, sources)
    analyzed = ds.sql("EXPLAIN ANALYZE SELECT cache_id, sample_id, raw_len, codec FROM payloads")
    text = "\n".join(analyzed["plan"].to_list())
    assert "payload_bytes=0" in text and "output_rows=800" in text
    table = ds.sql("SELECT cache_id, sample_id, raw_len, stored_len, codec FROM payloads")
    assert table.height == 800
    assert ds.sql("SELECT count(*) AS n FROM payloads")["n"][0] == 800  # no column at all
    for cid, sid, raw_len, stored_len, codec in table.iter_rows():
        assert raw_len == len(src[cid].payload(sid))
        assert codec in ("none", "zstd") and (stored_len == raw_len) == (codec == "none")
    joined = ds.sql(
        "EXPLAIN ANALYZE SELECT m.sample_id, p.raw_len FROM metadata m "
        "JOIN payloads p USING (cache_id, sample_id) WHERE m.label = 2"
    )
    assert "payload_bytes=0" in "\n".join(joined["plan"].to_list())


def test_a_registered_losses_table_drives_hard_example_weights(two_caches, tmp_path):
    ds, _, _ = two_caches
    meta = ds.get_metadata()
    losses = meta.select("cache_id", "sample_id").with_columns(
        (pl.col("sample_id") % 7 + 0.5).alias("loss")
    )
    ds.register("losses", losses)
    ds.select(
        "SELECT m.cache_id, m.sample_id, m.label, l.loss AS weight "
        "FROM metadata m JOIN losses l USING (cache_id, sample_id)"
    )
    got = ds.get_metadata().sort("cache_id", "sample_id")
    assert got["weight"].to_list() == (got["sample_id"] % 7 + 0.5).cast(pl.Float64).to_list()
    # a file path works too, and joins with payloads plan to a take
    losses.write_parquet(tmp_path / "losses.parquet")
    ds.register("losses_file", tmp_path / "losses.parquet")
    plan = physical_plan(
        ds,
        "SELECT l.loss, p.data FROM losses_file l "
        "JOIN payloads p USING (cache_id, sample_id) WHERE l.loss > 6",
    )
    assert "PayloadTakeExec" in plan
    with pytest.raises(drt.InvalidInputError, match="metadata"):
        ds.register("metadata", losses)
    with pytest.raises(drt.CacheNotFoundError):
        ds.register("x", tmp_path / "missing.csv")


def test_rows_of_a_registered_table_that_name_no_stored_sample_follow_sql(two_caches):
    ds, _, sources = two_caches
    src = by_id(ds, sources)
    alpha, beta = sorted(src, key=lambda c: src[c].name)  # 500 and 300 samples
    # unknown cache, sample past the end, negative sample, null ids
    ids = [
        (beta, 7, 0.1),
        (alpha + beta, 1, 0.2),
        (alpha, 499, 0.3),
        (beta, 300, 0.4),
        (alpha, -1, 0.5),
        (None, 3, 0.6),
        (alpha, None, 0.7),
        (alpha, 2, 0.8),
    ]
    losses = pl.DataFrame(ids, schema=["cache_id", "sample_id", "loss"], orient="row")
    ds.register("losses", losses)
    stored = [0, 2, 7]  # rows naming a stored sample
    inner = (
        "SELECT l.cache_id, l.sample_id, l.loss, p.data FROM losses l "
        "JOIN payloads p USING (cache_id, sample_id) ORDER BY l.loss"
    )
    assert "PayloadTakeExec" in physical_plan(ds, inner)
    got = ds.sql(inner)  # an inner join leaves them out, like any join
    assert got["loss"].to_list() == [ids[i][2] for i in stored]
    assert all(d == src[c].payload(s) for c, s, _, d in got.iter_rows())
    outer = (
        "SELECT l.cache_id, l.sample_id, l.loss, p.raw_len, p.data FROM losses l "
        "LEFT JOIN payloads p USING (cache_id, sample_id) ORDER BY l.loss"
    )
    assert "PayloadTakeExec" in physical_plan(ds, outer)
    got = ds.sql(outer)  # an outer join keeps them with null payload columns
    assert got["loss"].to_list() == [row[2] for row in ids]
    for i, (c, s, _, raw_len, d) in enumerate(got.iter_rows()):
        if i in stored:
            assert d == src[c].payload(s) and raw_len == len(d)
        else:
            assert d is None and raw_len is None
    flipped = (
        "SELECT l.loss, p.data FROM payloads p RIGHT JOIN losses l "
        "ON p.cache_id = l.cache_id AND p.sample_id = l.sample_id ORDER BY l.loss"
    )
    assert "PayloadTakeExec" in physical_plan(ds, flipped)
    assert ds.sql(flipped)["data"].to_list() == got["data"].to_list()
    # a condition on the payloads side of an outer join nulls rows rather
    # than dropping them
    filtered = ds.sql(
        "SELECT l.loss, p.data FROM losses l LEFT JOIN "
        "(SELECT * FROM payloads WHERE sample_id > 5) p USING (cache_id, sample_id) "
        "ORDER BY l.loss"
    )
    assert filtered["loss"].to_list() == [row[2] for row in ids]
    assert [d is not None for d in filtered["data"]] == [i in (0, 2) for i in range(8)]


def test_pyarrow_and_duckdb_read_results_through_pycapsules(two_caches):
    pa = pytest.importorskip("pyarrow")
    duckdb = pytest.importorskip("duckdb")
    ds, _, _ = two_caches
    table = pa.table(ds._native.get_metadata())
    assert table.num_rows == 800 and table.column_names[:2] == ["cache_id", "sample_id"]
    counts = pa.table(ds._native.sql("SELECT label, count(*) AS n FROM metadata GROUP BY label"))
    assert sorted(counts.column("n").to_pylist()) == [80] * 10
    meta = ds.get_metadata()  # noqa: F841  (read by DuckDB's replacement scan)
    n = duckdb.sql("SELECT count(*) FROM meta WHERE label = 4").fetchall()[0][0]
    assert n == 80
    # and back: a DuckDB relation (an Arrow C stream) updates the population
    ds.update_metadata(duckdb.sql("SELECT * FROM meta WHERE split = 'val'"))
    assert len(ds) == 160


def test_the_datafusion_package_queries_metadata_through_the_ffi_capsule(two_caches):
    datafusion = pytest.importorskip("datafusion")
    ds, _, _ = two_caches
    ds.update_metadata(ds.get_metadata().filter(pl.col("split") == "val"))
    ctx = datafusion.SessionContext()
    ctx.register_table("metadata", ds.datafusion_table())
    got = pl.DataFrame(
        ctx.sql("SELECT label, count(*) AS n FROM metadata GROUP BY label ORDER BY label")
    )
    assert got["label"].to_list() == [0, 5] and got["n"].to_list() == [80, 80]
    assert got.equals(
        ds.sql("SELECT label, count(*) AS n FROM metadata GROUP BY label ORDER BY label")
    )


def test_filters_on_payload_columns_still_plan_to_a_take(two_caches):
    ds, _, sources = two_caches
    src = by_id(ds, sources)
    query = (
        JOIN.replace("p.data", "p.data, p.raw_len")
        + " WHERE m.label = 3 AND p.raw_len > 36 AND p.codec = 'none'"
    )
    plan = physical_plan(ds, query)
    assert "PayloadTakeExec" in plan and "HashJoinExec" not in plan, plan
    got = ds.sql(query)
    expected = [
        (c, s)
        for c, s in ds.sql("SELECT cache_id, sample_id FROM metadata WHERE label = 3").iter_rows()
        if len(src[c].payload(s)) > 36
    ]
    assert sorted(zip(got["cache_id"], got["sample_id"], strict=True)) == sorted(expected)
    assert all(d == src[c].payload(s) and n == len(d) for c, s, d, n in got.iter_rows())


def nodes_above_and_below_the_take(plan: str) -> tuple[str, str]:
    lines = plan.splitlines()
    at = next(i for i, line in enumerate(lines) if "PayloadTakeExec" in line)
    return "\n".join(lines[:at]), "\n".join(lines[at + 1 :])


def test_conditions_on_the_identity_run_before_the_payload_read(two_caches):
    ds, _, sources = two_caches
    src = by_id(ds, sources)
    # conditions on p's identity columns are decided on the ids alone, so the
    # taken bytes are never filtered (or copied) afterwards
    query = JOIN + " WHERE m.label = 3 AND m.sample_id < 40 AND p.sample_id % 2 = 1"
    got = ds.sql(query)
    assert sorted(got["sample_id"].to_list()) == [3, 3, 13, 13, 23, 23, 33, 33]
    assert all(d == src[c].payload(s) for c, s, d in got.iter_rows())
    above, below = nodes_above_and_below_the_take(physical_plan(ds, query))
    assert "FilterExec" not in above and "sample_id@1 % 2 = 1" in below
    # a condition on the stored record still filters the taken rows
    mixed = (
        JOIN.replace("p.data", "p.data, p.raw_len")
        + " WHERE m.label = 3 AND p.sample_id < 40 AND p.raw_len > 36"
    )
    got = ds.sql(mixed)
    expected = sorted((c, s) for c in src for s in range(3, 40, 10) if len(src[c].payload(s)) > 36)
    assert sorted(zip(got["cache_id"], got["sample_id"], strict=True)) == expected
    assert all(d == src[c].payload(s) and n == len(d) for c, s, d, n in got.iter_rows())
    above, below = nodes_above_and_below_the_take(physical_plan(ds, mixed))
    assert "raw_len" in above and "raw_len" not in below


@pytest.mark.parametrize(
    ("query", "node"),
    [
        (JOIN + " WHERE m.sample_id = 7", "PayloadTakeExec"),
        ("SELECT sample_id, length(data) AS n FROM payloads", "PayloadScanExec"),
    ],
)
def test_a_corrupt_payload_read_through_sql_is_a_corrupt_cache_error(tmp_path, query, node):
    """Both SQL read paths (the take a join plans to, and the scan) report the
    damaged record as the loader does: its file, shard and offset."""
    from conftest import Source

    src = Source("fragile-v1", 64, payload=lambda i: bytes([i]) * 512)
    drt.build(tmp_path, [src], codec="none", progress=False)
    shard = tmp_path / "fragile-v1" / "shard-00000.drts"
    raw = bytearray(shard.read_bytes())
    raw[16 + 512 * 7 + 100] ^= 0x01  # one bit of sample 7's payload
    shard.write_bytes(bytes(raw))
    ds = drt.open(tmp_path)
    assert node in physical_plan(ds, query)
    with pytest.raises(drt.CorruptCacheError) as info:
        ds.sql(query)
    error = info.value
    assert not isinstance(error, drt.QueryError)
    assert (str(error.path), error.record, error.shard, error.offset) == (str(shard), 7, 0, 3600)


def test_payloads_are_measured_and_hashed_as_bytes(tmp_path):
    """length/octet_length of a payload count its bytes (a UTF-8 payload of
    19 bytes and 16 characters; one that is not UTF-8), text keeps counting
    characters, and md5/sha256 hash the bytes: duplicates across caches found
    by hash (issue 51 section 3)."""
    import hashlib

    from conftest import Source

    text = "héllo wörld ünïcode".encode()  # 19 characters in 23 bytes
    payloads = [text, b"\xff\xfe\x00binary\x80", b"", b"same bytes"]
    a = Source("bytes-a", len(payloads), payload=lambda i: payloads[i])
    b = Source("bytes-b", 2, payload=lambda i: [b"same bytes", b"other"][i])
    ds = drt.build(tmp_path, [a, b], progress=False)
    got = ds.sql(
        "SELECT p.cache_id, p.sample_id, length(data) AS n, octet_length(data) AS o, "
        "char_length(data) AS c, md5(data) AS md5, sha256(data) AS sha "
        "FROM payloads p ORDER BY cache_id, sample_id"
    )
    stored = {c["cache_id"]: c["name"] for c in ds.caches}
    for row in got.iter_rows(named=True):
        data = (payloads if stored[row["cache_id"]] == "bytes-a" else [b"same bytes", b"other"])[
            row["sample_id"]
        ]
        assert row["n"] == row["o"] == row["c"] == len(data), row
        assert row["md5"] == hashlib.md5(data).hexdigest()
        assert row["sha"] == hashlib.sha256(data).hexdigest()
    assert len(text) == 23 and len(text.decode()) == 19  # bytes, not characters, above
    # text is still measured in characters
    assert ds.sql("SELECT length('héllo') AS n, octet_length('héllo') AS o").row(0) == (5, 6)
    assert ds.sql("SELECT md5('abc') AS h")["h"][0] == hashlib.md5(b"abc").hexdigest()
    # duplicate payloads across caches, by hash (docs/sql.md)
    dups = ds.sql(
        "SELECT sha256(data) AS h, count(*) AS copies, count(DISTINCT cache_id) AS caches "
        "FROM payloads GROUP BY sha256(data) HAVING count(*) > 1"
    )
    assert dups.rows() == [(hashlib.sha256(b"same bytes").hexdigest(), 2, 2)]
