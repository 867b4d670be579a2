"""PyTorch DataLoader workers under spawn and fork deliver one global sequence."""

from __future__ import annotations

import gc

import polars as pl
import pytest

import datasetrt as drt
from conftest import Source, source_of

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

# three workers on a two-core machine are what we want to test
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def collect(tds, workers: int, method: str | None):
    kwargs = {"multiprocessing_context": method} if workers else {}
    loader = DataLoader(tds, batch_size=None, num_workers=workers, **kwargs)
    return [(b["cache_id"].tolist(), b["sample_id"].tolist(), b["data"]) for b in loader]


@pytest.mark.parametrize("method", ["spawn", "fork"])
@pytest.mark.parametrize("workers", [1, 3])
def test_dataloader_workers_deliver_the_single_process_sequence(two_caches, method, workers):
    ds, _, sources = two_caches
    ds.update_metadata(ds.get_metadata().head(650))
    tds = ds.to_torch(batch_size=50, seed=4, epoch=1)
    single = collect(tds, 0, None)
    assert len(single) == len(tds) == 13
    assert collect(tds, workers, method) == single
    by_id = {c["cache_id"]: next(s for s in sources if s.name == c["name"]) for c in ds.caches}
    for cids, sids, datas in single:
        assert datas == [by_id[c].payload(s) for c, s in zip(cids, sids, strict=True)]


def test_the_torch_dataset_keeps_its_snapshot_and_epoch(two_caches):
    ds, _, _ = two_caches
    tds = ds.to_torch(batch_size=100, seed=4)
    ds.update_metadata(ds.get_metadata().head(5))
    assert sum(len(datas) for _, _, datas in collect(tds, 2, "fork")) == 800
    first = collect(tds, 0, None)
    tds.set_epoch(1)
    assert collect(tds, 0, None) != first


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_a_corrupt_record_raises_from_inside_a_dataloader_worker(tmp_path, method):
    src = Source("fragile-v1", 64, payload=lambda i: bytes([i]) * 512)
    ds = drt.build(tmp_path, [src], codec="none", progress=False)
    meta = ds.get_metadata()
    ds.update_metadata(pl.concat([meta.filter(pl.col("sample_id") == 7)] * 64))
    shard = tmp_path / "fragile-v1" / "shard-00000.drts"
    raw = bytearray(shard.read_bytes())
    raw[16 + 512 * 7 + 100] ^= 0x01
    shard.write_bytes(bytes(raw))
    tds = drt.open(tmp_path).to_torch(batch_size=16, seed=0)
    # one worker: with two, the second (spawned) could still be starting when
    # the first one's error shuts the loader down, and die of it (exit 1),
    # which torch reports as an unraisable error wherever it is collected
    batches = iter(DataLoader(tds, batch_size=None, num_workers=1, multiprocessing_context=method))
    try:
        next(batches)
    except drt.CorruptCacheError as exc:
        # the message only: the exception's traceback holds the iterator, and
        # kept it alive until a later collection shut its workers down in
        # another test (an unraisable error there)
        error = str(exc)
    else:
        pytest.fail("a corrupt record was delivered")
    finally:
        del batches  # shut the worker down before the next test
        gc.collect()  # now, not in a later test (the raise left frames in a cycle)
    assert "sample 7" in error and "shard-00000.drts" in error


# -- code in a worker needs no thread pool made before the fork ------------------
# Polars' (rayon's) pool, once the parent has used it, has no threads in a
# forked child: anything a worker does with a batch that waits on it hangs.
# A batch's metadata is gathered by the engine and only wrapped by polars.
START_METHODS = ["fork", "spawn", "forkserver"]


def rows_seen(batch):
    """What a worker's transform reads of a batch: identities, snapshots,
    and the metadata's columns."""
    meta = batch.metadata
    return {
        "sample_id": batch.sample_id,
        "snapshot": batch.snapshots,
        "source": meta["source"].to_list(),
        "weight": meta["weight"].to_list(),
        "meta_sample_id": meta["sample_id"].to_list(),
    }


def the_batch(batch):
    return batch


