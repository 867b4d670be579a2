"""The seed workflow: build, query, reweight, read — payload files never change."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import polars as pl
import pytest

import datasetrt as drt
from conftest import Source, payload_digest, run_child


def test_metadata_has_identity_attributes_and_unit_weight(two_caches):
    ds, _, _ = two_caches
    meta = ds.get_metadata()
    assert meta.columns == ["cache_id", "sample_id", "label", "split", "quality", "weight"]
    assert meta.height == 800 == len(ds)
    assert meta["weight"].to_list() == [1.0] * 800
    by_cache = {c["name"]: c for c in ds.caches}
    assert by_cache["alpha-v1"]["records"] == 500
    counts = meta.group_by("cache_id").len().sort("cache_id")
    assert sorted(counts["len"].to_list()) == [300, 500]


def test_counts_by_label_agree_between_sql_and_polars(two_caches):
    ds, _, _ = two_caches
    sql = ds.sql("SELECT label, count(*) AS n FROM metadata GROUP BY label ORDER BY label")
    pol = ds.get_metadata().group_by("label").agg(pl.len().alias("n")).sort("label")
    assert sql["label"].to_list() == list(range(10))
    assert sql["n"].to_list() == pol["n"].cast(pl.Int64).to_list() == [80] * 10


def test_train_quality_filter_becomes_the_population(two_caches):
    ds, root, _ = two_caches
    before = payload_digest(root)
    meta = ds.get_metadata()
    sel = meta.filter((pl.col("split") == "train") & (pl.col("quality") >= 0.8))
    version = ds.update_metadata(sel)
    assert version == 1 == ds.version
    assert len(ds) == sel.height > 0
    got = ds.get_metadata()
    assert got.select("cache_id", "sample_id").rows() == sel.select("cache_id", "sample_id").rows()
    assert (got["quality"] >= 0.8).all() and (got["split"] == "train").all()
    assert payload_digest(root) == before


def test_sql_select_equals_the_polars_filter(two_caches):
    ds, root, _ = two_caches
    before = payload_digest(root)
    expected = ds.get_metadata().filter((pl.col("split") == "train") & (pl.col("quality") >= 0.8))
    ds.select("SELECT * FROM metadata WHERE split = 'train' AND quality >= 0.8")
    got = ds.get_metadata().sort("cache_id", "sample_id")
    assert (
        got.select("cache_id", "sample_id").rows()
        == expected.sort("cache_id", "sample_id").select("cache_id", "sample_id").rows()
    )
    assert payload_digest(root) == before


def test_head_100_dev_subset(two_caches):
    ds, root, _ = two_caches
    before = payload_digest(root)
    sel = ds.get_metadata().filter(pl.col("split") == "train")
    ds.update_metadata(sel.head(100))
    assert len(ds) == 100
    assert (
        ds.get_metadata().select("cache_id", "sample_id").rows()
        == sel.head(100).select("cache_id", "sample_id").rows()
    )
    assert payload_digest(root) == before


def test_inverse_frequency_weights_are_stored_and_balance_classes(two_caches):
    ds, root, _ = two_caches
    before = payload_digest(root)
    meta = ds.get_metadata().filter(pl.col("label") < 3)
    meta = pl.concat([meta, meta.filter(pl.col("label") == 0)])  # label 0 twice as frequent
    balanced = meta.with_columns((1.0 / pl.len().over("label")).alias("weight"))
    ds.update_metadata(balanced)
    per_label = ds.sql("SELECT label, sum(weight) AS w FROM metadata GROUP BY label ORDER BY label")
    assert per_label["w"].to_list() == pytest.approx([1.0, 1.0, 1.0])
    assert payload_digest(root) == before


def test_update_keeps_extra_columns_and_get_item_shows_the_active_row(two_caches):
    ds, _, sources = two_caches
    meta = ds.get_metadata()
    cid, sid = meta["cache_id"][7], meta["sample_id"][7]
    ds.update_metadata(
        meta.with_columns((pl.col("quality") * 2).alias("quality"), pl.lit("hard").alias("tag"))
    )
    s = ds.get_item(cid, sid)
    src = next(
        x for x in sources if x.name == next(c["name"] for c in ds.caches if c["cache_id"] == cid)
    )
    assert s.data == src.payload(sid)
    assert s.cache_id == cid and s.sample_id == sid
    assert s.metadata["tag"] == "hard"
    assert s.metadata["quality"] == pytest.approx(2 * src.meta(sid)["quality"])
    # a stored sample outside the population still reads, without metadata
    ds.update_metadata(ds.get_metadata().filter(pl.col("sample_id") != sid))
    assert ds.get_item(cid, sid).metadata is None
    assert ds.get_item(cid, sid).data == src.payload(sid)


def test_iter_draws_len_samples_deterministically_and_returns_written_bytes(two_caches):
    ds, _, sources = two_caches
    names = {c["cache_id"]: c["name"] for c in ds.caches}
    by_name = {s.name: s for s in sources}
    first = [(s.cache_id, s.sample_id) for s in ds.iter(seed=7)]
    assert len(first) == len(ds)
    assert first == [(s.cache_id, s.sample_id) for s in ds.iter(seed=7)]
    assert first != [(s.cache_id, s.sample_id) for s in ds.iter(seed=8)]
    assert first != [(s.cache_id, s.sample_id) for s in ds.iter(seed=7, epoch=1)]
    for s in ds.iter(seed=3, batch_size=64):
        assert s.data == by_name[names[s.cache_id]].payload(s.sample_id)
        assert s.metadata["sample_id"] == s.sample_id


def test_zero_weight_rows_are_never_drawn(two_caches):
    ds, _, _ = two_caches
    meta = ds.get_metadata()
    ds.update_metadata(
        meta.with_columns(pl.when(pl.col("label") == 4).then(1.0).otherwise(0.0).alias("weight"))
    )
    labels = {pickle.loads(s.data)["i"] % 10 for s in ds.iter(seed=1)}
    assert labels == {4}


def test_an_iterator_keeps_the_snapshot_it_started_with(two_caches):
    ds, _, _ = two_caches
    it = ds.iter(seed=5, batch_size=10)
    next(it)
    ds.update_metadata(ds.get_metadata().head(3))
    assert sum(1 for _ in it) == 799


def test_duplicated_rows_are_part_of_the_population(two_caches):
    ds, _, _ = two_caches
    meta = ds.get_metadata().head(10)
    ds.update_metadata(pl.concat([meta, meta, meta]))
    assert len(ds) == 30


def test_reopen_sees_the_newest_snapshot_and_stable_cache_ids(two_caches):
    ds, root, _ = two_caches
    ids = {c["name"]: c["cache_id"] for c in ds.caches}
    ds.update_metadata(ds.get_metadata().head(42))
    again = drt.open(root)
    assert len(again) == 42 and again.version == ds.version
    reordered = drt.open([root / "beta-v1", root / "alpha-v1"])
    assert {c["name"]: c["cache_id"] for c in reordered.caches} == ids
    assert len(reordered) == 42


def test_build_reuses_a_published_cache_by_source_name(tmp_path):
    src = Source("reuse-v1", 20)
    drt.build(tmp_path, [src], progress=False)
    ds = drt.build(tmp_path, [src], progress=False)
    assert src.iterations == 1
    assert len(ds) == 20


def test_same_source_name_in_two_roots_does_not_collide(tmp_path):
    a = drt.build(tmp_path / "a", [Source("same-v1", 10)], progress=False)
    b = drt.build(tmp_path / "b", [Source("same-v1", 15)], progress=False)
    both = drt.open([tmp_path / "a" / "same-v1", tmp_path / "b" / "same-v1"])
    assert len(both) == 25
    assert a.caches[0]["cache_id"] != b.caches[0]["cache_id"]


@pytest.mark.parametrize("codec", ["zstd", "lz4", "none"])
def test_every_codec_and_many_shards_round_trip(tmp_path: Path, codec):
    big = Source("big-v1", 60, payload=lambda i: bytes([i % 251]) * (1000 + i))
    ds = drt.build(tmp_path, [big], codec=codec, shard_bytes=256, progress=False)
    shards = list((tmp_path / "big-v1").glob("shard-*.drts"))
    assert len(shards) > 1
    for i in range(60):
        assert ds.get_item(ds.caches[0]["cache_id"], i).data == big.payload(i)
    total = sum(p.stat().st_size for p in shards)
    if codec == "none":
        assert total >= sum(1000 + i for i in range(60))
    else:
        assert total < sum(1000 + i for i in range(60)) / 10


def test_sources_may_yield_plain_tuples_and_bytes_like_data(tmp_path):
    class Pairs:
        name = "pairs-v1"

        def __iter__(self):
            yield bytearray(b"ab"), {"k": 1}
            yield memoryview(b"cd"), {"k": 2}

    ds = drt.build(tmp_path, [Pairs()], progress=False)
    cid = ds.caches[0]["cache_id"]
    assert [ds.get_item(cid, i).data for i in range(2)] == [b"ab", b"cd"]


def test_sources_without_metadata_get_identity_and_weight_only(tmp_path):
    class Bare:
        name = "bare-v1"

        def __iter__(self):
            for i in range(5):
                yield drt.CacheInput(bytes([i]))

    ds = drt.build(tmp_path, [Bare()], progress=False)
    assert ds.get_metadata().columns == ["cache_id", "sample_id", "weight"]


def test_a_dataset_pickles_by_recipe(two_caches):
    ds, _, _ = two_caches
    ds.update_metadata(ds.get_metadata().head(7))
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.version == ds.version and len(clone) == 7
    ds.update_metadata(ds.get_metadata().head(3))
    assert len(pickle.loads(pickle.dumps(clone))) == 7


def test_update_accepts_any_arrow_stream_and_lazy_frames(two_caches):
    ds, _, _ = two_caches

    class Stream:
        def __init__(self, df):
            self.df = df

        def __arrow_c_stream__(self, requested_schema=None):
            return self.df.__arrow_c_stream__(requested_schema)

    ds.update_metadata(Stream(ds.get_metadata().head(5)))
    assert len(ds) == 5
    ds.update_metadata(ds.get_metadata().lazy().head(2))
    assert len(ds) == 2


def stored_columns(ds: drt.Dataset) -> dict[str, set[str]]:
    """The active snapshot's column files by column name (one per
    partition, or fewer where partitions hold equal columns)."""
    files: dict[str, set[str]] = {}
    for line in ds.snapshot_path.read_text().splitlines():
        if line.startswith("column="):
            hash_, _crc, _len, name = line[len("column=") :].split(" ", 3)
            files.setdefault(name, set()).add(f"{hash_}.arrow")
    return files


def test_a_reweight_stores_only_the_new_weight_column(two_caches):
    """However the population is cut into partitions: a reweight writes
    weight column files and nothing else, a new column its own files."""
    ds, _, _ = two_caches
    columns = ds.snapshot_path.parent / "columns"
    names = lambda: {p.name for p in columns.glob("*.arrow")}  # noqa: E731
    before = names()
    meta = ds.get_metadata()
    ds.update_metadata(meta.with_columns((1.0 / pl.len().over("label")).alias("weight")))
    reweighted = stored_columns(ds)
    assert names() - before == reweighted["weight"]
    assert set().union(*(f for n, f in reweighted.items() if n != "weight")) <= before
    ds.update_metadata(meta.with_columns(pl.lit("x").alias("tag")))
    tagged = stored_columns(ds)
    # the tag's files; the weights of 1.0 are those the build stored
    assert names() - before == reweighted["weight"] | tagged["tag"]
    assert tagged["weight"] <= before


PUBLISH_CHILD = r"""
import json, os, sys
from pathlib import Path
import polars as pl
import datasetrt as drt

