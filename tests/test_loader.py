"""The loader: one native call per batch, the same global sequence however the
work is split over processes, bounded read-ahead, errors that surface."""

from __future__ import annotations

import mmap
import multiprocessing as mp
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

import datasetrt as drt
from conftest import Source, run_child


def identities(batches) -> list[tuple[int, int]]:
    return [(c, s) for b in batches for c, s in zip(b.cache_id, b.sample_id, strict=True)]


def test_batches_hold_the_written_bytes_and_the_active_rows(two_caches):
    ds, _, sources = two_caches
    by_id = {c["cache_id"]: next(s for s in sources if s.name == c["name"]) for c in ds.caches}
    batches = list(ds.loader(batch_size=64, seed=3))
    assert [len(b) for b in batches] == [64] * 12 + [32]
    for b in batches:
        assert b.data == [by_id[c].payload(s) for c, s in zip(b.cache_id, b.sample_id, strict=True)]
        assert b.metadata["sample_id"].to_list() == b.sample_id
    assert identities(batches) == [(s.cache_id, s.sample_id) for s in ds.iter(seed=3)]


def test_drop_last_drops_the_partial_batch(two_caches):
    ds, _, _ = two_caches
    assert [len(b) for b in ds.loader(batch_size=300, seed=1, drop_last=True)] == [300, 300]


def test_explain_shows_the_loader_plan(two_caches):
    ds, _, _ = two_caches
    loader = ds.loader(batch_size=16, seed=1, threads=2)
    plan = loader.explain()
    assert "PayloadTakeExec: caches=2, columns=[data], unmatched=Error, concurrency=2" in plan
    assert "SampleExec: snapshot=0" in plan and "seed=1" in plan
    assert plan.index("PayloadTakeExec") < plan.index("SampleExec")
    sum(len(b) for b in loader)
    metrics = loader.metrics()
    assert "output_rows=800" in metrics and "payload_bytes=" in metrics
    # the source node counts its draws and the time its alias table took
    sample = next(line for line in metrics.splitlines() if "SampleExec" in line)
    assert "output_rows=800" in sample and "sampler_build_time=" in sample, sample


def test_a_loader_keeps_its_snapshot(two_caches):
    ds, _, _ = two_caches
    loader = ds.loader(batch_size=100, seed=1)
    ds.update_metadata(ds.get_metadata().head(5))
    assert sum(len(b) for b in loader) == 800
    assert sum(len(b) for b in ds.loader(batch_size=100, seed=1)) == 5


def _read_part(ds, worker, workers, out):
    """Child process: read this worker's share; report identities or the error."""
    try:
        spec = drt._native.LoaderSpec(
            batch_size=32,
            seed=9,
            epoch=2,
            threads=1,
            prefetch_bytes=1 << 20,
            prefetch_batches=2,
            worker=worker,
            num_workers=workers,
        )
        loader = drt.Loader(ds, spec)
        out.put((worker, [(b.cache_id, b.sample_id) for b in loader], None))
    except Exception as exc:  # the parent asserts on the type and message
        out.put((worker, None, (type(exc).__name__, str(exc))))


def run_workers(ds, method: str, workers: int) -> dict[int, list]:
    ctx = mp.get_context(method)
    out = ctx.Queue()
    procs = [ctx.Process(target=_read_part, args=(ds, w, workers, out)) for w in range(workers)]
    for p in procs:
        p.start()
    results = {}
    for _ in procs:
        worker, parts, error = out.get(timeout=120)
        results[worker] = parts if error is None else error
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


