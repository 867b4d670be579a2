"""Data where it already lives: ``drt.sources`` reads other formats as
sources of ``build``. A table source hands its payload column to the
engine as Arrow (no Python object per record); the other columns become
metadata, and the name decides reuse as for any source."""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import pickle
import shutil
from pathlib import Path

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


def test_a_source_of_its_own_runs_in_order_on_the_callers_thread(tmp_path):
    """Review finding: only drt.sources' own sources are read ahead on a
    thread; a source of the user's may reuse the buffer it yielded (or hold
    a resource of its thread) and still caches every row."""
    import threading

    class Reused:
        name = "reused"
        data_column = "data"

        def tables(self):
            buffer = {"data": [], "i": []}
            for i in range(40):
                assert threading.current_thread() is threading.main_thread()
                buffer["data"].append(f"row {i}".encode())
                buffer["i"].append(i)
                if len(buffer["i"]) == 10:
                    yield buffer
                    buffer["data"].clear()
                    buffer["i"].clear()

    meta = drt.build(tmp_path / "c", [Reused()], progress=False).get_metadata()
    assert sorted(meta["i"].to_list()) == list(range(40))
    assert drt.sources.Parquet.read_ahead and drt.sources.MDS.read_ahead


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
    with pytest.raises(InvalidInputError, match=r"cannot read Parquet file .*bad\.parquet") as info:
        drt.build(tmp_path / "cache", [src], progress=False)
    assert info.value.path == str(tmp_path / "bad.parquet")
    assert not (tmp_path / "cache").exists() or list((tmp_path / "cache").iterdir()) == []


def write_shard(path, samples) -> None:
    """A WebDataset shard made with tarfile: each sample's members in a row."""
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for key, members in samples:
            for ext, raw in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(raw)
                tar.addfile(info, io.BytesIO(raw))


def wds_samples(n: int, start: int = 0) -> list:
    return [
        (
            f"train/s{i:05d}",
            {"jpg": os.urandom(50 + i % 13), "cls": str(i % 10).encode(), "txt": f"t {i}".encode()},
        )
        for i in range(start, start + n)
    ]


def test_webdataset_shards_become_a_cache_one_record_per_sample(tmp_path):
    first, second = wds_samples(30), wds_samples(20, start=30)
    second[3][1].pop("txt")  # a sample without a metadata member: null there
    write_shard(tmp_path / "a.tar", first)
    write_shard(tmp_path / "b.tar", second)
    src = drt.sources.WebDataset(
        tmp_path / "*.tar",
        name="wds-v1",
        data="jpg",
        metadata={"cls": int, "txt": str},
        batch_rows=7,
    )
    ds = drt.build(tmp_path / "cache", [src], progress=False)
    meta = ds.get_metadata().sort("sample_id")
    samples = first + second
    assert meta["key"].to_list() == [k for k, _ in samples]
    assert meta["shard"].to_list() == [0] * 30 + [1] * 20
    assert meta["cls"].to_list() == [i % 10 for i in range(50)]
    assert meta["txt"][33] is None and meta["txt"][0] == "t 0"
    assert payloads(ds) == {i: m["jpg"] for i, (_, m) in enumerate(samples)}


def test_a_bad_webdataset_shard_names_the_sample(tmp_path):
    samples = wds_samples(5)
    samples[2][1]["cls"] = b"three"
    write_shard(tmp_path / "bad-cls.tar", samples)
    src = drt.sources.WebDataset(
        tmp_path / "bad-cls.tar", name="w1", data="jpg", metadata={"cls": int}
    )
    with pytest.raises(InvalidInputError, match=r"train/s00002\.cls .* is not int text"):
        drt.build(tmp_path / "c1", [src], progress=False)
    samples = wds_samples(5)
    samples[4][1].pop("jpg")
    write_shard(tmp_path / "no-jpg.tar", samples)
    src = drt.sources.WebDataset(tmp_path / "no-jpg.tar", name="w2", data="jpg")
    with pytest.raises(InvalidInputError, match=r"'train/s00004' .* has no 'jpg' member"):
        drt.build(tmp_path / "c2", [src], progress=False)
    (tmp_path / "cut.tar").write_bytes((tmp_path / "no-jpg.tar").read_bytes()[:700])
    src = drt.sources.WebDataset(tmp_path / "cut.tar", name="w3", data="jpg")
    with pytest.raises(InvalidInputError, match="cannot read tar shard"):
        drt.build(tmp_path / "c3", [src], progress=False)
    with pytest.raises(InvalidInputError, match="no tar shard at"):
        drt.sources.WebDataset(tmp_path / "none.tar", name="w4", data="jpg")
    for name in ("c1", "c2", "c3"):
        assert not (tmp_path / name).exists() or list((tmp_path / name).iterdir()) == []


