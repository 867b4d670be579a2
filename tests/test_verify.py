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