@pytest.mark.parametrize("method", ["spawn", "fork"])
@pytest.mark.parametrize("workers", [1, 3])
def test_worker_processes_split_one_global_sequence(two_caches, method, workers):
    ds, _, _ = two_caches
    ds.update_metadata(ds.get_metadata().head(700))  # workers must see this snapshot
    single = [
        list(zip(b.cache_id, b.sample_id, strict=True))
        for b in ds.loader(batch_size=32, seed=9, epoch=2)
    ]
    results = run_workers(ds, method, workers)
    # round-robin over workers restores the global order, batch by batch
    merged = []
    for i in range(len(single)):
        cids, sids = results[i % workers][i // workers]
        merged.append(list(zip(cids, sids, strict=True)))
    assert merged == single


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_a_corrupt_record_surfaces_from_a_worker(tmp_path, method):
    src = Source("fragile-v1", 64, payload=lambda i: bytes([i]) * 512)
    ds = drt.build(tmp_path, [src], codec="none", progress=False)
    meta = ds.get_metadata()
    ds.update_metadata(pl.concat([meta.filter(pl.col("sample_id") == 40)] * 64))
    shard = tmp_path / "fragile-v1" / "shard-00000.drts"
    raw = bytearray(shard.read_bytes())
    raw[16 + 512 * 40 + 3] ^= 0xFF
    shard.write_bytes(bytes(raw))
    results = run_workers(drt.open(tmp_path), method, 2)
    errors = [r for r in results.values() if isinstance(r, tuple)]
    assert len(errors) == 2, results
    name, message = errors[0]
    assert name == "CorruptCacheError"
    assert "sample 40" in message and "shard-00000.drts" in message


def _rss_anon_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise AssertionError("no RssAnon in /proc/self/status")


def _measure_read_ahead(root: str, budget: int, out) -> None:
    """In a fresh process: anonymous memory growth while reading 4 MiB payloads."""
    ds = drt.open(root)
    base = _rss_anon_kib()
    peak = base
    total = 0
    loader = ds.loader(batch_size=2, seed=0, prefetch_bytes=budget, prefetch_batches=64)
    for i, batch in enumerate(loader):
        if i == 0:
            time.sleep(0.5)  # let the read-ahead fill up to its budget
        peak = max(peak, _rss_anon_kib())
        total += sum(len(d) for d in batch.data)
        del batch
    out.put((total, (peak - base) * 1024))


def test_read_ahead_stays_within_its_byte_budget_with_4_mib_payloads(tmp_path):
    mib = 1 << 20
    src = Source("large-v1", 48, payload=lambda i: bytes([i % 256]) * (4 * mib))
    drt.build(tmp_path, [src], codec="none", progress=False)
    budget = 16 * mib
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_measure_read_ahead, args=(str(tmp_path), budget, out))
    proc.start()
    total, grown = out.get(timeout=120)
    proc.join(timeout=60)
    assert total == 48 * 4 * mib
    # 192 MiB were read. Beyond the read-ahead budget, memory holds batches of
    # 8 MiB: one being read, one waiting for budget, the one being handed to
    # Python (briefly as Arrow and as bytes objects) and the one Python holds;
    # the allocator may keep a freed batch per reading thread.
    assert grown < budget + 6 * 8 * mib, f"anonymous memory grew by {grown / mib:.0f} MiB"


def test_the_dataset_pickles_into_workers_at_its_snapshot(two_caches):
    ds, _, _ = two_caches
    ds.update_metadata(ds.get_metadata().head(10))
    clone = pickle.loads(pickle.dumps(ds))
    assert len(clone) == 10


WATCHED_LOADER = """
import sys, threading
import datasetrt as drt
ds = drt.open(sys.argv[1])
loader = ds.loader(8, seed=3, sampling="permutation")
seen = []
reader = threading.Thread(target=lambda: seen.extend(len(b) for b in loader))
reader.start()
while reader.is_alive():
    assert "PayloadTakeExec" in loader.metrics()  # from the training loop, say
reader.join()
print(sum(seen))
"""


def test_metrics_from_one_thread_while_another_iterates(two_caches):
    _, root, _ = two_caches
    assert run_child(WATCHED_LOADER, root).split() == ["800"]


def test_datasetrt_threads_sets_the_default_read_concurrency(tmp_path, source):
    """One setting for every default thread count: the loader's readers
    (and SQL's partitions, the runtime's workers) follow DATASETRT_THREADS."""
    drt.build(tmp_path, [source("gamma-v1", 50)], progress=False)
    script = (
        "import sys, datasetrt as drt\n"
        "plan = drt.open(sys.argv[1]).loader(10, seed=0).explain()\n"
        "print(plan.split('concurrency=')[1].split(',')[0].split()[0])\n"
    )
    for threads in ("1", "3"):
        done = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "DATASETRT_THREADS": threads},
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == threads


