"""Per-sample score logs (issue 20, part 4): rows keyed by (run, epoch,
position) land exactly once from several ranks and workers, survive a killed
writer up to its last flush, and turn into weights through SQL."""

from __future__ import annotations

import json
import math
import os
import pickle
import signal
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import datasetrt as drt
from conftest import Source, run_child
from datasetrt.scores import KEY, SCHEMA

N = 120  # samples in the dataset


@pytest.fixture
def ds(tmp_path):
    src = Source("scores-v1", N, meta=lambda i: {"label": i % 4})
    return drt.build(tmp_path / "root", [src], progress=False)


def segments(log) -> list[Path]:
    return sorted(log.path.rglob("*.arrow"))


def ordered(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.sort("run", "epoch", "position")


class FakeTensor:
    """The part of ``torch.Tensor`` a log uses (torch itself takes seconds to import)."""

    def __init__(self, values, dtype):
        self.values = np.asarray(values, dtype=dtype)

    def detach(self):
        return self

    def cpu(self):
        return self

    def numpy(self):
        return self.values


def test_append_flush_read_round_trip(ds):
    cid = ds.caches[0]["cache_id"]
    log = ds.score_log("loss", run="r1")
    log.append([cid] * 3, [0, 1, 2], [0.5, 1.5, 2.5], epoch=0, position=0)
    log.append(
        np.full(2, cid), np.array([7, 8]), np.array([3, 4], np.float32), epoch=0, position=[10, 20]
    )
    log.append(
        FakeTensor([cid], np.int64),
        pl.Series([9]),
        FakeTensor([True], np.bool_),
        epoch=1,
        position=np.array([3], np.uint64),
    )
    assert segments(log) == []  # buffered until flushed
    assert log.flush() == 6 and log.flush() == 0
    [segment] = segments(log)
    raw = pl.read_ipc(segment)  # a plain Arrow IPC file
    assert raw.columns == ["epoch", "position", "cache_id", "sample_id", "value", "rank"]
    assert raw.height == 6 and int(segment.name.split("-")[0]) > 0  # written_ns, 20 digits
    assert not [p for p in segment.parent.iterdir() if p.name.startswith(".")]  # no temp left

    got = ordered(log.frame())
    assert got.schema == pl.Schema(SCHEMA)
    assert got.rows() == [
        ("r1", 0, 0, cid, 0, 0.5, 0),
        ("r1", 0, 1, cid, 1, 1.5, 0),
        ("r1", 0, 2, cid, 2, 2.5, 0),
        ("r1", 0, 10, cid, 7, 3.0, 0),
        ("r1", 0, 20, cid, 8, 4.0, 0),
        ("r1", 1, 3, cid, 9, 1.0, 0),
    ]
    # another handle (another process, say) reads the same table
    assert ordered(ds.score_log("loss", run="r1").frame()).equals(got)
    assert log.runs() == ["r1"] and ds.score_log("other").frame().is_empty()


def test_a_replayed_step_replaces_its_rows(ds):
    cid = ds.caches[0]["cache_id"]
    first = ds.score_log("loss", run="r1")
    first.append([cid] * 10, list(range(10)), [1.0] * 10, epoch=0, position=0)
    first.flush()
    # a resumed run replays positions 5..14 of epoch 0: a new handle, a newer segment
    resumed = ds.score_log("loss", run="r1")
    resumed.append([cid] * 10, list(range(5, 15)), [2.0] * 10, epoch=0, position=5)
    # the same key twice in one buffer: the last append wins
    resumed.append([cid], [99], [3.0], epoch=0, position=14)
    resumed.flush()
    # other epochs and other runs are other keys
    resumed.append([cid] * 2, [0, 1], [4.0, 4.0], epoch=1, position=0)
    # (a log flushes when it is garbage-collected, as this one is at once)
    ds.score_log("loss", run="r2").append([cid], [0], [5.0], epoch=0, position=0)

    got = ordered(resumed.frame())
    r1e0 = got.filter((pl.col("run") == "r1") & (pl.col("epoch") == 0))
    assert r1e0["position"].to_list() == list(range(15))
    assert r1e0["value"].to_list() == [1.0] * 5 + [2.0] * 9 + [3.0]
    assert r1e0["sample_id"][14] == 99
    assert got.filter(pl.col("epoch") == 1)["value"].to_list() == [4.0, 4.0]
    assert ordered(resumed.frame("r2")).rows() == [("r2", 0, 0, cid, 0, 5.0, 0)]
    assert got.height == 15 + 2 + 1
    assert got.group_by(KEY).len()["len"].max() == 1
    # keys too wide for one 64-bit number are compared as pairs: the same rule
    big = ds.score_log("loss", run="big")
    for value in (1.0, 2.0):
        big.append([cid] * 2, [0, 1], [value, value], epoch=7, position=(1 << 64) - 3)
        big.append([cid], [0], [value], epoch=0, position=(1 << 64) - 3)
        big.flush()
    got = ordered(big.frame("big"))
    assert got.select("epoch", "position", "value").rows() == [
        (0, (1 << 64) - 3, 2.0),
        (7, (1 << 64) - 3, 2.0),
        (7, (1 << 64) - 2, 2.0),
    ]
    wide = ds.score_log("loss", run="wide")  # epoch 0 only, the last position there is
    for value in (1.0, 3.0):
        wide.append([cid], [0], [value], epoch=0, position=(1 << 64) - 1)
        wide.flush()
    assert wide.frame("wide").select("position", "value").rows() == [((1 << 64) - 1, 3.0)]


def test_flush_by_size_close_and_context(ds):
    log = ds.score_log("loss", run="r1", flush_rows=10)
    for k in range(5):
        log.append([0] * 5, [k] * 5, [1.0] * 5, epoch=0, position=5 * k)
    log.close()  # the first 20 rows were handed to the background writer at 10 and 20
    # a segment at 10 and at 20 rows, and the 5 rows close() wrote
    assert [pl.read_ipc(p).height for p in segments(log)] == [10, 10, 5]
    assert log.frame().height == 25 and log._writer.rows == 0
    with pytest.raises(drt.InvalidInputError, match="closed"):
        log.append([0], [0], [1.0], epoch=0, position=99)
    with ds.score_log("loss", run="r2") as other:
        other.append([0], [0], [1.0], epoch=0, position=0)
    assert log.frame("r2").height == 1
    # a pickled log starts empty and writes the same table
    copy = pickle.loads(pickle.dumps(ds.score_log("loss", run="r3")))
    copy.append([0], [0], [2.0], epoch=0, position=0)
    assert log.frame("r3").is_empty()  # another handle's buffer is its own
    assert copy.flush() == 1 and log.frame("r3")["value"].to_list() == [2.0]


def test_a_failed_flush_keeps_the_rows(ds):
    log = ds.score_log("loss", run="r1")
    log.append([0, 0], [1, 2], [1.0, 2.0], epoch=0, position=0)
    log.path.mkdir(parents=True)
    (log.path / "r1").write_bytes(b"")  # a file where the run's folder goes
    with pytest.raises(drt.StorageError, match="cannot write score log segment"):
        log.flush()
    (log.path / "r1").unlink()
    assert log.flush() == 2 and log.frame()["value"].to_list() == [1.0, 2.0]


def test_bad_names_and_inputs_raise_and_write_nothing(ds):
    bad_names = ["", ".x", "_x", "-x", "..", "a/b", "a b", "x" * 201, "é", "x\n", 3]
    for name in bad_names:
        with pytest.raises(drt.InvalidInputError, match="invalid score log name"):
            ds.score_log(name)
    assert ds.score_log("x" * 200, run="A.b-c_1").name == "x" * 200
    # a run is named by the loader's rule (its run= names the same run)
    bad_runs = ["", ".x", "..", "a/b", "a b", "x" * 129, "é", "x\n", 3]
    for run in bad_runs:
        with pytest.raises(drt.InvalidInputError, match="run's name"):
            ds.score_log("loss", run=run)
        if isinstance(run, str) and "\n" not in run:
            with pytest.raises(drt.InvalidInputError, match="run's name"):
                ds.loader(batch_size=1, seed=0, run=run)
    for run in ["x" * 128, "_x", "-x"]:
        assert ds.score_log("loss", run=run).run == run
        ds.loader(batch_size=1, seed=0, run=run)

    log = ds.score_log("loss", run="r1")
    log.append([0], [1], [1.0], epoch=0, position=0)  # one good row
    bad_appends = [
        (([0, 0], [1], [1.0]), {"epoch": 0, "position": 0}, "equally long"),
        (([0.5], [1], [1.0]), {"epoch": 0, "position": 0}, "cache_id must hold integers"),
        (([0], ["1"], [1.0]), {"epoch": 0, "position": 0}, "sample_id must hold integers"),
        (([0], [1 << 63], [1.0]), {"epoch": 0, "position": 0}, "sample_id must hold integers"),
        (([0], [1], ["a"]), {"epoch": 0, "position": 0}, "values must hold numbers"),
        (([0, 0], [1, 2], [1.0, math.nan]), {"epoch": 0, "position": 0}, r"values\[1\] = nan"),
        (([0], [1], [math.inf]), {"epoch": 0, "position": 0}, "not finite"),
        ((np.zeros((1, 1), np.int64), [1], [1.0]), {"epoch": 0, "position": 0}, "dimensional"),
        ((np.array([0.0]), [1], [1.0]), {"epoch": 0, "position": 0}, "dtype float64"),
        ((np.array([1 << 63], np.uint64), [1], [1.0]), {"epoch": 0, "position": 0}, "range"),
        (([0], [1], np.array(["a"])), {"epoch": 0, "position": 0}, "must hold numbers"),
        (("01", [1], [1.0]), {"epoch": 0, "position": 0}, "list, array or tensor"),
        (([0], [1], 1.0), {"epoch": 0, "position": 0}, "list, array or tensor"),
        (([0], [1], [1.0]), {"epoch": 0, "position": -1}, "position must be in"),
        (([0], [1], [1.0]), {"epoch": 0, "position": [-1]}, "position must hold integers"),
        (([0], [1], [1.0]), {"epoch": 0, "position": np.array([-1])}, "out of range"),
        (([0, 0], [1, 2], [1.0, 2.0]), {"epoch": 0, "position": [3]}, "one position per row"),
        (([0], [1], [1.0]), {"epoch": 0, "position": True}, "position must be an int"),
        (([0], [1], [1.0]), {"epoch": -1, "position": 0}, "epoch must be in"),
        (([0], [1], [1.0]), {"epoch": True, "position": 0}, "epoch must be an int"),
        (
            ([0, 0], [1, 2], [1.0, 2.0]),
            {"epoch": 0, "position": (1 << 64) - 1},
            "position must be in",
        ),
    ]
    for args, kwargs, message in bad_appends:
        with pytest.raises(drt.InvalidInputError, match=message):
            log.append(*args, **kwargs)
    with pytest.raises(drt.InvalidInputError, match="draw positions"):
        log.append_batch({"cache_id": [0], "sample_id": [1]}, [1.0], epoch=0)
    assert log.frame().rows() == [("r1", 0, 0, 0, 1, 1.0, 0)]  # only the good row
    scores = ds.snapshot_path.parent / "_scores"
    assert sorted(str(p.relative_to(scores)) for p in scores.rglob("*")) == [
        "loss",
        "loss/r1",
        f"loss/r1/{segments(log)[0].name}",
    ]


def test_remote_dataset_is_refused(bucket):
    url, options, _, _ = bucket
    ds = drt.build(url, [Source("remote-v1", 5)], storage_options=options, progress=False)
    with pytest.raises(drt.InvalidInputError, match="local dataset"):
        ds.score_log("loss")


def test_batches_carry_their_draw_positions(ds):
    log = ds.score_log("loss", run="r1")
    seen = []
    for batch in ds.loader(16, seed=3, epoch=2, sampling="replacement"):
        seen += batch.draws
        log.append_batch(batch, [float(d) for d in batch.draws], epoch=2)
        copy = pickle.loads(pickle.dumps(batch))
        assert copy.draws == batch.draws
    assert seen == list(range(N))
    got = log.frame().sort("position")
    assert got["value"].to_list() == [float(k) for k in range(N)]
    rows = ds.draws(3, 2)
    meta = ds.get_metadata()
    assert got["sample_id"].to_list() == meta["sample_id"].gather(rows).to_list()
    # a DataLoader batch: default_output's dict, plus "draw" added by a transform
    as_dict = {
        "cache_id": FakeTensor(got["cache_id"][:4], np.int64),
        "sample_id": FakeTensor(got["sample_id"][:4], np.int64),
        "draw": FakeTensor(range(4), np.int64),
    }
    log.append_batch(as_dict, FakeTensor([9.0] * 4, np.float32), epoch=2)
    log.append_batch({**as_dict, "draw": None}, [8.0] * 4, epoch=3, position=0)
    got = log.frame().sort("epoch", "position")
    assert got["value"].to_list()[:5] == [9.0] * 4 + [4.0]
    assert got.filter(pl.col("epoch") == 3)["value"].to_list() == [8.0] * 4
    # rank 1 of 2 gets every other batch; its positions are global
    rank1 = [d for b in ds.loader(16, seed=3, rank=1, world_size=2) for d in b.draws]
    assert rank1 == [k for k in range(N + 8) if (k // 16) % 2 == 1]


def test_sql_over_the_registered_log(ds):
    cid = ds.caches[0]["cache_id"]
    log = ds.score_log("loss", run="r1")
    log.append([cid] * N, list(range(N)), [float(i % 7) for i in range(N)], epoch=0, position=0)
    frame = log.register()  # table "loss": the log as of now
    assert frame.height == N
    per_label = ds.sql(
        "SELECT m.label, count(*) AS n, sum(l.value) AS loss FROM metadata m "
        "JOIN loss l USING (cache_id, sample_id) GROUP BY m.label ORDER BY m.label"
    )
    expected = (
        ds.get_metadata()
        .join(frame, on=["cache_id", "sample_id"])
        .group_by("label")
        .agg(n=pl.len(), loss=pl.col("value").sum())
        .sort("label")
    )
    assert per_label.rows() == expected.rows()
    # rows flushed later reach SQL when the log is registered again
    log.append([cid], [0], [100.0], epoch=1, position=0)
    log.flush()
    assert ds.sql("SELECT count(*) AS n FROM loss")["n"][0] == N
    log.register()
    assert ds.sql("SELECT count(*) AS n FROM loss")["n"][0] == N + 1


def test_loss_ema_recipe_commits_the_polars_weights(ds):
    cid = ds.caches[0]["cache_id"]
    log = ds.score_log("loss", run="r1")
    # samples 0..89 scored: epoch e draws them in another order, some twice
    for epoch in range(3):
        sids = [(7 * k + epoch) % 90 for k in range(100)]
        values = [float((s * (epoch + 2)) % 11) + 0.5 for s in sids]
        log.append([cid] * 100, sids, values, epoch=epoch, position=0)
    log.register("scores")
    version = ds.apply_sql("loss_ema_weights", alpha=0.3)
    assert ds.history()["note"][-1] == "apply_sql loss_ema_weights {'alpha': 0.3}"

    # the same moving average, step by step in polars and Python
    per_epoch = (
        log.frame()
        .group_by("sample_id", "epoch")
        .agg(pl.col("value").mean())
        .sort("sample_id", "epoch")
    )
    ema = {}
    for (sid,), group in per_epoch.group_by("sample_id"):
        avg = None
        for value in group.sort("epoch")["value"]:
            avg = value if avg is None else 0.3 * value + 0.7 * avg
        ema[sid] = avg
    fallback = sum(ema.values()) / len(ema)
    got = ds.get_metadata()
    assert ds.version == version and got.height == N
    want = [ema.get(s, fallback) for s in got["sample_id"]]
    assert got["weight"].to_list() == pytest.approx(want, rel=1e-12)
    assert len(ema) == 90


CHILD = r"""
import json, os, signal, sys
import datasetrt as drt

def host():  # the engine's rule for the host in temporary names
    with open("/proc/sys/kernel/hostname") as f:
        raw = f.read().strip()
    return "".join(c for c in raw if c.isascii() and (c.isalnum() or c == "."))[:64]

root, run, plan = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
ds = drt.open(root)
cid = ds.caches[0]["cache_id"]
log = ds.score_log("loss", run=run, flush_rows=1 << 20)
for action in plan["actions"]:
    if action[0] == "append":  # one batch: epoch, first position, size
        _, epoch, start, n = action
        positions = list(range(start, start + n))
        values = [p + plan["offset"] for p in positions]
        log.append([cid] * n, [p % int(sys.argv[4]) for p in positions], values,
                   epoch=epoch, position=start)
    elif action[0] == "flush":
        log.flush()
    elif action[0] == "die":  # half a segment under a temp name, then SIGKILL
        log._writer.directory.mkdir(parents=True, exist_ok=True)
        torn = log._writer.directory / f".tmp-{os.getpid()}@{host()}-9-torn.arrow"
        torn.write_bytes(b"ARROW1\0\0" + b"\xff" * 100)
        os.kill(os.getpid(), signal.SIGKILL)
# leaving the interpreter flushes what is still buffered
"""

BATCH, BATCHES, CHECKPOINT = 8, 32, 16  # epoch 0: 256 draws; checkpoint after batch 16


def run_processes(root: Path, run: str, plans: list[dict]) -> list[int]:
    """One child per plan, all at once, as rank p // 2 (of 2), worker p % 2."""
    procs = []
    for p, plan in enumerate(plans):
        env = {**os.environ, "RANK": str(p // 2), "WORLD_SIZE": "2"}
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", CHILD, str(root), run, json.dumps(plan), str(N)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    codes = []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            raise
        assert proc.returncode in (0, -signal.SIGKILL), err
        codes.append(proc.returncode)
    return codes


def test_two_ranks_two_workers_killed_and_resumed_log_each_draw_once(ds):
    root = Path(ds.caches[0]["path"]).parent
    mine = [[b for b in range(BATCHES) if b % 4 == p] for p in range(4)]

    def batch(b: int) -> list:
        return ["append", 0, b * BATCH, BATCH]

    plans = []
    for p in range(4):
        before = [batch(b) for b in mine[p] if b < CHECKPOINT] + [["flush"]]  # the checkpoint
        after = [batch(b) for b in mine[p] if b >= CHECKPOINT]
        if p == 3:  # flushes two more batches, buffers two, dies mid-write
            after = [*after[:2], ["flush"], *after[2:], ["die"]]
        plans.append({"offset": 0, "actions": before + after})
    assert run_processes(root, "r1", plans) == [0, 0, 0, -signal.SIGKILL]

    log = ds.score_log("loss", run="r1")
    lost = {27, 31}  # rank 1 worker 1 never flushed these batches
    got = log.frame()  # the torn temp is not read
    want = {k for b in range(BATCHES) if b not in lost for k in range(b * BATCH, (b + 1) * BATCH)}
    assert set(got["position"].to_list()) == want and got.height == len(want)
    [torn] = [p for p in (log.path / "r1").iterdir() if p.name.startswith(".tmp-")]

    # resume from the checkpoint: every process replays its batches >= 16
    replay = [
        {"offset": 1000, "actions": [batch(b) for b in mine[p] if b >= CHECKPOINT] + [["flush"]]}
        for p in range(4)
    ]
    assert run_processes(root, "r1", replay) == [0, 0, 0, 0]
    assert not torn.exists()  # swept: its writer is dead

    got = log.frame().sort("position")
    assert got["position"].to_list() == list(range(BATCH * BATCHES))  # each draw exactly once
    cut = CHECKPOINT * BATCH
    assert got["value"].to_list() == [float(k + (1000 if k >= cut else 0)) for k in range(256)]
    assert got["rank"].to_list() == [(k // BATCH) % 4 // 2 for k in range(256)]
    assert got["sample_id"].to_list() == [k % N for k in range(256)]
    raw = pl.concat([pl.read_ipc(p) for p in segments(log)])
    assert raw.height == len(want) + (BATCHES - CHECKPOINT) * BATCH  # replays were written
    names = {p.name.split("-r", 1)[1] for p in segments(log)}
    assert {n.split("-")[0] for n in names} == {"0", "1"}  # segments name their rank


FORK = r"""
import os, sys
import polars as pl
import datasetrt as drt
ds = drt.open(sys.argv[1])
log = ds.score_log("loss", run="fork")
log.append([0, 0, 0], [0, 1, 2], [1.0, 1.0, 1.0], epoch=0, position=0)  # buffered
pid = os.fork()
if pid == 0:  # the child writes its own rows, not the parent's
    log.append([0, 0], [3, 4], [2.0, 2.0], epoch=0, position=3)
    log.flush()
    os._exit(0)
assert os.waitpid(pid, 0)[1] == 0
log.flush()
print(sum(pl.read_ipc(p).height for p in sorted(log.path.rglob("*.arrow"))))
print(log.frame().sort("position")["value"].to_list())
"""


def test_a_forked_child_does_not_write_the_parents_rows(ds):
    root = Path(ds.caches[0]["path"]).parent
    out = run_child(FORK, root).split("\n")
    assert out[0] == "5"  # 3 rows from the parent, 2 from the child: none twice
    assert out[1] == "[1.0, 1.0, 1.0, 2.0, 2.0]"


def test_bytes_like_columns_are_refused_not_read_as_raw_bytes(ds):
    """array.array reads a bytearray as machine words: eight small integers
    were one value 2.0, a cache_id of eight bytes one id. Refused, as bytes are."""
    cid = ds.caches[0]["cache_id"]
    log = ds.score_log("loss", run="r1")
    eight = bytearray([0, 0, 0, 0, 0, 0, 0, 64])  # 2.0 as a little-endian double
    for args, kwargs, column in [
        (([cid] * 8, list(range(8)), eight), {"position": 0}, "values"),
        ((bytearray(8), [0], [1.0]), {"position": 0}, "cache_id"),
        (([cid], bytearray(8), [1.0]), {"position": 0}, "sample_id"),
        (([cid], [0], [1.0]), {"position": bytearray(8)}, "position"),
    ]:
        with pytest.raises(drt.InvalidInputError, match=f"^{column} must be a list.*bytearray$"):
            log.append(*args, epoch=0, **kwargs)
    assert log.frame().height == 0  # nothing was buffered


def test_a_damaged_segment_is_a_corrupt_cache_error_naming_it_and_verify_reports_it(ds):
    cid = ds.caches[0]["cache_id"]
    log = ds.score_log("loss", run="r1")
    for epoch in range(2):
        log.append([cid] * 3, [0, 1, 2], [1.0, 2.0, 3.0], epoch=epoch, position=0)
        log.flush()
    assert log.frame().height == 6 and ds.verify().is_empty()
    first, second = segments(log)
    whole = second.read_bytes()
    # cut short (any length), emptied, or a file of other columns
    damages = [whole[: len(whole) // 2], whole[:-1], b"", b"ARROW1\x00\x00ARROW1"]
    other = pl.DataFrame({"epoch": [0]})
    other.write_ipc(second)
    damages.append(second.read_bytes())
    # one flipped bit in a logged loss (3.0 -> 3.0000000000000004): the
    # file still decodes, its seal does not match
    flipped = bytearray(whole)
    flipped[whole.index(struct.pack("<d", 3.0))] ^= 0x01
    damages.append(bytes(flipped))
    for damaged in damages:
        second.write_bytes(damaged)
        with pytest.raises(drt.CorruptCacheError, match=second.name) as info:
            log.frame()
        assert os.fspath(info.value.path) == str(second)
        with pytest.raises(drt.CorruptCacheError, match=second.name):
            log.register("scores")
        report = ds.verify()
        assert report.rows() == [("CorruptCacheError", str(second), str(info.value))]
    second.write_bytes(whole)
    assert log.frame().height == 6 and ds.verify().is_empty()
    assert first.exists()


def test_a_score_recipe_over_a_log_with_no_rows_for_the_population_says_so(ds, tmp_path):
    version = ds.version
    log = ds.score_log("loss", run="r1")
    log.register("scores")  # nothing logged yet
    for recipe, params in [("loss_ema_weights", {"alpha": 0.5}), ("focal_weights", {"gamma": 1})]:
        with pytest.raises(drt.InvalidInputError, match="no rows for the population") as info:
            ds.apply_sql(recipe, **params)
        assert "is empty" in str(info.value) and recipe in str(info.value)
        assert "null" not in str(info.value)
    # a log of samples the population does not hold
    log.append([12345] * 3, [0, 1, 2], [1.0, 2.0, 3.0], epoch=0, position=0)
    log.register("scores")
    recipe = tmp_path / "by_score.sql"
    recipe.write_text(
        "SELECT m.* EXCLUDE (weight), s.value AS weight\n"
        "FROM metadata m JOIN scores s USING (cache_id, sample_id)"
    )
    with pytest.raises(drt.InvalidInputError, match="none of its 3 rows names a sample"):
        ds.apply_sql(recipe)
    assert ds.version == version
    # a recipe that fails for another reason keeps its own error
    cid = ds.caches[0]["cache_id"]
    log.append([cid], [0], [-1.0], epoch=0, position=0)
    log.register("scores")
    with pytest.raises(drt.InvalidInputError, match="weight") as info:
        ds.apply_sql("loss_ema_weights", alpha=1.0)
    assert "no rows for the population" not in str(info.value)
    assert ds.version == version


# -- the per-sample state, kept by the engine ------------------------------------
def state_of(frame: pl.DataFrame, alpha: float) -> pl.DataFrame:
    """The state computed from every logged row at once, independently of
    the engine: per sample and epoch the mean, then the moving average."""
    per_epoch = frame.group_by("cache_id", "sample_id", "epoch").agg(
        pl.col("value").mean().alias("loss"), pl.len().alias("rows")
    )
    rows = []
    for (cid, sid), group in per_epoch.group_by("cache_id", "sample_id"):
        group = group.sort("epoch")
        ema = None
        for loss in group["loss"]:
            ema = loss if ema is None else alpha * loss + (1 - alpha) * ema
        rows.append(
            {
                "cache_id": cid,
                "sample_id": sid,
                "count": int(group["rows"].sum()),
                "first_epoch": int(group["epoch"].min()),
                "last_epoch": int(group["epoch"].max()),
                "last_loss": float(group["loss"][-1]),
                "ema_loss": float(ema),
            }
        )
    return pl.DataFrame(rows).sort("cache_id", "sample_id")


def assert_state(got: pl.DataFrame, expected: pl.DataFrame) -> None:
    got = got.sort("cache_id", "sample_id")
    exact = ["cache_id", "sample_id", "count", "first_epoch", "last_epoch"]
    assert got.select(exact).cast(pl.Int64).equals(expected.select(exact).cast(pl.Int64))
    for column in ("last_loss", "ema_loss"):
        assert np.allclose(got[column].to_numpy(), expected[column].to_numpy(), rtol=1e-12)


def test_the_state_refreshed_each_epoch_equals_every_row_read_at_once(ds):
    """Four epochs of losses (numpy, torch and lists), a step replayed after
    a resume and a late segment of an old epoch: after each, the engine's
    incremental state equals the state of the whole log."""
    import torch

    log = ds.score_log("loss", run="state")
    rng = np.random.default_rng(7)
    for epoch in range(4):
        for i, batch in enumerate(ds.loader(16, seed=3, epoch=epoch, sampling="replacement")):
            losses = rng.random(len(batch)) * 3
            kind = (epoch + i) % 3
            values = (
                losses
                if kind == 0
                else torch.from_numpy(losses).float()
                if kind == 1
                else list(losses)
            )
            log.append_batch(batch, values, epoch=epoch)
            if i % 3 == 0:
                log.flush()  # several segments an epoch
        assert_state(log.state(alpha=0.3), state_of(log.frame(), 0.3))
    # a replayed step of epoch 3 replaces its rows; then a late row of epoch 0
    first = next(iter(ds.loader(16, seed=3, epoch=3, sampling="replacement")))
    log.append_batch(first, [100.0] * len(first), epoch=3)
    assert_state(log.state(alpha=0.3), state_of(log.frame(), 0.3))
    log.append([first.cache_id[0]], [first.sample_id[0]], [42.0], epoch=0, position=10**6)
    assert_state(log.state(alpha=0.3), state_of(log.frame(), 0.3))
    # another alpha is another state; the SQL table is the same frame
    table = log.register_state("score_state", alpha=1.0)
    assert_state(table, state_of(log.frame(), 1.0))
    by_sql = ds.sql("SELECT count(*) AS n, sum(count) AS rows FROM score_state")
    assert by_sql.row(0) == (table.height, log.frame().height)


def test_state_refuses_a_bad_alpha_and_values_that_are_not_finite(ds):
    log = ds.score_log("loss", run="bad")
    for alpha in (0, -0.5, 1.5, float("nan"), True, "0.5"):
        with pytest.raises(drt.InvalidInputError, match="alpha"):
            log.state(alpha=alpha)
    batch = next(iter(ds.loader(4, seed=1)))
    for bad in (np.array([1.0, np.nan, 2.0, 3.0]), np.array([np.inf] * 4)):
        with pytest.raises(drt.InvalidInputError, match="not finite"):
            log.append_batch(batch, bad, epoch=0)
    with pytest.raises(drt.InvalidInputError, match="equally long"):
        log.append_batch(batch, np.ones(3), epoch=0)
    assert log.frame().height == 0 and log.state().height == 0


REWEIGHT = r"""
import sys
import datasetrt as drt
ds = drt.open(sys.argv[1])
ds.score_log("loss", run="repeat").register("scores")
number = ds.apply_sql("loss_ema_weights", alpha=0.5)
print(number)
print(ds.draws(11, 0, count=400, sampling="replacement", version=number).to_list())
"""


def test_a_recipe_over_a_join_stores_the_same_population_in_fresh_processes(ds):
    """A recipe without ORDER BY (a join of the population with a score
    log) stores its rows in one canonical order: run twice in fresh
    processes, it stores the same rows in the same order, so the same seed
    draws the same samples."""
    cid = ds.caches[0]["cache_id"]
    log = ds.score_log("loss", run="repeat")
    rng = np.random.default_rng(3)
    for epoch in range(3):
        log.append([cid] * N, list(range(N)), rng.random(N), epoch=epoch, position=0)
    log.flush()
    root = Path(ds.caches[0]["path"]).parent
    first, second = (run_child(REWEIGHT, root).split("\n") for _ in range(2))
    assert first[0] != second[0]  # two snapshots
    assert first[1] == second[1]  # the same draws
    ds.refresh()
    a, b = (ds.get_metadata(int(out[0])) for out in (first, second))
    assert a.equals(b)
    assert a.select("cache_id", "sample_id").equals(a.select("cache_id", "sample_id").sort("*"))


# -- the native reweight (issue 50 section 1) --------------------------------------
def logged(ds, epochs: int = 3) -> drt.ScoreLog:
    """A run that scored samples 0..99 of the population (100..119 unscored)
    over ``epochs`` epochs, and rows of samples the population lacks."""
    cid = ds.caches[0]["cache_id"]
    log = ds.score_log("loss", run="rw")
    rng = np.random.default_rng(5)
    for epoch in range(epochs):
        log.append([cid] * 100, list(range(100)), rng.random(100) * 3, epoch=epoch, position=0)
        log.append([cid + 99] * 5, list(range(5)), [9.0] * 5, epoch=epoch, position=100)
    return log


def with_reference(ds) -> None:
    """Column il_loss: null for every 9th sample, and 10 rows twice."""
    meta = ds.get_metadata().sort("sample_id")
    il = [None if i % 9 == 4 else (i * 7 % 11) / 4 for i in range(meta.height)]
    meta = meta.with_columns(il_loss=pl.Series(il, dtype=pl.Float64))
    ds.update_metadata(pl.concat([meta, meta.head(10)]))


@pytest.mark.parametrize("shape", ["rank", "linear", "threshold"])
@pytest.mark.parametrize("reference", ["il_loss", None])
def test_reweight_equals_its_sql_recipe(ds, shape, reference):
    """log.reweight commits, natively, the weights the shaped SQL recipe
    computes over the registered state: one rule, two ways to run it."""
    with_reference(ds)
    log = logged(ds)
    base = ds.version
    recipe = "reducible_loss_weights" if reference else "loss_ema_weights_shaped"
    log.register_state("score_state", alpha=0.3)
    params = {"shape": shape, "floor": 0.1, "cap": 1.8, "anneal": 0.2}
    by_sql = ds.get_metadata(ds.apply_sql(recipe, **params))
    ds.checkout(base)
    native = log.reweight(reference=reference, alpha=0.3, **params)
    got = ds.get_metadata(native)
    assert got.drop("weight").equals(ds.get_metadata(base).drop("weight"))  # rows kept as they were
    keys = ["sample_id", "il_loss"]
    want = by_sql.sort(keys, nulls_last=True)["weight"].to_numpy()
    assert np.allclose(got.sort(keys, nulls_last=True)["weight"].to_numpy(), want, rtol=1e-12)
    weights = got["weight"].to_numpy()
    assert weights.mean() == pytest.approx(1.0) and len(set(weights.round(9))) > 2
    assert 0.1 * (1 - 1e-9) <= weights.min() and weights.max() <= 1.8 * (1 + 1e-9)
    # unscored rows, and rows without a reference, weigh the mean
    mean_weight = got.filter(pl.col("sample_id") >= 100)["weight"]
    assert (mean_weight == 1.0).all()
    if reference:
        assert (got.filter(pl.col("il_loss").is_null())["weight"] == 1.0).all()
    assert "reweight by loss/rw" in ds.history()["note"][-1]


def test_reweight_follows_new_segments_and_refuses_a_moved_head(ds):
    log = logged(ds, epochs=1)
    first = ds.get_metadata(log.reweight(shape="linear", cap=50.0, floor=0.0))
    cid = ds.caches[0]["cache_id"]
    # epoch 1: sample 0's loss jumps; alpha 0.5 -> its ema rises, it weighs more
    log.append([cid], [0], [100.0], epoch=1, position=0)
    second = ds.get_metadata(log.reweight(shape="linear", cap=50.0, floor=0.0))
    w = lambda meta: meta.filter(pl.col("sample_id") == 0)["weight"][0]  # noqa: E731
    assert w(second) > 5 * w(first)
    other = drt.open(ds.paths[0])
    other.update_metadata(other.get_metadata())  # another writer moves the head
    with pytest.raises(drt.ConflictError):
        log.reweight()


@pytest.mark.parametrize(
    ("options", "match", "column"),
    [
        ({"shape": "ranked"}, "shape must be", "shape"),
        ({"floor": 1.5}, "floor must be", "floor"),
        ({"cap": 0.9}, "cap must be", "cap"),
        ({"anneal": -0.1}, "anneal must be", "anneal"),
        ({"floor": "0.1"}, "floor must be a number", "floor"),
        ({"alpha": 0.0}, "alpha", "alpha"),
        ({"reference": "nope"}, "no reference column", "nope"),
        ({"reference": "label_name"}, "must be numeric", "label_name"),
        ({"reference": "bad_loss"}, "holds NaN at row 3", "bad_loss"),
        ({"reference": "inf_loss"}, "holds inf", "inf_loss"),
    ],
)
def test_reweight_refuses_bad_inputs_by_name(ds, options, match, column):
    meta = ds.get_metadata()
    bad = [float("nan") if i == 3 else 1.0 for i in range(meta.height)]
    ds.update_metadata(
        meta.with_columns(
            label_name=pl.lit("x"),
            bad_loss=pl.Series(bad),
            inf_loss=pl.Series([math.inf] * meta.height),
        )
    )
    log = logged(ds, epochs=1)
    version = ds.version
    with pytest.raises(drt.InvalidInputError, match=match) as info:
        log.reweight(**options)
    assert info.value.column == column
    assert ds.version == version


def test_population_reports_how_far_weights_collapsed(ds):
    """The loop's diagnostics: ESS, the draws on the heaviest 1 % of rows,
    and the draws on rows a predicate picks, against numpy, whole and by label."""
    with_reference(ds)
    logged(ds).reweight(reference="il_loss", shape="linear", floor=0.0, cap=20.0)
    meta = ds.get_metadata()
    for where in ("il_loss > 1.5", pl.col("il_loss") > 1.5):
        report = ds.population("label", where=where)
        for row in report.iter_rows(named=True):
            group = meta.filter(pl.col("label") == row["label"])
            w = group["weight"].to_numpy()
            top = np.sort(w)[::-1][: math.ceil(0.01 * len(w))].sum() / w.sum()
            hit = group["il_loss"].fill_null(0.0).to_numpy() > 1.5
            assert row["top_share"] == pytest.approx(top, rel=1e-12)
            assert row["where_share"] == pytest.approx(w[hit].sum() / w.sum(), rel=1e-12)
            assert row["ess"] == pytest.approx(w.sum() ** 2 / (w**2).sum(), rel=1e-12)
    whole = ds.population(where="il_loss > 1.5").row(0, named=True)
    w = meta["weight"].to_numpy()
    assert whole["top_share"] == pytest.approx(np.sort(w)[-2:].sum() / w.sum())  # 2 of 130 rows
    assert whole["top_share"] > 2 / meta.height  # the reweight put more than 1 % there
    assert "where_share" not in ds.population().columns
    with pytest.raises(drt.InvalidInputError, match="where"):
        ds.population(where="no_such_column >")