MDS_FIXTURES = Path(__file__).parent / "data" / "mds"


def mds_fixture():
    """tests/data/mds/make_fixtures.py: the records its fixtures hold (the
    fixtures themselves were written by mosaicml-streaming's MDSWriter)."""
    spec = importlib.util.spec_from_file_location("mds_fixtures", MDS_FIXTURES / "make_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("layout", ["plain", "zstd", "gz"])
def test_mds_shards_become_a_cache_one_record_per_sample(tmp_path, layout):
    """Four shards MDSWriter wrote (raw, zstd- or gzip-compressed): every
    sample arrives once, with its columns typed as MDS declared them and
    its place in the dataset (`shard`, `index`)."""
    fixture = mds_fixture()
    src = drt.sources.MDS(MDS_FIXTURES / layout, name="mds-v1", data="data")
    assert len(src) == fixture.COUNT
    ds = drt.build(tmp_path / "cache", [src], progress=False)
    meta = ds.get_metadata().sort("index")
    expected = [fixture.record(i) for i in range(fixture.COUNT)]
    assert meta["index"].to_list() == meta["sample_id"].to_list() == list(range(fixture.COUNT))
    assert meta["label"].to_list() == [r["label"] for r in expected]
    assert meta["caption"].to_list() == [r["caption"] for r in expected]
    assert meta["count"].to_list() == [r["count"] for r in expected]
    assert meta["score"].to_list() == [r["score"] for r in expected]
    assert [json.loads(m) for m in meta["meta"]] == [r["meta"] for r in expected]
    shards = json.loads((MDS_FIXTURES / layout / "index.json").read_text())["shards"]
    assert meta["shard"].to_list() == [n for n, s in enumerate(shards) for _ in range(s["samples"])]
    assert payloads(ds) == {i: r["data"] for i, r in enumerate(expected)}
    # the same shards under the same name: the same cache, not built again
    again = drt.build(tmp_path / "cache", [src], progress=False)
    assert again.caches == ds.caches
    # only some columns
    some = drt.sources.MDS(MDS_FIXTURES / layout, name="some", data="data", columns=["label"])
    picked = drt.build(tmp_path / "some", [some], progress=False).get_metadata()
    assert {"label", "shard", "index"} <= set(picked.columns)
    assert "caption" not in picked.columns


def copy_mds(tmp_path, layout="plain"):
    out = tmp_path / f"mds-{layout}"
    shutil.copytree(MDS_FIXTURES / layout, out)
    return out, json.loads((out / "index.json").read_text())


def test_a_bad_mds_dataset_names_the_file_and_leaves_nothing(tmp_path):
    with pytest.raises(InvalidInputError, match=r"is not an MDS dataset: it has no index\.json"):
        drt.sources.MDS(tmp_path, name="m", data="data")
    with pytest.raises(InvalidInputError, match=r"has no column 'pixels'"):
        drt.sources.MDS(MDS_FIXTURES / "plain", name="m", data="pixels")
    with pytest.raises(InvalidInputError, match=r"no columns \['nope'\]"):
        drt.sources.MDS(MDS_FIXTURES / "plain", name="m", data="data", columns=["nope"])

    def refused(directory, match, name):
        src = drt.sources.MDS(directory, name=name, data="data")
        with pytest.raises(InvalidInputError, match=match):
            drt.build(tmp_path / name, [src], progress=False)
        assert not (tmp_path / name).exists() or list((tmp_path / name).iterdir()) == []

    # a raw shard cut short, or with a sample's sizes overwritten
    cut, index = copy_mds(tmp_path)
    shard = cut / index["shards"][1]["raw_data"]["basename"]
    shard.write_bytes(shard.read_bytes()[:-5])
    refused(cut, r"shard\.00001\.mds' is damaged: its offsets do not span it", "c1")
    shard.write_bytes((MDS_FIXTURES / "plain" / shard.name).read_bytes())
    body = bytearray(shard.read_bytes())
    first = int.from_bytes(body[4:8], "little")
    body[first : first + 4] = (1 << 20).to_bytes(4, "little")
    shard.write_bytes(bytes(body))
    refused(cut, r"is damaged: sample 0's column sizes disagree", "c2")
    # a compressed shard damaged, or in a compression this source lacks
    packed, index = copy_mds(tmp_path, "zstd")
    zipped = packed / index["shards"][2]["zip_data"]["basename"]
    zipped.write_bytes(zipped.read_bytes()[:-9])
    refused(packed, r"shard\.00002\.mds\.zstd' is damaged: .*decompress", "c3")
    index["shards"][0]["compression"] = "br:5"
    (packed / "index.json").write_text(json.dumps(index))
    refused(packed, r"compressed with 'br'; this source reads zstd, gz and bz2", "c4")
    # a text column that is not UTF-8
    text, index = copy_mds(tmp_path, "gz")
    index["shards"][3]["column_encodings"][5] = "str"  # 'score': float32 bytes, as text
    (text / "index.json").write_text(json.dumps(index))
    refused(text, r"sample \d+'s column 'score' \(str\) is not UTF-8", "c5")
    index["version"] = 3
    (text / "index.json").write_text(json.dumps(index))
    with pytest.raises(InvalidInputError, match="index version 3; this source reads version 2"):
        drt.sources.MDS(text, name="c6", data="data")
    # an index that lies about its columns or files (review findings): named
    # before any shard is read
    for change, match in [
        (lambda i: i["shards"][0]["column_sizes"].__setitem__(1, -2), "column 'count' has size -2"),
        (lambda i: i["shards"][0]["column_sizes"].__setitem__(1, "2"), "has size '2'"),
        (
            lambda i: i["shards"][0]["column_encodings"].__setitem__(5, "float64"),
            r"column 'score' \(float64\) has size 4, not 8",
        ),
        (
            lambda i: i["shards"][1]["raw_data"].__setitem__("basename", "/etc/hostname"),
            "is not a path inside the dataset",
        ),
        (
            lambda i: i["shards"][1]["raw_data"].__setitem__("basename", "../x.mds"),
            "is not a path inside the dataset",
        ),
        (lambda i: i["shards"][2].__setitem__("samples", -1), "sample count -1"),
        (lambda i: i["shards"].__setitem__(0, "shard"), "shard 0 is of format 'str'"),
    ]:
        index = json.loads((MDS_FIXTURES / "gz" / "index.json").read_text())
        change(index)
        (text / "index.json").write_text(json.dumps(index))
        with pytest.raises(InvalidInputError, match=match):
            drt.sources.MDS(text, name="c8", data="data")
    (text / "index.json").write_text("[1, 2]")
    with pytest.raises(InvalidInputError, match="index version None"):
        drt.sources.MDS(text, name="c9", data="data")
    # columns of its own name
    (text / "index.json").write_text(
        (MDS_FIXTURES / "gz" / "index.json").read_text().replace('"label"', '"index"')
    )
    with pytest.raises(InvalidInputError, match=r"columns \['index'\] would hide"):
        drt.sources.MDS(text, name="c7", data="data")


def test_a_hugging_face_dataset_on_disk_becomes_a_cache(tmp_path):
    """Made with `datasets` itself: an Image feature (a struct whose bytes are
    the payload), a ClassLabel and text; read from the directory and from
    the loaded dataset, which must give the same records."""
    datasets = pytest.importorskip("datasets")
    images = [os.urandom(40 + i) for i in range(60)]
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "label": datasets.ClassLabel(names=[f"c{k}" for k in range(3)]),
            "text": datasets.Value("string"),
        }
    )
    hf = datasets.Dataset.from_dict(
        {
            "image": [{"bytes": b, "path": None} for b in images],
            "label": [i % 3 for i in range(60)],
            "text": [f"caption {i}" for i in range(60)],
        },
        features=features,
    )
    hf.save_to_disk(tmp_path / "saved", max_shard_size=1 << 10, num_proc=1)  # several files
    src = drt.sources.HuggingFace(tmp_path / "saved", name="hf-v1", data="image")
    assert len(src.files) > 1
    ds = drt.build(tmp_path / "cache", [src], progress=False)
    meta = ds.get_metadata().sort("sample_id")
    assert meta["label"].to_list() == [i % 3 for i in range(60)]
    assert meta["text"].to_list() == [f"caption {i}" for i in range(60)]
    assert payloads(ds) == dict(enumerate(images))
    loaded = datasets.load_from_disk(tmp_path / "saved")
    again = drt.build(
        tmp_path / "cache2",
        [drt.sources.HuggingFace(loaded, name="hf-v1", data="image")],
        progress=False,
    )
    assert payloads(again) == payloads(ds)
    with pytest.raises(InvalidInputError, match="flatten_indices"):
        drt.sources.HuggingFace(loaded.select([0, 2]), name="x", data="image")
    with pytest.raises(InvalidInputError, match="lives in memory"):
        drt.sources.HuggingFace(hf, name="x", data="image")
    with pytest.raises(InvalidInputError, match=r"no state\.json"):
        drt.sources.HuggingFace(tmp_path, name="x", data="image")
    with pytest.raises(InvalidInputError, match="no column 'img'"):
        drt.build(tmp_path / "c3", [drt.sources.HuggingFace(loaded, name="y", data="img")])


