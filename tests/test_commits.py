"""The commit protocol: one head names the population; an update derived from
an older head is a conflict, never a silently lost update."""

from __future__ import annotations

import subprocess
import sys

import pytest

import datasetrt as drt
from conftest import run_child
from datasetrt import ConflictError, CorruptCacheError


def test_a_stale_update_is_a_conflict_naming_both_snapshots(two_caches):
    ds, root, _ = two_caches
    other = drt.open(root)
    meta = ds.get_metadata()
    assert ds.update_metadata(meta.head(500)) == 1
    stale = other.get_metadata()  # read at snapshot 0, before the update
    with pytest.raises(ConflictError) as err:
        other.update_metadata(stale.head(100))
    assert (err.value.base, err.value.head) == (0, 1)
    assert "snapshot 0" in str(err.value) and "snapshot 1" in str(err.value)
    assert other.head == 1 and other.version == 0
    # nothing changed: the first writer's population is still the head
    assert len(drt.open(root)) == 500
    # redo the change on the new head, and it lands
    assert other.refresh() == 1
    assert other.update_metadata(other.get_metadata().head(100)) == 2
    assert len(drt.open(root)) == 100
    assert drt.open(root).history()["parent"].to_list() == [None, 0, 1]


def test_force_replaces_the_head_and_base_names_the_source_explicitly(two_caches):
    ds, root, _ = two_caches
    other = drt.open(root)
    ds.update_metadata(ds.get_metadata().head(500))
    assert other.update_metadata(other.get_metadata().head(7), force=True) == 2
    assert len(drt.open(root)) == 7
    # an update explicitly based on the new head is accepted from a stale object
    stale = drt.open(root)
    ds.refresh()
    ds.update_metadata(ds.get_metadata().head(5))
    assert stale.update_metadata(stale.get_metadata().head(3), base=3) == 4
    with pytest.raises(ConflictError):
        stale.update_metadata(stale.get_metadata().head(2), base=3)


def test_select_runs_again_on_a_head_another_writer_moved(two_caches):
    ds, root, _ = two_caches
    other = drt.open(root)
    other.sql("SELECT 1")  # its SQL table is bound to snapshot 0
    ds.select("SELECT * FROM metadata WHERE label < 5")
    other.select("SELECT * FROM metadata WHERE split = 'train'")
    got = drt.open(root).get_metadata()
    # both selections are in the population: the second ran on the first's result
    assert got.height == 320 and (got["label"] < 5).all() and (got["split"] == "train").all()


def test_checkout_moves_the_head_for_every_process_and_pickling_does_not(two_caches):
    ds, root, _ = two_caches
    meta = ds.get_metadata()
    ds.update_metadata(meta.head(10))
    ds.update_metadata(meta.head(20))
    ds.checkout(1)
    assert drt.open(root).version == 1 and len(drt.open(root)) == 10
    assert ds.update_metadata(ds.get_metadata().head(5)) == 3  # committed on top of 1
    assert drt.open(root).history()["parent"].to_list()[-1] == 1
    # a pickled dataset reopens its snapshot in this process only
    import pickle

    ds.checkout(2)
    pinned = pickle.loads(pickle.dumps(ds))
    ds.checkout(3)
    assert pinned.version == 2 and len(pinned) == 20
    copy = pickle.loads(pickle.dumps(pinned))
    assert copy.version == 2 and drt.open(root).version == 3


def test_a_missing_head_snapshot_or_head_record_is_an_error_never_a_fallback(two_caches):
    ds, root, _ = two_caches
    ds.update_metadata(ds.get_metadata().head(10))
    head_manifest = ds.snapshot_path
    head_manifest.rename(head_manifest.with_suffix(".bak"))
    with pytest.raises(drt.CacheNotFoundError) as err:
        drt.open(root)
    assert head_manifest.name in str(err.value)
    head_manifest.with_suffix(".bak").rename(head_manifest)
    assert len(drt.open(root)) == 10
    head = head_manifest.parent / "HEAD"
    head.unlink()
    with pytest.raises(CorruptCacheError, match="head record is missing") as err:
        drt.open(root)
    assert err.value.path == head