def test_a_batch_is_handed_over_as_arrow_and_raw_payloads_without_a_copy(tmp_path, source):
    """The loader hands each batch over as one Arrow record batch (draw, row,
    identity, data). ``views`` gives the payloads as memoryviews: over the
    mapped shard for records stored raw (the bytes are the file's), over a
    copy for compressed ones; both equal ``data``."""
    raw = source("raw-v1", 40, payload=lambda i: bytes([i]) * 1000)
    packed = source("packed-v1", 40, payload=lambda i: bytes([i]) * 1000)
    ds = drt.build(tmp_path / "raw", [raw], codec="none", progress=False)
    zds = drt.build(tmp_path / "z", [packed], codec="zstd", progress=False)
    for dataset, mapped in ((ds, True), (zds, False)):
        batch = next(iter(dataset.loader(batch_size=16, seed=3)))
        frame = pl.DataFrame(batch.to_arrow())
        assert frame.columns == ["draw", "row", "cache_id", "sample_id", "snapshot", "data"]
        assert frame["data"].to_list() == batch.data
        assert frame["row"].to_list() == batch.rows
        assert frame["sample_id"].to_list() == batch.sample_id
        views = batch.views
        assert [bytes(v) for v in views] == batch.data
        assert all(isinstance(v, memoryview) and v.readonly for v in views)
        # a view over the shard is a slice of a memory map (its `obj`), not of bytes
        assert all(isinstance(v.obj, mmap.mmap) == mapped for v in views)
        del batch, views  # the views keep their mapping alive, not the loader


def test_views_of_a_batch_over_many_shards_and_caches_name_each_records_bytes(tmp_path, source):
    """A shuffled batch reads from several shards of several caches: every
    view is the right record's bytes, over its own shard's map."""
    sources = [source(f"s{k}-v1", 60, payload=lambda i, k=k: bytes([k, i]) * 700) for k in range(3)]
    ds = drt.build(tmp_path, sources, codec="none", shard_bytes=8 << 10, progress=False)
    source_of: dict[int, int] = {}  # cache_id -> k, from the first record seen
    maps = set()
    for batch in ds.loader(batch_size=50, seed=4, sampling="permutation"):
        views = batch.views
        assert [bytes(v) for v in views] == batch.data
        for cid, sid, v in zip(batch.cache_id, batch.sample_id, views, strict=True):
            k = source_of.setdefault(cid, v[0])
            assert bytes(v) == bytes([k, sid]) * 700
        assert all(isinstance(v.obj, mmap.mmap) for v in views)
        maps.update(id(v.obj) for v in views)
    assert sorted(source_of.values()) == [0, 1, 2]
    assert len(maps) > 3  # several shards of each cache, one map each


def test_views_copy_the_records_of_a_shard_file_replaced_since_it_was_read(tmp_path, source):
    """A shard file replaced after the engine read it (another length) is not
    mapped again: its views are copies of the verified bytes."""
    ds = drt.build(
        tmp_path,
        [source("a-v1", 30, payload=lambda i: bytes([i]) * 900)],
        codec="none",
        progress=False,
    )
    batch = next(iter(ds.loader(batch_size=30, seed=1, sampling="permutation")))
    shards = sorted(tmp_path.rglob("shard-*"))
    assert shards
    for shard in shards:  # a new file under the old name; the engine keeps its map
        fresh = shard.with_suffix(".new")
        fresh.write_bytes(b"x" * 100)
        fresh.replace(shard)
    views = batch.views
    assert [bytes(v) for v in views] == batch.data == [bytes([s]) * 900 for s in batch.sample_id]
    assert not any(isinstance(v.obj, mmap.mmap) for v in views)