class Small:
    name = "small"
    def __len__(self):
        return 1000
    def __iter__(self):
        for i in range(1000):
            yield i.to_bytes(4, "little"), {"label": i % 7}

def peak_mib():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024

ds = drt.build(sys.argv[1], [Small()], progress=False)
base = ds.get_metadata()
rows = int(sys.argv[2])
frame = pl.concat([base] * (rows // base.height), rechunk=False)  # shares base's buffers
Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from here
before = peak_mib()
ds.update_metadata(frame)
print(json.dumps({"rows": len(ds), "partitions": int(ds.history()["partitions"][-1]),
                  "grew_mib": peak_mib() - before}))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_an_update_holds_a_few_partitions_not_a_copy_of_the_population(tmp_path):
    """A population given in many pieces (a concatenation, a filter's result)
    is cut into partitions a few at a time: the update holds its input and
    those, never a copy of every row. Before, every partition was made first
    (4 x 10^6 rows of four columns here: 148 MiB more at the peak; at 10^9
    rows 32 GB, more than the machine the scale benchmark runs on)."""
    rows = 4_000_000
    env = {**os.environ, "DATASETRT_PARTITION_ROWS": str(1 << 16)}
    out = run_child(PUBLISH_CHILD, tmp_path / "root", rows, env=env)
    got = json.loads(out.splitlines()[-1])
    assert got["rows"] == rows and got["partitions"] == -(-rows // (1 << 16)), got
    # a window of partitions of 2^16 rows is about 2 MiB; the copy was 148
    assert got["grew_mib"] < 40, got


def test_history_names_each_snapshot_and_fingerprints_identify_populations(two_caches):
    ds, _, _ = two_caches
    first = ds.fingerprint
    ds.update_metadata(ds.get_metadata().head(10))
    ds.select("SELECT * FROM metadata WHERE label = 3")
    assert ds.fingerprint != first
    history = ds.history()
    assert history["version"].to_list() == [0, 1, 2]
    assert history["rows"].to_list() == [800, 10, 1]
    assert history["note"].to_list() == [
        "every stored sample",
        "update_metadata",
        "select: SELECT * FROM metadata WHERE label = 3",
    ]
    assert history["fingerprint"][0] == first
    ds.checkout(0)
    assert ds.fingerprint == first and len(ds) == 800
    ds.update_metadata(ds.get_metadata())
    assert ds.version == 3 and ds.fingerprint == first


class Squares:
    """A source that pickles (build processes need that): sample i is i*i,
    written with the id of the process that wrote it; ``fail_at`` raises
    there; ``meet`` (a barrier) is waited on before the first sample, so two
    sources can only both finish when they run at the same time."""

    def __init__(self, name: str, n: int, fail_at: int | None = None, meet=None):
        self.name, self.n, self.fail_at, self.meet = name, n, fail_at, meet

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        if self.meet is not None:
            self.meet.wait(timeout=120)
        for i in range(self.n):
            if i == self.fail_at:
                raise ValueError(f"{self.name}: sample {i} cannot be made")
            yield drt.CacheInput(pickle.dumps(i * i), {"label": i % 3, "pid": os.getpid()})


def test_build_in_processes_writes_what_one_process_writes(tmp_path):
    import multiprocessing

    with multiprocessing.get_context("spawn").Manager() as manager:
        meet = manager.Barrier(2)  # two sources at a time, or a BrokenBarrierError
        sources = [Squares(f"sq-{k}-v1", 40 + k, meet=meet) for k in range(4)]
        many = drt.build(tmp_path / "many", sources, processes=2, progress=False)
    one = drt.build(tmp_path / "one", [Squares(s.name, s.n) for s in sources], progress=False)

    def rows(ds):
        names = {c["cache_id"]: c["name"] for c in ds.caches}
        frame = ds.get_metadata().with_columns(
            name=pl.col("cache_id").replace_strict(names, return_dtype=pl.String)
        )
        return frame.select("name", "sample_id", "label").sort("name", "sample_id")

    assert rows(many).equals(rows(one))
    assert {pickle.loads(s.data) for s in many.iter(seed=1)} <= {i * i for i in range(43)}
    for c in many.caches:
        item = many.get_item(c["cache_id"], 5)
        assert pickle.loads(item.data) == 25
    # written by other processes than this one
    assert os.getpid() not in set(many.get_metadata()["pid"].to_list())


def test_build_processes_partition_their_caches_and_the_first_open_links_them(
    tmp_path, monkeypatch
):
    """A cache of half a partition's rows or more is a group of its own in
    every set of caches: the build process that wrote it writes its
    partitions too, and the first open links them instead of writing them."""
    monkeypatch.setenv("DATASETRT_PARTITION_ROWS", "16")
    sources = [Squares(f"sq-{k}-v1", 20 + k) for k in range(3)] + [Squares("small-v1", 3)]
    ds = drt.build(tmp_path, sources, processes=2, progress=False)
    parts = tmp_path / "_snapshots" / "parts" / "columns"
    prepared = {p.name: p.stat().st_ino for p in parts.glob("*.arrow")}
    assert len(prepared) >= 3 * 5, prepared  # cache_id of each partition, ...
    linked = {
        p.name: p.stat().st_ino for p in (ds.snapshot_path.parent / "columns").glob("*.arrow")
    }
    assert {n: linked.get(n) for n in prepared} == prepared
    fresh = drt.open(tmp_path, snapshot_dir=tmp_path / "elsewhere")
    assert ds.fingerprint == fresh.fingerprint
    assert ds.get_metadata().equals(fresh.get_metadata())


def test_a_failed_source_in_a_build_process_is_raised_here_and_build_again_writes_the_rest(
    tmp_path,
):
    good, bad = Squares("good-v1", 20), Squares("bad-v1", 20, fail_at=7)
    with pytest.raises(ValueError, match="bad-v1: sample 7"):
        drt.build(tmp_path, [good, bad], processes=2, progress=False)
    assert not (tmp_path / "bad-v1").exists()  # nothing half written is published
    ds = drt.build(tmp_path, [good, Squares("bad-v1", 20)], processes=2, progress=False)
    assert len(ds) == 40


def test_build_processes_need_sources_that_pickle(tmp_path):
    with pytest.raises(drt.InvalidInputError, match="cannot be sent to a build process"):
        drt.build(tmp_path, [Source("lambdas-v1", 3)], processes=2, progress=False)
    with pytest.raises(drt.InvalidInputError, match="processes"):
        drt.build(tmp_path, [Squares("sq-v1", 3)], processes=0, progress=False)
    assert not any(tmp_path.iterdir())