TWO_WRITERS = """
import sys, time
import polars as pl
import datasetrt as drt
root, who, start = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
ds = drt.open(root)
meta = ds.get_metadata()
while time.time() < start:
    time.sleep(0.001)
landed = conflicts = 0
for i in range(20):
    while True:
        changed = meta.with_columns(pl.lit(1000 * who + i).alias(f"w{who}"))
        try:
            ds.update_metadata(changed)
            landed += 1
            break
        except drt.ConflictError:
            conflicts += 1
            ds.refresh()
            meta = ds.get_metadata()
    meta = ds.get_metadata()
print(landed, conflicts)
"""


def test_two_processes_updating_at_once_lose_no_update(two_caches):
    """Each writer adds its own column on top of what it read: an update that
    was derived from an older head must fail, so the final population carries
    both writers' last columns and every commit's parent is the one before."""
    _, root, _ = two_caches
    import time

    start = time.time() + 1.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", TWO_WRITERS, str(root), str(who), str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for who in (1, 2)
    ]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(tuple(map(int, out.split())))
    assert [landed for landed, _ in outs] == [20, 20]
    final = drt.open(root)
    history = final.history()
    assert history.height == 41 and final.version == 40
    # a linear chain: no commit was made on a head that had moved
    assert history["parent"].to_list()[1:] == list(range(40))
    meta = final.get_metadata()
    last = {who: meta[f"w{who}"][0] for who in (1, 2) if f"w{who}" in meta.columns}
    assert last == {1: 1019, 2: 2019}


def test_threads_sharing_one_dataset_commit_in_turn(two_caches):
    """Threads share one Dataset object and so its active snapshot: each
    update is based on the one before (see test_snapshots for the stress)."""
    _, root, _ = two_caches
    out = run_child(
        """
import sys, threading
import datasetrt as drt
ds = drt.open(sys.argv[1])
meta = ds.get_metadata()
def work(k):
    for i in range(5):
        ds.update_metadata(meta.head(10 + k))
ts = [threading.Thread(target=work, args=(k,)) for k in range(3)]
[t.start() for t in ts]
[t.join() for t in ts]
print(ds.version, drt.open(sys.argv[1]).version)
""",
        root,
    )
    assert out.split() == ["15", "15"]


def test_a_newline_in_a_metadata_key_is_refused_and_cannot_lock_the_root(tmp_path, source):
    bad = source("nl-v1", 5, meta=lambda i: {"a\nb": i})
    with pytest.raises(drt.InvalidInputError, match="control characters"):
        drt.build(tmp_path, [bad], progress=False)
    ds = drt.build(tmp_path, [source("ok-v1", 5)], progress=False)
    # notes with any characters stay on one manifest line
    ds.select("SELECT * FROM metadata -- a comment\nWHERE label < 3")
    assert "\n" in drt.open(tmp_path).history()["note"][-1]
    assert len(drt.open(tmp_path)) == 3
    assert ds.get_metadata().height == 3


def test_a_snapshot_no_update_returned_is_marked_and_removed_by_the_next_commit(two_caches):
    """A writer killed between creating snapshot N+1 and moving the head
    leaves a manifest no head ever named (simulated by copying one): history()
    marks it uncommitted, and the next commit removes it and takes its number.
    A snapshot the head left by a checkout stays committed."""
    ds, root, _ = two_caches
    meta = ds.get_metadata()
    assert ds.update_metadata(meta.head(500)) == 1
    assert ds.update_metadata(meta.head(400)) == 2
    ds.checkout(1)
    snapshots = ds.snapshot_path.parent
    (snapshots / "00000003.snapshot").write_bytes((snapshots / "00000002.snapshot").read_bytes())
    history = drt.open(root).history()
    assert history["version"].to_list() == [0, 1, 2, 3]
    assert history["committed"].to_list() == [True, True, True, False]
    assert ds.update_metadata(meta.head(300)) == 3  # the orphan's number, taken again
    history = drt.open(root).history()
    assert history["committed"].all() and len(drt.open(root)) == 300
    assert history["parent"].to_list() == [None, 0, 1, 1]
