"""`ds.verify()` reads everything the dataset stores and reports every
problem, not only the first."""

from __future__ import annotations

import datasetrt as drt


def flip(path, at):
    data = bytearray(path.read_bytes())
    data[at] ^= 0x55
    path.write_bytes(bytes(data))


def test_an_intact_dataset_verifies_clean(two_caches):
    ds, _, _ = two_caches
    ds.update_metadata(ds.get_metadata().head(100))
    report = ds.verify()
    assert report.height == 0 and report.columns == ["kind", "path", "message"]


def test_every_damaged_record_and_snapshot_file_is_reported(tmp_path, source):
    src = source("plain-v1", 50, payload=lambda i: bytes([i % 251]) * 4000)
    ds = drt.build(tmp_path, [src], codec="none", progress=False)
    ds.update_metadata(ds.get_metadata().head(10))
    shard = next((tmp_path / "plain-v1").glob("shard-*"))
    # two records far apart, each 4,000 bytes: flip a byte inside each
    flip(shard, 16 + 4000 * 3 + 7)
    flip(shard, 16 + 4000 * 40 + 7)
    weight_files = ds.snapshot_path.parent / "columns"
    newest = max(weight_files.glob("*.arrow"), key=lambda p: p.stat().st_mtime_ns)
    flip(newest, newest.stat().st_size // 2)
    report = ds.verify()
    kinds = report["kind"].to_list()
    assert kinds.count("CorruptCacheError") == 3, report
    paths = set(report["path"].to_list())
    assert str(shard) in paths and str(newest) in paths
    assert any("sample 3" in m or "record 3" in m for m in report["message"]), report


def test_a_damaged_chunk_table_is_reported_and_reads_stay_right(tmp_path, source):
    """A column's chunk table (`<hash>.arrow.chunks`) that no longer
    describes its file is ignored by readers (they check the file whole, and
    read the right rows) and reported by verify, naming the table."""
    ds = drt.build(
        tmp_path, [source("tables-v1", 30, payload=lambda i: bytes([i]) * 8)], progress=False
    )
    expected = ds.get_metadata()
    table = next((ds.snapshot_path.parent / "columns").glob("*.arrow.chunks"))
    flip(table, 33)  # a chunk checksum (after the 32-byte header): the seal no longer matches
    again = drt.open(tmp_path)
    assert again.get_metadata().equals(expected)
    report = again.verify()
    assert report["path"].to_list() == [str(table)], report
    assert report["kind"].to_list() == ["CorruptCacheError"]
    assert "chunk table" in report["message"][0]


ALIAS_CHILD = r"""
import sys
import datasetrt as drt
ds = drt.open(sys.argv[1])
print([s.sample_id for b in ds.loader(16, seed=4, sampling="replacement") for s in b])
"""


def test_a_damaged_alias_table_is_rebuilt_by_readers_and_reported_by_verify(tmp_path, source):
    """An alias table (`columns/<hash>.alias`) is derived from the weights: a
    flipped byte in it made every weighted loader raise CorruptCacheError
    forever, and verify reported nothing."""
    import subprocess
    import sys

    import polars as pl

    ds = drt.build(tmp_path, [source("alias-v1", 3000)], progress=False)
    ds.update_metadata(
        ds.get_metadata().with_columns((1.0 + pl.col("sample_id") % 7).alias("weight"))
    )

    def child() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", ALIAS_CHILD, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
        )

    first = child()  # builds and stores the table
    assert first.returncode == 0, first.stderr
    [table] = (ds.snapshot_path.parent / "columns").glob("*.alias")
    size = table.stat().st_size
    for at in range(64, size - 4096, max(1, (size - 4160) // 8)):
        flip(table, at)  # in the body: entries a draw reads
    again = child()  # a fresh process checks the chunks its draws read
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout, "draws from a rebuilt table must be the same"
    assert "alias table was built again" in again.stderr
    # a third process reads the rebuilt table: nothing to say
    third = child()
    assert third.stdout == first.stdout and "built again" not in third.stderr
    # verify reads every chunk: damage is reported (and the table removed)
    for at in range(64, size - 4096, max(1, (size - 4160) // 8)):
        flip(table, at)
    report = drt.open(tmp_path).verify()
    assert report["path"].to_list() == [str(table)], report
    assert "alias table" in report["message"][0] and "removed" in report["message"][0]
    assert not table.exists()
    assert child().stdout == first.stdout
    assert drt.open(tmp_path).verify().is_empty()