def use_polars_pool(ds) -> None:
    """Make the parent's polars thread pool exist (a grouped count runs on it)."""
    frame = ds.get_metadata()
    assert frame.group_by("source").len().height == 3
    assert frame.sort("weight", descending=True).height == frame.height


def weights_by_snapshot(ds, numbers):
    return {
        n: dict(zip(*ds.get_metadata(n).select("sample_id", "weight"), strict=True))
        for n in numbers
    }


def assert_rows_are_their_snapshots(ds, seen):
    numbers = {n for s in seen for n in s["snapshot"]}
    weights = weights_by_snapshot(ds, numbers)
    for s in seen:
        assert s["meta_sample_id"] == s["sample_id"]
        assert s["source"] == [source_of(i) for i in s["sample_id"]]
        expected = [weights[n][i] for n, i in zip(s["snapshot"], s["sample_id"], strict=True)]
        assert s["weight"] == expected


@pytest.mark.timeout(240)
@pytest.mark.parametrize("method", START_METHODS)
def test_workers_read_batch_metadata_through_a_mixture_change_and_a_reweight(mixed, method):
    """After the parent used polars, workers of every start method read
    `batch.metadata` in a transform while the run follows the head: a new
    mixture and a reweight committed during the epoch reach later batches,
    and each row's metadata is its own snapshot's."""
    mixed.set_mixture("source", {"web": 1, "code": 1})
    use_polars_pool(mixed)
    first = mixed.version
    tds = mixed.to_torch(
        8,
        seed=3,
        epoch_len=400,
        sampling="permutation",
        run=f"fork-safety-{method}",
        follow="head",
        prefetch_batches=1,
        transform=rows_seen,
    )
    loader = DataLoader(
        tds,
        batch_size=None,
        num_workers=2,
        multiprocessing_context=method,
        prefetch_factor=1,
        timeout=60,
    )
    batches = iter(loader)
    seen = [next(batches) for _ in range(3)]
    mixed.set_mixture("source", {"web": 3, "code": 1})
    meta = mixed.get_metadata()
    reweighted = mixed.update_metadata(meta.with_columns(pl.col("weight") * 2 + 1))
    seen += list(batches)
    assert sum(len(s["sample_id"]) for s in seen) == 400
    numbers = [n for s in seen for n in s["snapshot"]]
    assert numbers[0] == first and numbers[-1] == reweighted
    assert_rows_are_their_snapshots(mixed, seen)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("method", START_METHODS)
def test_a_batch_cut_by_a_change_has_each_rows_metadata_in_a_worker(mixed, method):
    """A reader of a run with another batch size than the one that placed
    a change gets a batch of rows from two snapshots; its metadata, read in
    a worker forked after polars ran (or sent back pickled), joins them."""
    mixed.set_mixture("source", {"web": 1, "code": 1})
    run = f"cut-{method}"
    placer = mixed.loader(8, seed=3, epoch_len=240, sampling="permutation", run=run)
    next(placer)
    after = mixed.set_mixture("source", {"web": 3, "code": 1})
    numbers = [n for b in placer for n in b.snapshots]
    change = numbers.index(after) + 8
    size = next(s for s in (5, 7, 9, 11) if change % s)
    use_polars_pool(mixed)
    tds = mixed.to_torch(
        size, seed=3, epoch_len=240, sampling="permutation", run=run, transform=rows_seen
    )
    kwargs = {"multiprocessing_context": method, "timeout": 60}
    seen = list(DataLoader(tds, batch_size=None, num_workers=2, **kwargs))
    assert any(len(set(s["snapshot"])) == 2 for s in seen)
    assert_rows_are_their_snapshots(mixed, seen)
    # a batch sent back whole: its metadata travels with it
    tds.transform = the_batch
    whole = list(DataLoader(tds, batch_size=None, num_workers=1, **kwargs))
    cut = next(b for b in whole if len(set(b.snapshots)) == 2)
    assert isinstance(cut.metadata, pl.DataFrame)
    assert cut.metadata["sample_id"].to_list() == cut.sample_id
    assert [s.metadata["sample_id"] for s in cut] == cut.sample_id
