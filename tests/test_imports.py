"""Data where it already lives: ``drt.sources`` reads other formats as
sources of ``build``. A table source hands its payload column to the
engine as Arrow (no Python object per record); the other columns become
metadata, and the name decides reuse as for any source."""

from __future__ import annotations

import datetime
import pickle

import polars as pl
import pytest

import datasetrt as drt
from datasetrt import InvalidInputError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def rows(n: int, start: int = 0) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "data": [pickle.dumps({"i": i, "p": b"x" * (i % 7)}) for i in range(start, start + n)],
            "label": [i % 10 for i in range(start, start + n)],
            "caption": [f"sample {i}" for i in range(start, start + n)],
            "score": [i / 3 for i in range(start, start + n)],
        }
    )


def payloads(ds) -> dict[int, bytes]:
    meta = ds.get_metadata()
    return {
        s: ds.get_item(c, s).data for c, s in zip(meta["cache_id"], meta["sample_id"], strict=True)
    }


def test_parquet_files_become_a_cache_with_their_columns_as_metadata(tmp_path):
    """Two files, one written by polars and one by pyarrow (the format's own
    library), read in batches smaller than a file: every payload arrives
    whole, in file order, and the other columns are the metadata."""
    first, second = rows(300), rows(200, start=300)
    first.write_parquet(tmp_path / "a.parquet", row_group_size=64)
    pq.write_table(second.to_arrow(), tmp_path / "b.parquet", row_group_size=50)
    src = drt.sources.Parquet(tmp_path / "*.parquet", name="pq-v1", batch_rows=37)
    assert len(src) == 500
    ds = drt.build(tmp_path / "cache", [src], progress=False)
    meta = ds.get_metadata().sort("sample_id")
    whole = pl.concat([first, second])
    assert meta["sample_id"].to_list() == list(range(500))
    columns = ["label", "caption", "score"]
    assert meta.select(columns).equals(whole.select(columns))
    assert payloads(ds) == dict(enumerate(whole["data"].to_list()))
    assert ds.caches[0]["records"] == 500


def test_the_same_files_under_the_same_name_are_built_once(tmp_path):
    rows(50).write_parquet(tmp_path / "a.parquet")
    src = drt.sources.Parquet(tmp_path / "a.parquet", name="pq-v1", columns=["label"])
    ds = drt.build(tmp_path / "cache", [src], progress=False)
    columns = ds.get_metadata().columns
    assert "label" in columns and "caption" not in columns  # only the columns asked for
    again = drt.build(tmp_path / "cache", [src], progress=False)
    assert again.caches[0]["cache_id"] == ds.caches[0]["cache_id"]


def test_table_sources_build_in_processes(tmp_path):
    """A Parquet source pickles as its paths, so processes= builds several at once."""
    sources = []
    for k in range(3):
        rows(40, start=100 * k).write_parquet(tmp_path / f"{k}.parquet")
        sources.append(drt.sources.Parquet(tmp_path / f"{k}.parquet", name=f"part-{k}"))
    ds = drt.build(tmp_path / "cache", sources, processes=2, progress=False)
    assert len(ds) == 120
    assert sorted(ds.get_metadata()["label"].to_list()) == sorted(
        pl.concat([rows(40, 100 * k) for k in range(3)])["label"].to_list()
    )


class Tables:
    """A table source of frames given in the test."""

    def __init__(self, name: str, frames: list, data_column: str = "data"):
        self.name, self.frames, self.data_column = name, frames, data_column

    def tables(self):
        yield from self.frames


@pytest.mark.parametrize(
    ("frames", "needle"),
    [
        ([pl.DataFrame({"data": [b"a", None, b"c"]})], "record 1 .* is null"),
        ([pl.DataFrame({"data": ["text", "more"]})], "must hold bytes"),
        ([pl.DataFrame({"payload": [b"a"]})], "no data column 'data'"),
        ([pl.DataFrame({"data": [b"a"], "weight": [1.0]})], "'weight' is reserved"),
        ([pl.DataFrame({"data": [b"a"], "when": [datetime.date(2020, 1, 1)]})], "has type Date"),
        (
            [pl.DataFrame({"data": [b"a"], "x": [1]}), pl.DataFrame({"data": [b"b"], "y": [1]})],
            "table 1 has metadata columns",
        ),
        ([pl.DataFrame({"data": []}, schema={"data": pl.Binary})], "yielded no samples"),
    ],
)
def test_a_bad_table_is_invalid_input_and_leaves_nothing(tmp_path, frames, needle):
    with pytest.raises(InvalidInputError, match=needle):
        drt.build(tmp_path, [Tables("bad-v1", frames)], progress=False)
    assert not tmp_path.exists() or list(tmp_path.iterdir()) == []


def test_a_missing_or_unreadable_parquet_file_is_named(tmp_path):
    with pytest.raises(InvalidInputError, match="no Parquet file at"):
        drt.sources.Parquet(tmp_path / "none.parquet", name="x")
    with pytest.raises(InvalidInputError, match="no file matches"):
        drt.sources.Parquet(tmp_path / "*.parquet", name="x")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    src = drt.sources.Parquet(tmp_path / "bad.parquet", name="bad-v1")
    with pytest.raises(InvalidInputError, match="cannot read the Parquet files"):
        drt.build(tmp_path / "cache", [src], progress=False)
    assert not (tmp_path / "cache").exists() or list((tmp_path / "cache").iterdir()) == []
