"""PyTorch DataLoader workers under spawn and fork deliver one global sequence."""

from __future__ import annotations

import gc

import pytest

import datasetrt as drt
from conftest import Source

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
    import polars as pl

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
