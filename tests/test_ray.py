"""Ray Data: ``ds.to_ray(...)`` yields the loader's sequence from parallel read
tasks, and ``drt.build_ray`` caches a Ray dataset, one cache per block."""

from __future__ import annotations

import os
import pickle

import polars as pl
import pytest

import datasetrt as drt

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

pytestmark = [pytest.mark.ray, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

BS = 25


@pytest.fixture(scope="module")
def cluster():
    """A local two-CPU Ray cluster for this module, shut down after it."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=200 << 20,
        log_to_driver=False,
        configure_logging=False,
    )
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    yield
    ray.shutdown()


def loader_rows(ds, **kw) -> list[tuple[int, int, bytes]]:
    return [
        (c, s, d)
        for b in ds.loader(BS, rank=0, world_size=1, **kw)
        for c, s, d in zip(b.cache_id, b.sample_id, b.data, strict=True)
    ]


def ray_rows(rds) -> list[tuple[int, int, bytes]]:
    out = []
    for t in rds.iter_batches(batch_size=64, batch_format="pyarrow"):
        out += zip(
            t["cache_id"].to_pylist(),
            t["sample_id"].to_pylist(),
            t["data"].to_pylist(),
            strict=True,
        )
    return out


@pytest.mark.parametrize("sampling", ["replacement", "permutation"])
def test_to_ray_yields_what_the_loader_yields_on_one_machine(cluster, two_caches, sampling):
    ds, _, _ = two_caches
    ds.update_metadata(ds.get_metadata().head(790))  # 31.6 batches: a partial last one
    rds = ds.to_ray(batch_size=BS, seed=3, epoch=1, sampling=sampling, override_num_blocks=5)
    expected = loader_rows(ds, seed=3, epoch=1, sampling=sampling)
    assert len(expected) == 790
    assert ray_rows(rds) == expected
    assert rds.count() == 790
    # the metadata columns travel with the samples, as in the population
    table = ray.data.Dataset.to_arrow_refs(rds)
    frame = pl.concat([pl.from_arrow(ray.get(t)) for t in table])
    meta = ds.get_metadata()
    assert frame.columns == [*meta.columns, "data"]
    first = meta.filter(
        (pl.col("cache_id") == expected[0][0]) & (pl.col("sample_id") == expected[0][1])
    )
    assert frame.row(0, named=True)["label"] == first["label"][0]


def test_each_read_task_reads_a_contiguous_range_of_the_sequence(two_caches):
    from datasetrt.ray import DrawsDatasource

    ds, _, _ = two_caches  # 800 rows: 32 loader batches of 25
    spec = ds.loader_spec(BS, seed=9, sampling="balanced", threads=1, prefetch_bytes=1 << 20)
    source = DrawsDatasource(ds, spec)
    tasks = source.get_read_tasks(6)
    assert len(tasks) == 6
    expected = loader_rows(ds, seed=9, sampling="balanced")
    got = []
    for task in pickle.loads(pickle.dumps(tasks)):  # as Ray ships them to workers
        rows = [
            r
            for t in task()
            for r in zip(
                t["cache_id"].to_pylist(),
                t["sample_id"].to_pylist(),
                t["data"].to_pylist(),
                strict=True,
            )
        ]
        assert len(rows) == task.metadata.num_rows
        got += rows
    assert got == expected
    assert len(source.get_read_tasks(1000)) == 32  # never more tasks than loader batches


def test_to_ray_keeps_its_snapshot_and_checks_arguments_before_any_task(cluster, two_caches):
    ds, _, _ = two_caches
    rds = ds.to_ray(batch_size=BS, seed=3, sampling="permutation")
    expected = loader_rows(ds, seed=3, sampling="permutation")
    ds.update_metadata(ds.get_metadata().head(10))
    assert ray_rows(rds) == expected
    with pytest.raises(drt.InvalidInputError):
        ds.to_ray(batch_size=0, seed=3)
    with pytest.raises(drt.InvalidInputError):
        ds.to_ray(batch_size=BS, seed=3, sampling="no-such-mode")
    # one process reads the epoch and Ray splits it: no ranks, runs or resume
    with pytest.raises(drt.InvalidInputError, match="rank 0 of 1"):
        ds.to_ray(batch_size=BS, seed=3, world_size=2)
    with pytest.raises(drt.InvalidInputError, match="no run"):
        ds.to_ray(batch_size=BS, seed=3, run="r1")


def items(n: int) -> list[dict]:
    return [
        {"data": pickle.dumps({"i": i}), "label": i % 3, "tag": f"t{i % 4}", "q": i / n, "i": i}
        for i in range(n)
    ]


def test_build_ray_writes_one_cache_per_block_and_reuses_them_by_name(cluster, tmp_path):
    rds = ray.data.from_items(items(300), override_num_blocks=4)
    ds = drt.build_ray(tmp_path, rds, name="items-v1", metadata_columns=["label", "tag", "q", "i"])
    caches = ds.caches
    assert sorted(c["name"] for c in caches) == [f"items-v1-{i:05d}-of-00004" for i in range(4)]
    assert sum(c["records"] for c in caches) == len(ds) == 300
    meta = ds.get_metadata()
    assert meta.schema["label"] == pl.Int64 and meta.schema["tag"] == pl.String
    assert sorted(meta["i"].to_list()) == list(range(300))
    for row in meta.sample(20, seed=1).iter_rows(named=True):
        sample = ds.get_item(row["cache_id"], row["sample_id"])
        assert pickle.loads(sample.data) == {"i": row["i"]}
        assert sample.metadata["tag"] == f"t{row['i'] % 4}"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ray-")]  # staging removed
    assert {c["cache_id"] for c in drt.open(tmp_path).caches} == {c["cache_id"] for c in caches}

    def boom(row):
        raise AssertionError("a reused build must not run the Ray dataset")

    again = drt.build_ray(tmp_path, rds.map(boom), name="items-v1", metadata_columns=["label"])
    assert [c["cache_id"] for c in again.caches] == [c["cache_id"] for c in caches]

    # and the built dataset reads back through Ray in the loader's order
    assert ray_rows(ds.to_ray(batch_size=BS, seed=1, override_num_blocks=3)) == loader_rows(
        ds, seed=1
    )


def test_build_ray_refuses_bad_columns_and_half_published_parts(cluster, tmp_path):
    rds = ray.data.from_items(items(40), override_num_blocks=2)
    with pytest.raises(drt.InvalidInputError, match="no column 'nope'"):
        drt.build_ray(tmp_path, rds, name="x-v1", metadata_columns=["nope"])
    with pytest.raises(drt.InvalidInputError, match="reserved"):
        drt.build_ray(tmp_path, rds, name="x-v1", metadata_columns=["weight"])
    with pytest.raises(drt.InvalidInputError, match="must hold bytes"):
        drt.build_ray(tmp_path, rds, name="x-v1", data_column="tag")
    assert not list(tmp_path.iterdir())  # nothing published, no staging left

    drt.build_ray(tmp_path, rds, name="x-v1")
    part = tmp_path / "x-v1-00001-of-00002"
    part.rename(tmp_path / ".hidden")  # as if a build stopped while moving parts in
    with pytest.raises(drt.InvalidInputError, match="only some parts"):
        drt.build_ray(tmp_path, rds, name="x-v1")


def test_to_ray_reads_a_dataset_in_a_bucket(cluster, bucket, tmp_path):
    """Read tasks reopen a bucket dataset in their own processes (options and
    cache directory travel with it) and yield the loader's sequence."""
    from conftest import Source

    url, options, _, _ = bucket
    sources = [Source("alpha-v1", 120), Source("beta-v1", 80)]
    ds = drt.build(
        url, sources, storage_options=options, cache_dir=tmp_path / "cache", progress=False
    )
    rds = ds.to_ray(batch_size=BS, seed=2, sampling="permutation", override_num_blocks=3)
    expected = loader_rows(ds, seed=2, sampling="permutation")
    assert len(expected) == 200
    assert ray_rows(rds) == expected