def test_a_batch_pickles_with_its_rows_identities_payloads_and_metadata(two_caches):
    """A transform may hand the Batch itself to a DataLoader's main process."""
    ds, _, _ = two_caches
    batch = next(iter(ds.loader(batch_size=8, seed=2)))
    again = pickle.loads(pickle.dumps(batch))
    assert (again.rows, again.cache_id, again.sample_id) == (
        batch.rows,
        batch.cache_id,
        batch.sample_id,
    )
    assert again.data == batch.data and [bytes(v) for v in again.views] == batch.data
    assert again.metadata.equals(batch.metadata)
    # a native batch again (Arrow IPC, as polars pickles a DataFrame): the
    # draws and the record batch travel, and only the payloads' own bytes
    assert (again.draws, again.snapshots, again.epoch) == (
        batch.draws,
        batch.snapshots,
        batch.epoch,
    )
    assert pl.DataFrame(again.to_arrow()).equals(pl.DataFrame(batch.to_arrow()))
    payload_bytes = sum(map(len, batch.data))
    assert len(pickle.dumps(batch)) < payload_bytes + 8192
    # bytes that are not a pickled batch's streams are refused, not read
    stream, rows = batch._native.to_ipc()
    for bad in [(b"x", rows), (rows, rows), (stream, stream[:40])]:
        with pytest.raises(drt.InvalidInputError, match="pickled batch"):
            drt._native.Batch.from_ipc(*bad)


BUILD_LARGE_POPULATION = r"""
import random, sys
import polars as pl
import datasetrt as drt

# 60 records of 1 MiB: the loader's advice runs 64 MiB (64 draws) ahead, and
# each partition of 2^20 rows starts at another record (its own sample_id file)
class Large:
    name = "large"
    def __len__(self):
        return 60
    def __iter__(self):
        for i in range(60):
            yield random.Random(i).randbytes(1 << 20), {"label": i % 7}  # incompressible

ds = drt.build(sys.argv[1], [Large()], progress=False)
base = ds.get_metadata()
ds.update_metadata(pl.concat([base] * (int(sys.argv[2]) // 60), rechunk=False))
ds.draws(0, count=1 << 16)  # stores every partition's alias table
"""

FIRST_BATCH = r"""
import sys
import datasetrt as drt
ds = drt.open(sys.argv[1])
loader = ds.loader(batch_size=int(sys.argv[2]), seed=5, threads=1, prefetch_batches=1)
batch = next(iter(loader))
assert len(batch) == int(sys.argv[2])
"""


def page_cache_bytes(path: Path) -> int:
    """Bytes of `path` in the page cache (mincore over a private mapping,
    which reads nothing)."""
    import ctypes

    size = path.stat().st_size
    page = mmap.PAGESIZE
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    try:
        at = ctypes.c_char.from_buffer(mapped)
        vec = (ctypes.c_ubyte * -(-size // page))()
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(at)), ctypes.c_size_t(size), vec)
        assert rc == 0, os.strerror(ctypes.get_errno())
        del at
        return sum(v & 1 for v in vec) * page
    finally:
        mapped.close()


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="needs posix_fadvise")
def test_a_first_batch_over_a_cold_snapshot_reads_the_chunks_its_draws_need(tmp_path):
    """A population larger than the page cache: the first batch reads, of the
    snapshot's column files and alias tables, the 64 KiB chunks its draws'
    values lie in (each checked once) and the files' headers, not the
    read-ahead window around every value. Before, each cold fault read that
    window (8 MiB on the machine the scale benchmark runs on: 4.8-5.1 s for
    a first batch at 10^9 rows, evicted; here 88 of 113 MB)."""
    root, per, batch = tmp_path / "root", 1 << 20, 16
    env = {**os.environ, "DATASETRT_PARTITION_ROWS": str(per)}
    run_child(BUILD_LARGE_POPULATION, root, 4 * per, env=env)
    files = [p for p in root.rglob("*") if p.suffix in (".arrow", ".alias")]
    records = Path(f"/dev/shm/datasetrt-{os.getuid()}/verified")
    for p in files:
        for record in records.glob(f"{p.name}.*"):
            record.unlink()  # the host's first reader: every chunk to check
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    total = sum(p.stat().st_size for p in files)
    assert sum(map(page_cache_bytes, files)) < total // 16, "the files could not be evicted"
    run_child(FIRST_BATCH, root, batch)
    read = sum(map(page_cache_bytes, files))
    # Draws read: the consumer's (the batch, the one queued behind it, the
    # one being made), the advice's 64 MiB of records ahead (64 draws) and
    # the block it looks into. A draw reads its alias entry (two chunks),
    # its cache_id and sample_id (a chunk each); a file its first and last
    # chunk (its Arrow header).
    draws = 3 * batch + 64 + 2 * batch
    need = (draws * 4 + len(files) * 2) * (64 << 10)
    assert read <= need < total // 2, (read, need, total)
