"""One DataLoader for the whole run: ``set_epoch`` and ``load_state_dict``
reach persistent workers, torchdata's ``StatefulDataLoader`` saves and
resumes exactly, and its state resumes a plain ``DataLoader`` with another
number of workers."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import polars as pl
import pytest

import datasetrt as drt
from conftest import Source, run_child

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

stateful = pytest.importorskip("torchdata.stateful_dataloader")

pytestmark = [
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
    # torchdata 0.11 calls a torch API that torch now deprecates
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),
]

BS = 25


def ids(batch) -> list[tuple[int, int]]:
    return list(zip(batch["cache_id"].tolist(), batch["sample_id"].tolist(), strict=True))


def fresh(ds, epoch: int, **kw) -> list[list[tuple[int, int]]]:
    """An epoch read by a new loader in this process: what every other way must equal."""
    tds = ds.to_torch(batch_size=BS, seed=3, epoch=epoch, **kw)
    return [ids(b) for b in DataLoader(tds, batch_size=None, num_workers=0)]


def dataloader(tds, workers: int, method: str, cls=DataLoader, **kw):
    if workers:
        kw.update(multiprocessing_context=method, persistent_workers=True)
    return cls(tds, batch_size=None, num_workers=workers, **kw)


@pytest.mark.parametrize("method", ["spawn", "fork"])
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_persistent_workers_follow_set_epoch(two_caches, method, workers):
    ds = two_caches[0]
    tds = ds.to_torch(batch_size=BS, seed=3)
    loader = dataloader(tds, workers, method)
    epochs = []
    for epoch in range(3):
        tds.set_epoch(epoch)
        epochs.append([ids(b) for b in loader])
    del loader
    assert epochs == [fresh(ds, e) for e in range(3)]
    assert epochs[0] != epochs[1] != epochs[2]


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_load_state_dict_reaches_persistent_workers(two_caches, method):
    ds = two_caches[0]
    tds = ds.to_torch(batch_size=BS, seed=3)
    loader = dataloader(tds, 2, method)
    first = [ids(b) for b in loader]  # epoch 0 starts the workers
    tds.set_epoch(1)
    state = tds.state_dict(batches_seen=5)
    tds.load_state_dict(json.loads(json.dumps(state)))
    assert len(tds) == 32 - 5
    resumed = [ids(b) for b in loader]
    tds.set_epoch(2)
    after = [ids(b) for b in loader]
    del loader
    assert first == fresh(ds, 0)
    assert resumed == fresh(ds, 1)[5:]
    assert after == fresh(ds, 2)


def test_a_copy_that_cannot_see_the_shared_plan_raises_instead_of_replaying(two_caches):
    ds = two_caches[0]
    tds = ds.to_torch(batch_size=BS, seed=3)
    tds.set_epoch(4)
    blob = pickle.dumps(tds)
    script = (
        "import pickle, sys, datasetrt as drt\n"
        "tds = pickle.loads(bytes.fromhex(sys.argv[1]))\n"
        "try:\n"
        "    batch = next(iter(tds))\n"
        "    print('epoch', tds.epoch, batch['sample_id'].tolist()[:3])\n"
        "except drt.InvalidInputError as e:\n"
        "    print('refused', e)\n"
    )
    seen = run_child(script, blob.hex())
    assert seen.startswith("epoch 4"), seen  # another process follows the owner's plan
    tds._shared.write({**tds._shared.read(), "epoch": 6})
    assert run_child(script, blob.hex()).startswith("epoch 6")
    os.unlink(tds._shared.path)  # as if the owner were gone
    seen = run_child(script, blob.hex())
    assert seen.startswith("refused") and "will not silently replay" in seen, seen
    # a copy made in the owner's process is a dataset of its own
    tds._shared.write(tds.spec.to_dict())
    twin = pickle.loads(pickle.dumps(tds))
    twin.set_epoch(9)
    assert tds._shared.read()["epoch"] == 4 and twin._shared.read()["epoch"] == 9


def sdl(tds, workers, method):
    return dataloader(tds, workers, method, cls=stateful.StatefulDataLoader)


@pytest.mark.parametrize("method", ["spawn", "fork"])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("stop", [0, 1, 6, 32])
def test_stateful_dataloader_resumes_exactly(two_caches, method, workers, stop):
    ds = two_caches[0]
    full = fresh(ds, 1)
    tds = ds.to_torch(batch_size=BS, seed=3, epoch=1)
    loader = sdl(tds, workers, method)
    it = iter(loader)
    got = [ids(next(it)) for _ in range(stop)]
    state = json.loads(json.dumps(loader.state_dict()))  # plain data, as checkpoints hold it
    del it, loader
    assert got == full[:stop]

    again = sdl(ds.to_torch(batch_size=BS, seed=3), workers, method)
    again.load_state_dict(state)
    rest = [ids(b) for b in again]
    del again
    assert rest == full[stop:]

    # the same state, global, resumes a plain DataLoader with 3 workers
    plain = ds.to_torch(batch_size=BS, seed=3)
    plain.load_state_dict(state)
    assert len(plain) == len(full) - stop
    assert [ids(b) for b in DataLoader(plain, batch_size=None, num_workers=3)] == full[stop:]


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_no_skipped_payload_is_read_on_resume(tmp_path, method):
    """The resumed loader starts at the state's position: a record that only
    the skipped batches hold is damaged, and the resume never notices."""
    src = Source("fragile-v1", 200, payload=lambda i: bytes([i % 251]) * 256)
    ds = drt.build(tmp_path, [src], codec="none", progress=False)
    tds = ds.to_torch(batch_size=20, seed=1, sampling="permutation")
    loader = sdl(tds, 2, method)
    it = iter(loader)
    skipped = [ids(next(it)) for _ in range(4)]
    state = loader.state_dict()
    del it, loader
    victim = skipped[1][3][1]
    shard = tmp_path / "fragile-v1" / "shard-00000.drts"
    raw = bytearray(shard.read_bytes())
    raw[16 + 256 * victim + 10] ^= 0x01
    shard.write_bytes(bytes(raw))
    again = sdl(
        drt.open(tmp_path).to_torch(batch_size=20, seed=1, sampling="permutation"), 2, method
    )
    again.load_state_dict(state)
    rest = [s for b in again for s in ids(b)]
    del again
    cid = ds.caches[0]["cache_id"]
    assert len(rest) == 200 - 80 and (cid, victim) not in rest
    with pytest.raises(drt.CorruptCacheError):
        drt.open(tmp_path).get_item(cid, victim)


def test_state_dict_without_progress_in_the_main_process_says_what_to_pass(two_caches):
    ds = two_caches[0]
    tds = ds.to_torch(batch_size=BS, seed=3)
    with pytest.raises(drt.InvalidInputError, match="pass batches_seen"):
        tds.state_dict()
    it = iter(DataLoader(tds, batch_size=None, num_workers=0))
    next(it), next(it)
    assert tds.state_dict() == tds.state_dict(batches_seen=2)


@pytest.mark.parametrize("method", ["fork"])
def test_one_workers_state_is_refused_where_it_cannot_resume(two_caches, method):
    ds = two_caches[0]
    tds = ds.to_torch(batch_size=BS, seed=3)
    loader = sdl(tds, 2, method)
    it = iter(loader)
    next(it), next(it), next(it)
    state = loader.state_dict()
    del it, loader
    one_worker = state["_snapshot"]["_worker_snapshots"]["worker_0"]["dataset_state"]
    assert one_worker["reader"]["worker"] == 0
    with pytest.raises(drt.InvalidInputError, match="inside DataLoader worker 0 of 2"):
        ds.to_torch(batch_size=BS, seed=3).load_state_dict(one_worker)
    # the whole state resumes with another batch size only by refusing it
    with pytest.raises(drt.InvalidInputError, match="batch_size"):
        ds.to_torch(batch_size=BS + 1, seed=3).load_state_dict(state)


def test_to_torch_takes_the_loaders_options_resume_included(two_caches):
    """``to_torch`` holds one LoaderSpec made of :meth:`Dataset.loader`'s
    options: ``resume=`` continues where a state left off, as
    ``load_state_dict`` does, and a misspelt option is refused by name."""
    ds = two_caches[0]
    whole = fresh(ds, 0)
    tds = ds.to_torch(batch_size=BS, seed=3)
    state = tds.state_dict(batches_seen=5)
    resumed = ds.to_torch(batch_size=BS, seed=3, resume=state)
    assert [ids(b) for b in DataLoader(resumed, batch_size=None, num_workers=0)] == whole[5:]
    assert resumed.spec.batch_size == BS and resumed.spec.version == ds.version
    # a StatefulDataLoader's own state resumes too, as load_state_dict takes it
    loader = sdl(ds.to_torch(batch_size=BS, seed=3), 0, "fork")
    it = iter(loader)
    next(it), next(it)
    again = ds.to_torch(batch_size=BS, seed=3, resume=loader.state_dict())
    assert [ids(b) for b in DataLoader(again, batch_size=None, num_workers=0)] == whole[2:]
    # version= reads that snapshot, not the one active when the loader is made
    first = ds.version
    ds.update_metadata(ds.get_metadata().head(40))
    pinned = ds.to_torch(batch_size=BS, seed=3, version=first)
    assert (pinned.version, pinned.seed) == (first, 3)  # the spec's options, by name
    assert [ids(b) for b in DataLoader(pinned, batch_size=None, num_workers=0)] == whole
    with pytest.raises(drt.InvalidInputError, match='unknown loader option "epoch_length"'):
        ds.to_torch(batch_size=BS, seed=3, epoch_length=10)


def test_an_update_between_epochs_does_not_reach_a_pinned_loader(two_caches):
    """Without follow-the-head a TorchDataset keeps the snapshot it was made on."""
    ds = two_caches[0]
    tds = ds.to_torch(batch_size=BS, seed=3)
    loader = dataloader(tds, 1, "fork")
    first = [ids(b) for b in loader]
    ds.update_metadata(ds.get_metadata().filter(pl.col("label") == 1))
    tds.set_epoch(0)
    assert [ids(b) for b in loader] == first
    del loader


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_follow_the_head_a_reweight_between_epochs_changes_the_next_epoch_only(two_caches, method):
    ds, root, _ = two_caches
    start = ds.version
    tds = ds.to_torch(batch_size=BS, seed=3, follow="head")
    loader = dataloader(tds, 2, method)
    epochs = [[ids(b) for b in loader]]
    tds.set_epoch(1)
    epochs.append([ids(b) for b in loader])
    # another process (a fresh open, as the CLI would) keeps only label 3, weighted
    other = drt.open(root)
    meta = other.get_metadata().filter(pl.col("label") == 3)
    reweighted = other.update_metadata(meta.with_columns(pl.lit(2.0).alias("weight")))
    state = tds.state_dict(batches_seen=0)  # taken before the update reaches the loader
    tds.set_epoch(2)
    epochs.append([ids(b) for b in loader])
    del loader
    pinned = ds.to_torch(batch_size=BS, seed=3)  # without follow: the snapshot it was made on
    assert epochs[0] == fresh(ds, 0) and epochs[1] == fresh(ds, 1)
    assert pinned.version == start and ds.version == start  # the user's dataset is untouched
    pairs = zip(meta["cache_id"], meta["sample_id"], strict=True)
    labels = dict(zip(pairs, meta["label"], strict=True))
    assert all(labels.get(i) == 3 for b in epochs[2] for i in b)
    assert len(epochs[2]) == -(-meta.height // BS)
    assert epochs[2] == fresh(drt.open(root), 2)
    assert tds.history().rows() == [(0, start), (1, start), (2, reweighted)]
    # a state saved before the update still resumes the snapshot it named
    assert state["snapshot"] == start
    again = ds.to_torch(batch_size=BS, seed=3)
    again.load_state_dict(state)
    assert [ids(b) for b in DataLoader(again, batch_size=None)] == fresh(ds, 1)


def test_following_the_head_stores_the_new_weights_tables_before_workers_read(two_caches):
    """`set_epoch` on a loader that follows the head makes the new head's
    alias tables in the training process, once, before the DataLoader forks:
    its workers map them instead of each building them."""
    ds, root, _ = two_caches
    tds = ds.to_torch(batch_size=BS, seed=3, follow="head")
    meta = ds.get_metadata()
    ds.update_metadata(meta.with_columns((pl.col("label") + 1.0).alias("weight")))
    before = set(root.rglob("*.alias"))
    tds.set_epoch(1)
    made = set(root.rglob("*.alias")) - before
    assert len(made) == 1, made  # one partition, one table, before any read
    assert [ids(b) for b in DataLoader(tds, batch_size=None)] == fresh(ds, 1)


def test_records_of_killed_makers_are_swept_by_the_next_one(two_caches, tmp_path):
    """A killed training process never runs its finalizers: the next
    TorchDataset made on the host removes its record."""
    from datasetrt import _shared

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    pid = int(dead.stdout)
    stale = os.path.join(_shared._directory(), f"datasetrt-{pid}-{'0' * 32}.json")
    with open(stale, "w") as f:
        f.write("{}")
    mine = two_caches[0].to_torch(batch_size=BS, seed=3)
    assert not os.path.exists(stale)
    assert os.path.exists(mine._shared.path)  # a live maker's record stays


MAKER = """
import os, pickle, sys
import datasetrt as drt
tds = drt.open(sys.argv[1]).to_torch(batch_size=16, seed=3)
sys.stdout.buffer.write(pickle.dumps(tds))
sys.stdout.flush()
os.kill(os.getpid(), 9)  # no finalizer runs: the shared record stays
"""


def test_a_copy_whose_maker_was_killed_raises_instead_of_replaying_its_plan(two_caches):
    """docs/training.md: a copy whose maker is gone raises InvalidInputError.
    A maker killed with SIGKILL left its record, and a copy replayed it."""
    root = two_caches[1]
    done = subprocess.run(
        [sys.executable, "-c", MAKER, str(root)], capture_output=True, timeout=120
    )
    assert done.returncode == -9, done.stderr.decode()[-2000:]
    copy = pickle.loads(done.stdout)
    assert os.path.exists(copy._shared.path), "the killed maker's record is still there"
    with pytest.raises(drt.InvalidInputError, match="is gone"):
        next(iter(DataLoader(copy, batch_size=None)))


CLEANUP = """
import sys
import polars as pl
import datasetrt as drt
other = drt.open(sys.argv[1])
other.update_metadata(other.get_metadata().filter(pl.col("label") < 5))
print(other.cleanup(keep=1))
"""


@pytest.mark.parametrize("persistent", [False, True])
def test_cleanup_in_another_process_keeps_what_a_running_job_reads(two_caches, persistent):
    """`cleanup(keep=1)` in another process while a follow-the-head DataLoader
    with spawned workers runs made every later epoch fail (`DataLoader worker
    exited unexpectedly`): a worker pins the snapshot its main process
    opened, which cleanup removed. Snapshots live processes read are leased
    and kept."""
    ds, root, _ = two_caches
    ds.update_metadata(ds.get_metadata().filter(pl.col("label") < 8))
    reading = ds.version
    tds = ds.to_torch(batch_size=BS, seed=3, follow="head")
    loader = DataLoader(
        tds,
        batch_size=None,
        num_workers=2,
        multiprocessing_context="spawn",
        persistent_workers=persistent,
    )
    first = [ids(b) for b in loader]
    assert first == fresh(ds, 0)
    removed = json.loads(run_child(CLEANUP, root))
    assert reading not in removed, "cleanup removed the snapshot a live job reads"
    assert removed, "older snapshots nobody reads are removed"
    head = drt.open(root)
    tds.set_epoch(1)
    second = [ids(b) for b in loader]
    assert second == fresh(head, 1)
    del loader


def test_a_worker_whose_plan_snapshot_is_gone_raises_cache_not_found_in_the_main_process(
    two_caches,
):
    """A snapshot removed behind the job's back (by hand: leases keep it from
    cleanup) made a spawned worker die unpickling (`DataLoader worker exited
    unexpectedly`). The worker needs only its plan's snapshot, and its
    absence is a CacheNotFoundError the DataLoader hands to the main process."""
    ds = two_caches[0]
    ds.update_metadata(ds.get_metadata().filter(pl.col("label") < 8))
    tds = ds.to_torch(batch_size=BS, seed=3)  # pinned to this snapshot
    manifest = ds.snapshot_path
    ds.update_metadata(ds.get_metadata().filter(pl.col("label") < 4))  # a new head
    manifest.unlink()
    loader = DataLoader(tds, batch_size=None, num_workers=1, multiprocessing_context="spawn")
    with pytest.raises(drt.CacheNotFoundError):
        next(iter(loader))
    del loader


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_a_run_steered_within_the_epoch_through_workers_resumes_on_other_worker_counts(
    two_caches, method
):
    """A mixture changed during the epoch reaches a DataLoader's workers at one
    draw; the run stopped halfway resumes on another number of workers, and
    the whole is the run replayed alone from its schedule."""
    ds = two_caches[0]
    ds.set_mixture("label", {0: 1, 1: 1, 2: 1})
    # the workers read ahead (8 batches each, a few more queued and in
    # flight: at most 600 draws here): a change takes effect at the first
    # block none of them has claimed
    kw = {"epoch_len": 3000, "run": f"torch-{method}"}
    tds = ds.to_torch(batch_size=BS, seed=3, **kw)
    it = iter(dataloader(tds, 2, method))
    got = [ids(next(it)) for _ in range(6)]
    changed = ds.set_mixture("label", {0: 3, 1: 1, 2: 1})
    got += [ids(next(it)) for _ in range(40)]
    state = tds.state_dict(46)
    del it  # the run stops here
    again = ds.to_torch(batch_size=BS, seed=3, **kw)
    again.load_state_dict(state)
    ds.set_mixture("label", {0: 1, 1: 3, 2: 1})  # committed while it was stopped
    got += [ids(b) for b in dataloader(again, 3, method)]
    assert got == fresh(ds, 0, **kw)
    # both changes took effect within the epoch
    meta = ds.get_metadata()
    label = dict(
        zip(zip(meta["cache_id"], meta["sample_id"], strict=True), meta["label"], strict=True)
    )
    labels = [label[i] for b in got for i in b]
    assert abs(labels[:150].count(0) - 50) <= 1  # the first shares, a third each
    assert abs(labels[1000:1150].count(0) - 90) <= 1  # the first change's, 3:1:1
    assert abs(labels[-150:].count(1) - 90) <= 1  # the last change's, 1:3:1
    assert changed in ds.history()["version"].to_list()