def test_a_lance_dataset_becomes_a_cache_at_the_version_it_names(tmp_path):
    lance = pytest.importorskip("lance")
    first = rows(80)
    lance.write_dataset(first.to_arrow(), tmp_path / "ds.lance", max_rows_per_file=30)
    src = drt.sources.Lance(tmp_path / "ds.lance", name="lance-v1", data="data", batch_rows=16)
    # the Lance dataset moves on; the source keeps the version it was made at
    lance.write_dataset(rows(5, start=80).to_arrow(), tmp_path / "ds.lance", mode="append")
    ds = drt.build(tmp_path / "cache", [src], progress=False)
    assert payloads(ds) == dict(enumerate(first["data"].to_list()))
    meta = ds.get_metadata().sort("sample_id")
    assert meta["caption"].to_list() == first["caption"].to_list()
    latest = drt.sources.Lance(tmp_path / "ds.lance", name="lance-v2", data="data")
    assert len(drt.build(tmp_path / "cache", [latest], progress=False)) == 85  # both appends
    with pytest.raises(InvalidInputError, match="no Lance dataset"):
        drt.sources.Lance(tmp_path / "none.lance", name="x", data="data")


def test_what_a_source_reads_is_what_it_shows(tmp_path):
    """Review findings, pinned: a loaded dataset's slice and renamed column
    are what is cached (not its whole files); a file whose name looks like a
    glob is read as itself; a WebDataset extension is read lowercased and
    may not overwrite another column; values a population cannot hold are
    InvalidInputError."""
    datasets = pytest.importorskip("datasets")
    hf = datasets.Dataset.from_dict({"blob": [bytes([i]) * 3 for i in range(20)], "y": range(20)})
    hf.save_to_disk(tmp_path / "saved")
    loaded = datasets.load_from_disk(tmp_path / "saved").take(5).rename_column("y", "label")
    ds = drt.build(tmp_path / "c1", [drt.sources.HuggingFace(loaded, name="t", data="blob")])
    assert ds.get_metadata().sort("sample_id")["label"].to_list() == [0, 1, 2, 3, 4]
    # an Image column that names its files by path (as an imagefolder's cache
    # does): written as save_to_disk lays a dataset out, with pyarrow
    image = pa.StructArray.from_arrays(
        [pa.array([None], pa.binary()), pa.array(["/x/0.png"])], names=["bytes", "path"]
    )
    (tmp_path / "by-path").mkdir()
    table = pa.table({"image": image})
    with pa.ipc.new_stream(tmp_path / "by-path" / "data-00000-of-00001.arrow", table.schema) as w:
        w.write_table(table)
    state = {"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}
    (tmp_path / "by-path" / "state.json").write_text(json.dumps(state))
    src = drt.sources.HuggingFace(tmp_path / "by-path", name="p", data="image")
    with pytest.raises(InvalidInputError, match="names its files by path"):
        drt.build(tmp_path / "c2", [src], progress=False)

    rows(10).write_parquet(tmp_path / "x[1].parquet")
    assert len(drt.sources.Parquet(tmp_path / "x[1].parquet", name="b")) == 10

    write_shard(tmp_path / "up.tar", [("k0", {"JPG": b"abc", "CLS": b"1"})])
    src = drt.sources.WebDataset(tmp_path / "up.tar", name="u", data="jpg", metadata={"cls": int})
    up = drt.build(tmp_path / "c3", [src], progress=False)
    assert up.get_metadata()["cls"].to_list() == [1]
    with pytest.raises(InvalidInputError, match="would be column 'key'"):
        drt.sources.WebDataset(tmp_path / "up.tar", name="u", data="jpg", metadata={"key": str})

    huge = pl.DataFrame({"data": [b"a"], "id": pl.Series([1 << 63], dtype=pl.UInt64)})
    with pytest.raises(InvalidInputError, match="past the 64-bit signed integers"):
        drt.build(tmp_path / "c4", [Tables("huge", [huge])], progress=False)


def test_one_source_split_across_processes_is_the_cache_one_process_writes(tmp_path):
    """build(processes=3) of one Parquet, one WebDataset and one MDS source
    (fewer sources than processes): each is written in parts at once and
    joined; the caches hold what processes=1 writes, record for record,
    with `shard` and `index` numbered in the whole source, and no parts
    are left behind."""
    for k in range(4):
        rows(9 + k, start=100 * k).write_parquet(tmp_path / f"p{k}.parquet")
        samples = wds_samples(6 + k, start=100 * k)
        if k == 0:
            for _, members in samples:
                members.pop("txt")  # all null in the first part's column
        write_shard(tmp_path / f"w{k}.tar", samples)

    def sources():
        return [
            drt.sources.Parquet(tmp_path / "p*.parquet", name="pq"),
            drt.sources.WebDataset(
                tmp_path / "w*.tar", name="wds", data="jpg", metadata={"cls": int, "txt": str}
            ),
            drt.sources.MDS(MDS_FIXTURES / "zstd", name="mds", data="data"),
        ]

    assert [len(s.split(3)) for s in sources()] == [3, 3, 3]
    one = drt.build(tmp_path / "one", sources(), progress=False)
    for source in sources():  # one source at a time: 3 processes, 3 parts each
        drt.build(tmp_path / "many", [source], processes=3, progress=False)
    many = drt.open(tmp_path / "many")

    def cached(ds) -> tuple[pl.DataFrame, dict]:
        """Each record's metadata and payload, by (source, sample_id)."""
        names = {c["cache_id"]: c["name"] for c in ds.caches}
        meta = ds.get_metadata()
        source = pl.Series("source", [names[c] for c in meta["cache_id"]])
        meta = meta.with_columns(source).drop("cache_id").sort("source", "sample_id")
        data = {
            (names[c], s): ds.get_item(c, s).data
            for c, s in zip(
                ds.get_metadata()["cache_id"], ds.get_metadata()["sample_id"], strict=True
            )
        }
        return meta, data

    (meta_one, data_one), (meta_many, data_many) = cached(one), cached(many)
    assert data_one == data_many
    # the same columns (in the order each dataset's sources first gave them)
    assert meta_one.equals(meta_many.select(meta_one.columns))
    assert {"shard", "index", "key", "txt"} <= set(meta_many.columns)
    wds = meta_many.filter(pl.col("source") == "wds")
    assert wds["shard"].to_list() == [0] * 6 + [1] * 7 + [2] * 8 + [3] * 9
    assert wds["txt"][:6].is_null().all() and wds["txt"][6] == "t 100"
    assert sorted(c["records"] for c in many.caches) == sorted(c["records"] for c in one.caches)
    assert [p.name for p in (tmp_path / "many").iterdir() if p.name.startswith(".")] == []
    for name in ("pq", "wds", "mds"):  # written in 3 parts, joined: a shard each
        assert len(list((tmp_path / "one" / name).glob("shard-*"))) == 1
        assert len(list((tmp_path / "many" / name).glob("shard-*"))) == 3


def test_a_split_source_with_empty_files_is_built_from_the_rest(tmp_path):
    """Empty Parquet files (as Spark writes them) are parts without samples:
    processes=3 builds what processes=1 builds, and a source of empty files
    only is an error naming the source, as it is in one process."""
    rows(5).write_parquet(tmp_path / "a.parquet")
    rows(0).write_parquet(tmp_path / "b.parquet")
    rows(4, start=5).write_parquet(tmp_path / "c.parquet")
    src = drt.sources.Parquet(tmp_path / "*.parquet", name="pq")
    ds = drt.build(tmp_path / "c", [src], processes=3, progress=False)
    assert len(list((tmp_path / "c" / "pq").glob("shard-*"))) == 2  # two parts joined
    assert ds.get_metadata().sort("sample_id")["label"].to_list() == [i % 10 for i in range(9)]
    assert [p.name for p in (tmp_path / "c").iterdir() if p.name.startswith(".")] == []
    rows(0).write_parquet(tmp_path / "empty" / "x.parquet", mkdir=True)
    rows(0).write_parquet(tmp_path / "empty" / "y.parquet")
    empty = drt.sources.Parquet(tmp_path / "empty" / "*.parquet", name="none")
    with pytest.raises(InvalidInputError, match="source 'none' yielded no samples"):
        drt.build(tmp_path / "d", [empty], processes=2, progress=False)


def cut_parquet(tmp_path):
    """Three files (polars and pyarrow wrote them), the middle one cut in half."""
    rows(40).write_parquet(tmp_path / "a.parquet")
    pq.write_table(rows(40, start=40).to_arrow(), tmp_path / "b.parquet")
    rows(40, start=80).write_parquet(tmp_path / "c.parquet")
    cut = tmp_path / "b.parquet"
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    src = drt.sources.Parquet(tmp_path / "*.parquet", name="pq")
    return src, cut, [tmp_path / "a.parquet", tmp_path / "c.parquet"]


def missing_parquet(tmp_path):
    rows(5).write_parquet(tmp_path / "a.parquet")
    missing = tmp_path / "none.parquet"
    return lambda: drt.sources.Parquet([tmp_path / "a.parquet", missing], name="pq"), missing, []


def cut_tar(tmp_path):
    """Two shards tarfile wrote; the second cut inside its first member's data."""
    write_shard(tmp_path / "a.tar", wds_samples(5))
    write_shard(tmp_path / "b.tar", wds_samples(5, start=5))
    cut = tmp_path / "b.tar"
    cut.write_bytes(cut.read_bytes()[:700])
    src = drt.sources.WebDataset(tmp_path / "*.tar", name="wds", data="jpg")
    return src, cut, [tmp_path / "a.tar"]


def cut_gzip(tmp_path):
    """A gzip shard (read through tarfile) cut in half, beside a whole one."""
    import gzip

    write_shard(tmp_path / "a.tar", wds_samples(20))
    packed = gzip.compress((tmp_path / "a.tar").read_bytes())
    (tmp_path / "a.tar.gz").write_bytes(packed)
    cut = tmp_path / "b.tar.gz"
    cut.write_bytes(packed[: len(packed) // 2])
    src = drt.sources.WebDataset(tmp_path / "*.tar.gz", name="wds", data="jpg")
    return src, cut, [tmp_path / "a.tar.gz"]


def mds_wrong_count(tmp_path):
    """index.json says shard 1 holds one sample more than the whole shard
    (its own count and offsets agree) does: index.json is at fault."""
    directory, index = copy_mds(tmp_path)
    index["shards"][1]["samples"] += 1
    (directory / "index.json").write_text(json.dumps(index))
    src = drt.sources.MDS(directory, name="mds", data="data")
    others = [directory / s["raw_data"]["basename"] for s in index["shards"]]
    return src, directory / "index.json", [others[0], others[2], others[3]]


def mds_wrong_size(tmp_path):
    """index.json gives a uint16 column 8 bytes: refused before any shard is read."""
    directory, index = copy_mds(tmp_path)
    index["shards"][2]["column_sizes"][1] = 8
    (directory / "index.json").write_text(json.dumps(index))
    shards = [directory / s["raw_data"]["basename"] for s in index["shards"]]
    return (
        lambda: drt.sources.MDS(directory, name="mds", data="data"),
        directory / "index.json",
        shards,
    )


def mds_missing_shard(tmp_path):
    directory, index = copy_mds(tmp_path)
    shards = [directory / s["raw_data"]["basename"] for s in index["shards"]]
    shards[2].unlink()
    src = drt.sources.MDS(directory, name="mds", data="data")
    return src, shards[2], [shards[0], shards[1], shards[3]]


def cut_hugging_face(tmp_path):
    """A directory save_to_disk wrote in several Arrow files, one cut in half."""
    datasets = pytest.importorskip("datasets")
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"blob": [os.urandom(100) for _ in range(60)]}).save_to_disk(
        saved, max_shard_size=2000
    )
    src = drt.sources.HuggingFace(saved, name="hf", data="blob")
    files = [Path(f) for f in src.files]
    assert len(files) > 2
    files[1].write_bytes(files[1].read_bytes()[: files[1].stat().st_size // 2])
    return src, files[1], [files[0], *files[2:]]


def lance_files(tmp_path) -> list[Path]:
    """A Lance dataset pylance wrote in three fragments: their data files, in order."""
    lance = pytest.importorskip("lance")
    lance.write_dataset(rows(80).to_arrow(), tmp_path / "ds.lance", max_rows_per_file=30)
    files = [
        tmp_path / "ds.lance" / "data" / f.path
        for fragment in lance.dataset(tmp_path / "ds.lance").get_fragments()
        for f in fragment.data_files()
    ]
    assert len(files) == 3
    return files


def missing_lance_file(tmp_path):
    files = lance_files(tmp_path)
    files[1].unlink()
    src = drt.sources.Lance(tmp_path / "ds.lance", name="lance", data="data")
    return src, files[1], [files[0], files[2]]


def cut_lance_file(tmp_path):
    """Lance's error names no file here: the one shorter than its manifest says is named."""
    files = lance_files(tmp_path)
    files[1].write_bytes(files[1].read_bytes()[:-3])
    src = drt.sources.Lance(tmp_path / "ds.lance", name="lance", data="data")
    return src, files[1], [files[0], files[2]]


def overwritten_lance_file(tmp_path):
    """A data file of the right size whose footer is garbage: named by
    reading the fragments' files one at a time once the scan failed."""
    files = lance_files(tmp_path)
    body = files[1].read_bytes()
    files[1].write_bytes(body[:-40] + b"\xff" * 40)
    src = drt.sources.Lance(tmp_path / "ds.lance", name="lance", data="data")
    return src, files[1], [files[0], files[2]]


@pytest.mark.parametrize(
    "damage",
    [
        cut_parquet,
        missing_parquet,
        cut_tar,
        cut_gzip,
        mds_wrong_count,
        mds_wrong_size,
        mds_missing_shard,
        cut_hugging_face,
        missing_lance_file,
        cut_lance_file,
        overwritten_lance_file,
    ],
)
def test_an_import_error_about_a_file_names_it_as_its_path(tmp_path, damage):
    """docs/guarantees.md: an error about a file carries it as `.path`, and
    says which (of a source of several, only the damaged one); nothing is
    published. A source's error reaches build() whole from its reading
    thread."""
    (tmp_path / "in").mkdir()
    made, damaged, intact = damage(tmp_path / "in")
    with pytest.raises(InvalidInputError) as info:
        source = made() if callable(made) else made
        drt.build(tmp_path / "cache", [source], progress=False)
    assert info.value.path == str(damaged)
    assert str(damaged) in str(info.value)
    for path in intact:
        assert str(path) not in str(info.value)
    assert not (tmp_path / "cache").exists() or list((tmp_path / "cache").iterdir()) == []
