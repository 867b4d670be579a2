"""Crashes and full disks: a process killed (SIGKILL) at a random point of a
build, a commit, a tag or a cleanup leaves a root that opens on a population
that was committed, with every payload intact and no temporary files after
the next open; a full disk is a StorageError naming a path that changes
nothing, never a SIGBUS.

Every operation that is killed runs in a child process, which arms a timer
right before the operation to SIGKILL itself after a seeded random delay
(from inside, the kill lands on time even in an operation of a few
milliseconds). The checks run in the parent, on a copy of the root that no
process opened before. pytest-timeout is not installed: every child runs
under a subprocess timeout instead.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from subprocess import PIPE
from typing import Any

import polars as pl
import pytest

import datasetrt as drt
from conftest import Source

TRIALS = 15
CHILD_TIMEOUT = 60


def leftovers(root: Path) -> list[str]:
    """Temporary files and staging directories anywhere under `root`."""
    return sorted(str(p.relative_to(root)) for p in root.rglob(".tmp-*"))


KILLER = r"""
import os, signal, sys, threading

_DELAY = float(sys.argv.pop(1))


def arm():  # SIGKILL this process _DELAY seconds from now (never, when negative)
    if _DELAY >= 0:
        timer = threading.Timer(_DELAY, os.kill, (os.getpid(), signal.SIGKILL))
        timer.daemon = True
        timer.start()
"""


def run_killed(script: str, *args: object, delay: float | None) -> tuple[int, list[str]]:
    """Run `script` in a child that SIGKILLs itself `delay` seconds after it
    calls arm() (None: never). Returns its exit status and stdout lines; the
    child is reaped, so its pid is gone when this returns."""
    done = subprocess.run(
        [sys.executable, "-c", KILLER + script, str(-1 if delay is None else delay)]
        + [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
    )
    assert done.returncode in (0, -signal.SIGKILL), f"exit {done.returncode}: {done.stderr}"
    return done.returncode, done.stdout.splitlines()


def finished_run(script: str, *args: object) -> tuple[float, list[str]]:
    """Run `script` to the end; returns the seconds it reported last and its lines."""
    rc, lines = run_killed(script, *args, delay=None)
    assert rc == 0
    return float(lines[-1].split()[-1]), lines


# -- (a) build ---------------------------------------------------------------

BIG_SOURCE = r"""
import random
_NOISE = random.Random(1234).randbytes(1 << 16)
BIG_N = 12_000


def big_payload(i):
    if i % 3 == 0:  # compresses
        return i.to_bytes(8, "little") * (128 + i % 64)
    start = (i * 7919) % (len(_NOISE) - 4096)
    return i.to_bytes(8, "little") + _NOISE[start : start + 1024 + i % 2048]
"""
_big: dict[str, Any] = {}
exec(BIG_SOURCE, _big)
BIG_N: int = _big["BIG_N"]
big_payload = _big["big_payload"]

BUILD = (
    BIG_SOURCE
    + r"""
import sys, time
import datasetrt as drt


class Big:
    name = "big-v1"

    def __iter__(self):
        for i in range(BIG_N):
            yield drt.CacheInput(big_payload(i), {"label": i % 10})


arm()
t0 = time.perf_counter()
drt.build(sys.argv[1], [Big()], shard_bytes=1 << 20, progress=False)
print("built", time.perf_counter() - t0, flush=True)
"""
)


def check_built_root(root: Path) -> str:
    """After a killed build: the cache is whole or absent. Returns "published"
    or "absent"."""
    visible = sorted(p.name for p in root.iterdir() if not p.name.startswith((".", "_")))
    assert visible in ([], ["big-v1"]), f"a half-built cache is visible: {visible}"
    if not visible:
        with pytest.raises(drt.CacheNotFoundError):
            drt.open(root)
        return "absent"
    ds = drt.open(root)  # whole: every check of open passes
    assert len(ds) == BIG_N and ds.version == 0
    meta = ds.get_metadata()
    assert meta["sample_id"].to_list() == list(range(BIG_N))
    assert (meta["weight"] == 1.0).all()
    assert meta["label"].to_list() == [i % 10 for i in range(BIG_N)]
    seen = 0
    for batch in ds.loader(2048, seed=0, sampling="permutation"):
        for sid, data in zip(batch.sample_id, batch.data, strict=True):
            assert data == big_payload(sid), f"sample {sid} reads back wrong"
            seen += 1
    assert seen == BIG_N
    assert leftovers(root) == [], "open left the killed build's temporary files"
    return "published"


def test_kill_during_build_leaves_the_whole_cache_or_none(tmp_path):
    elapsed, _ = finished_run(BUILD, tmp_path / "calibration")
    assert check_built_root(tmp_path / "calibration") == "published"
    rng = random.Random(1)
    states = []
    for trial in range(TRIALS):
        root = tmp_path / f"trial-{trial}"
        root.mkdir()
        rc, _ = run_killed(BUILD, root, delay=rng.uniform(0, 1.2 * elapsed))
        state = check_built_root(root)
        states.append(state)
        assert rc == -signal.SIGKILL or state == "published"
        # the next build in the root clears what the killed one left
        drt.build(root, [Source("tiny-v1", 5)], progress=False)
        assert leftovers(root) == []
        names = sorted(c["name"] for c in drt.open(root).caches)
        assert names == (["big-v1", "tiny-v1"] if state == "published" else ["tiny-v1"])
    print(f"\nbuild: {TRIALS} kills, cache afterwards: {dict(Counter(states))}")


# -- (b) update_metadata --------------------------------------------------------

POPULATION = r"""
import polars as pl

ROUNDS = 5


def population(meta, k):
    return meta.filter(pl.col("sample_id") % (k + 2) != 0).with_columns(
        (1.0 + pl.col("sample_id") % (k + 3)).alias("weight"),
        pl.lit(k).alias("round"),
    )
"""
_pop: dict[str, Any] = {}
exec(POPULATION, _pop)
ROUNDS: int = _pop["ROUNDS"]
population = _pop["population"]

UPDATES = (
    POPULATION
    + r"""
import sys, time
import datasetrt as drt

ds = drt.open(sys.argv[1])
frames = [population(ds.get_metadata(), k) for k in range(ROUNDS)]
arm()
t0 = time.perf_counter()
for i in range(int(sys.argv[2])):
    ds.update_metadata(frames[i % ROUNDS])
    os.write(1, f"committed {i}\n".encode())  # one write: a kill never cuts it
print("done", time.perf_counter() - t0, flush=True)
"""
)


def check_payloads(ds: drt.Dataset, source: Source) -> None:
    """Every row of one epoch reads back its source's payload."""
    rows = 0
    for batch in ds.loader(256, seed=3, sampling="permutation"):
        for sid, data in zip(batch.sample_id, batch.data, strict=True):
            assert data == source.payload(sid), f"sample {sid} reads back wrong"
            rows += 1
    assert rows == len(ds)


@pytest.fixture
def committed(tmp_path):
    """A root with one cache at snapshot 0 (the template of every trial), and
    the fingerprint and population each round of updates commits."""
    src = Source("upd-v1", 300)
    template = tmp_path / "template"
    drt.build(template, [src], progress=False)
    reference = tmp_path / "reference"
    shutil.copytree(template, reference)
    ds = drt.open(reference)
    meta = ds.get_metadata()
    expected = {-1: (ds.fingerprint, meta)}  # before the first round
    for k in range(ROUNDS):
        ds.update_metadata(population(meta, k))
        expected[k] = (ds.fingerprint, ds.get_metadata())
    assert len({fp for fp, _ in expected.values()}) == ROUNDS + 1
    return template, src, expected


def test_kill_during_update_loop_leaves_the_old_or_the_new_population(tmp_path, committed):
    template, src, expected = committed
    calibration = tmp_path / "calibration"
    shutil.copytree(template, calibration)
    elapsed, _ = finished_run(UPDATES, calibration, 20)
    rng = random.Random(2)
    heads = []
    for trial in range(TRIALS):
        root = tmp_path / f"trial-{trial}"
        shutil.copytree(template, root)
        rc, lines = run_killed(UPDATES, root, 100_000, delay=rng.uniform(0, 12 * elapsed / 20))
        assert rc == -signal.SIGKILL, "the loop ended before the kill"
        done = [int(line.split()[1]) for line in lines if line.startswith("committed")]
        last = done[-1] if done else -1
        allowed = {
            expected[-1 if i < 0 else i % ROUNDS][0]: i for i in (last, last + 1)
        }  # fingerprint -> the commit that made it
        ds = drt.open(root)
        assert ds.fingerprint in allowed, (
            f"after commit {last} the head is {ds.version} with an unknown population"
        )
        i = allowed[ds.fingerprint]
        assert ds.get_metadata().equals(expected[-1 if i < 0 else i % ROUNDS][1])
        heads.append((last, i))
        check_payloads(ds, src)
        assert leftovers(root) == [], "open left the killed commit's temporary files"
        # the next commit lands on top of it
        head = ds.version
        version = ds.update_metadata(population(expected[-1][1], 0))
        again = drt.open(root)
        assert again.version == version and again.fingerprint == expected[0][0]
        assert again.history()["parent"].to_list()[-1] == head
    print(f"\nupdate_metadata: {TRIALS} kills, (last printed, head) = {heads}")


# -- (c) tag -----------------------------------------------------------------------

TAGS = r"""
import sys, time
import datasetrt as drt

ds = drt.open(sys.argv[1])
arm()
t0 = time.perf_counter()
for i in range(int(sys.argv[2])):
    ds.tag(f"t{i % 3}", (i * 7) % 4)
    os.write(1, f"tagged {i}\n".encode())  # one write: a kill never cuts it
print("done", time.perf_counter() - t0, flush=True)
"""


def tag_write(i: int) -> tuple[str, int]:
    return f"t{i % 3}", (i * 7) % 4


def test_kill_during_tag_loop_leaves_each_tag_old_or_new(tmp_path):
    src = Source("tag-v1", 100)
    template = tmp_path / "template"
    ds = drt.build(template, [src], progress=False)
    meta = ds.get_metadata()
    frames = {0: meta}
    for n in (1, 2, 3):
        assert ds.update_metadata(meta.filter(pl.col("sample_id") % (n + 1) == 0)) == n
        frames[n] = ds.get_metadata()
    calibration = tmp_path / "calibration"
    shutil.copytree(template, calibration)
    elapsed, _ = finished_run(TAGS, calibration, 20)
    rng = random.Random(3)
    tag_leftovers = 0
    for trial in range(TRIALS):
        root = tmp_path / f"trial-{trial}"
        shutil.copytree(template, root)
        rc, lines = run_killed(TAGS, root, 100_000, delay=rng.uniform(0, 12 * elapsed / 20))
        assert rc == -signal.SIGKILL, "the loop ended before the kill"
        done = [int(line.split()[1]) for line in lines if line.startswith("tagged")]
        last = done[-1] if done else -1
        ds = drt.open(root)
        # (a killed tag write's temporary file in tags/ is left: see
        # test_open_removes_temporary_files_of_dead_processes)
        left = leftovers(root)
        assert [p for p in left if "/tags/" not in p] == []
        tag_leftovers += len(left)
        tags = ds.tags()
        for name in ("t0", "t1", "t2"):
            written = [v for n, v in map(tag_write, range(last + 1)) if n == name]
            allowed = {written[-1] if written else None}
            if tag_write(last + 1)[0] == name:
                allowed.add(tag_write(last + 1)[1])
            assert tags.get(name) in allowed, (name, tags, last)
        assert set(tags) <= {"t0", "t1", "t2"}
        for name, number in tags.items():
            ds.checkout(name)
            assert ds.version == number and ds.get_metadata().equals(frames[number])
        ds.checkout(3)
        ds.tag("after", 2)
        assert drt.open(root).tags()["after"] == 2
        check_payloads(ds, src)
    print(f"\ntag: {TRIALS} kills, {tag_leftovers} temporary tag files left after open")


# -- (d) cleanup ---------------------------------------------------------------

SNAPSHOTS = 40
HEAD_AT = 20
TAGGED = {"keep-a": 5, "keep-b": 12}

CLEANUP = r"""
import glob, time
import datasetrt as drt

ds = drt.open(sys.argv[1])
watch = sys.argv[2]  # "time", or "<glob>:<n>": kill once at most n files match
if watch == "time":
    arm()
else:
    pattern, most = watch.rsplit(":", 1)

    def watcher():
        while len(glob.glob(pattern)) > int(most):
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watcher, daemon=True).start()
t0 = time.perf_counter()
removed = ds.cleanup(keep=3)
print("removed", len(removed), time.perf_counter() - t0, flush=True)
"""


def population_at(ds: drt.Dataset, number: int) -> pl.DataFrame:
    """Snapshot `number`, read without moving the head (as a pickled dataset
    reopens the snapshot it was pickled at)."""
    pinned = drt.Dataset.__new__(drt.Dataset)
    pinned.__setstate__({**ds.__getstate__(), "snapshot": number})
    assert pinned.version == number and ds.head == ds.version
    return pinned.get_metadata()


def test_kill_during_cleanup_keeps_every_kept_snapshot_readable(tmp_path):
    src = Source("gc-v1", 120)
    template = tmp_path / "template"
    ds = drt.build(template, [src], progress=False)
    meta = ds.get_metadata()
    frames = {0: meta}
    for n in range(1, SNAPSHOTS + 1):
        frame = meta.filter(pl.col("sample_id") % (n % 7 + 2) != n % 3).with_columns(
            pl.lit(n).alias("round"), (pl.col("sample_id") % 5 + n).cast(pl.Float64).alias("weight")
        )
        assert ds.update_metadata(frame) == n
        frames[n] = ds.get_metadata()
    for name, number in TAGGED.items():
        ds.tag(name, number)
    ds.checkout(HEAD_AT)  # the head is not the newest snapshot
    kept = {SNAPSHOTS - 2, SNAPSHOTS - 1, SNAPSHOTS, HEAD_AT, *TAGGED.values()}

    snapdir = ds.snapshot_path.parent.relative_to(template)
    calibration = tmp_path / "calibration"
    shutil.copytree(template, calibration)
    elapsed, lines = finished_run(CLEANUP, calibration, "time")
    assert int(lines[-1].split()[1]) == SNAPSHOTS + 1 - len(kept)
    columns_kept = len(list((calibration / snapdir / "columns").iterdir()))
    columns = len(list((template / snapdir / "columns").iterdir()))
    # The deletions take a fraction of a millisecond (the fsync after them most
    # of the rest), too short to aim at with a timer: a third of the kills
    # come at a random time, the others once a random number of the snapshot
    # manifests, or of the column files, is gone.
    rng = random.Random(4)
    outcomes = []
    for trial in range(TRIALS):
        root = tmp_path / f"trial-{trial}"
        shutil.copytree(template, root)
        watch, delay = "time", elapsed * 10 ** rng.uniform(-2.5, 0)
        if trial % 3 == 1:
            watch = f"{root / snapdir}/*.snapshot:{rng.randrange(len(kept) + 1, SNAPSHOTS)}"
        elif trial % 3 == 2:
            watch = f"{root / snapdir}/columns/*:{rng.randrange(columns_kept + 1, columns)}"
        rc, _ = run_killed(CLEANUP, root, watch, delay=delay)
        ds = drt.open(root)
        assert leftovers(root) == []
        assert ds.version == HEAD_AT and ds.get_metadata().equals(frames[HEAD_AT])
        assert ds.tags() == TAGGED
        survivors = ds.history()["version"].to_list()
        assert kept <= set(survivors), f"cleanup lost kept snapshots: {kept - set(survivors)}"
        left = len(list((root / snapdir / "columns").iterdir()))
        outcomes.append((rc, len(survivors), left))
        for number in survivors:  # whatever is listed is whole
            assert population_at(ds, number).equals(frames[number]), number
        check_payloads(ds, src)
        ds.cleanup(keep=3)  # the interrupted cleanup completes
        assert set(ds.history()["version"].to_list()) == kept
        for number in sorted(kept):
            assert population_at(ds, number).equals(frames[number]), number
        ds.checkout("keep-a")
        assert ds.get_metadata().equals(frames[TAGGED["keep-a"]])
        assert drt.open(root).version == TAGGED["keep-a"]
    print(f"\ncleanup: {TRIALS} kills, (exit status, snapshots, column files left) = {outcomes}")


def test_a_crash_between_the_first_snapshot_and_its_head_leaves_a_root_that_opens(tmp_path):
    """The first open of a root publishes snapshot 0 and then writes HEAD; a
    process killed between the two leaves 00000000.snapshot without HEAD (the
    state made here; kill -9 at random points of a first open hits it about
    once in 20). Snapshot 0 is then the only population there ever was, so
    open must adopt it (or never leave this state) rather than refuse forever."""
    ds = drt.build(tmp_path, [Source("first-v1", 20)], progress=False)
    snapdir = ds.snapshot_path.parent
    assert sorted(p.name for p in snapdir.glob("*.snapshot")) == ["00000000.snapshot"]
    (snapdir / "HEAD").unlink()
    reopened = drt.open(tmp_path)
    assert reopened.version == 0 and len(reopened) == 20


# -- leftovers of dead processes ----------------------------------------------------


def temp_host() -> str:
    """This machine's name as temporary names carry it (letters, digits, dots)."""
    raw = socket.gethostname()
    return "".join(c for c in raw if c.isascii() and (c.isalnum() or c == "."))[:64] or "localhost"


@pytest.mark.parametrize(
    "where",
    [
        "root",
        "snapshot dir",
        "columns",
        "tags",
    ],
)
def test_open_removes_temporary_files_of_dead_processes(tmp_path, where):
    ds = drt.build(tmp_path, [Source("left-v1", 10)], progress=False)
    ds.tag("t", 0)
    snapdir = ds.snapshot_path.parent
    folder = {
        "root": tmp_path,
        "snapshot dir": snapdir,
        "columns": snapdir / "columns",
        "tags": snapdir / "tags",
    }[where]
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], stdout=PIPE)
    dead, host = int(child.stdout), temp_host()
    assert not Path(f"/proc/{dead}").exists()
    stale = [folder / f".tmp-{dead}@{host}-3-HEAD", folder / f".tmp-{dead}@{host}-4-staging-x"]
    stale[0].write_bytes(b"half written")
    stale[1].mkdir()
    (stale[1] / "shard-00000.drts").write_bytes(b"half written")
    kept = [  # a live process's, another machine's
        folder / f".tmp-{os.getpid()}@{host}-5-HEAD",
        folder / f".tmp-{dead}@elsewhere-6-HEAD",
    ]
    for path in kept:
        path.write_bytes(b"in use")
    drt.open(tmp_path)
    assert [p.name for p in stale if p.exists()] == []
    assert all(p.exists() for p in kept)


# -- full disk ---------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB tmpfs (needs root or CAP_SYS_ADMIN); always unmounted."""
    if shutil.which("mount") is None or shutil.which("umount") is None:
        pytest.skip("no mount/umount command to make a small disk")
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(
            f"cannot mount a 3 MiB tmpfs at {disk} (needs root or CAP_SYS_ADMIN): "
            f"{done.stderr.strip()}"
        )
    try:
        yield disk
    finally:
        if subprocess.run(["umount", str(disk)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)


DISK = r"""
import json, random, sys
import polars as pl
import datasetrt as drt


def outcome(fn):
    try:
        fn()
        return {"ok": True}
    except BaseException as exc:  # a pyo3 PanicException is a BaseException
        return {
            "error": type(exc).__name__,
            "storage": isinstance(exc, drt.StorageError),
            "oserror": isinstance(exc, OSError),
            "message": str(exc),
            "path": None if getattr(exc, "path", None) is None else str(exc.path),
        }


class Src:
    def __init__(self, name, n, size):
        self.name, self.n, self.size = name, n, size

    def __iter__(self):
        for i in range(self.n):
            yield drt.CacheInput(random.Random(i).randbytes(self.size), {"label": i % 4})


def reweighted(meta):
    return meta.with_columns((1.0 + pl.col("sample_id") % 7).alias("weight"))


def epoch(ds, sampling):
    return sum(len(b) for b in ds.loader(32, seed=1, sampling=sampling))


root, mode = sys.argv[1], sys.argv[2]
out = {}
if mode == "too-big":
    out["build"] = outcome(lambda: drt.build(root, [Src("huge-v1", 400, 10_000)], codec="none",
                                              progress=False))
elif mode == "setup":
    ds = drt.build(root, [Src("small-v1", 200, 500)], codec="none", progress=False)
    ds.update_metadata(reweighted(ds.get_metadata()))  # no loader yet: no alias table
    out["version"] = ds.version
elif mode == "full":
    ds = drt.open(root)
    version, meta = ds.version, ds.get_metadata()
    out["update"] = outcome(lambda: ds.update_metadata(
        meta.with_columns((pl.col("label") + 100).alias("label"))))
    # every column of this one is stored: only its manifest is written
    out["update of stored columns"] = outcome(lambda: ds.update_metadata(meta))
    out["replacement loader"] = outcome(lambda: epoch(ds, "replacement"))
    out["build"] = outcome(lambda: drt.build(root, [Src("more-v1", 50, 2_000)], codec="none",
                                              progress=False))
    out["after"] = [ds.version, ds.head, ds.get_metadata().equals(meta),
                    epoch(ds, "permutation"), drt.open(root).version == version]
elif mode == "recover":
    ds = drt.open(root)
    out["replacement loader"] = epoch(ds, "replacement")
    out["update"] = ds.update_metadata(reweighted(ds.get_metadata().head(50)))
print(json.dumps(out))
"""


def run_on_disk(root: Path, mode: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", DISK, str(root), mode],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
    )
    assert done.returncode >= 0, f"{mode}: killed by signal {-done.returncode}: {done.stderr}"
    assert done.returncode == 0, f"{mode}: {done.stderr}"
    return json.loads(done.stdout)


def digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    } | {str(p.relative_to(root)) + "/": "dir" for p in root.rglob("*") if p.is_dir()}


def assert_storage_error(result: dict[str, Any], disk: Path, what: str) -> None:
    assert "error" in result, f"{what} succeeded on a full disk"
    assert result["storage"] and result["oserror"], f"{what}: {result}"
    assert result["path"] and Path(result["path"]).is_relative_to(disk), f"{what}: {result}"
    assert Path(result["path"]).name in result["message"], f"{what}: {result}"


def fill(disk: Path) -> Path:
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        for size in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    f.write(b"\xff" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    return filler


def test_a_full_disk_is_a_storage_error_that_changes_nothing(small_disk):
    disk = small_disk
    root = disk / "root"
    root.mkdir()
    free = os.statvfs(disk).f_bavail
    # a build bigger than the disk
    result = run_on_disk(root, "too-big")
    assert_storage_error(result["build"], disk, "a build bigger than the disk")
    assert list(root.iterdir()) == []
    assert os.statvfs(disk).f_bavail == free, "the failed build's blocks are still in use"

    # a dataset that fits, then a full disk
    assert run_on_disk(root, "setup")["version"] == 1
    filler = fill(disk)
    before = digest(root)
    result = run_on_disk(root, "full")
    for what in ("update", "update of stored columns", "replacement loader", "build"):
        assert_storage_error(result[what], disk, what)
    version, head, same, rows, reopened = result["after"]
    assert (version, head, same, rows, reopened) == (1, 1, True, 200, True)
    assert digest(root) == before, "a failed write on a full disk changed the dataset"
    # each failed write removed its temporary files (a column written before
    # its sidecar failed stayed as `.tmp-<pid>@...arrow`)
    assert leftovers(root) == [], "a failed write left its temporary files"

    # with space again, the alias table and the update are written
    filler.unlink()
    result = run_on_disk(root, "recover")
    assert result == {"replacement loader": 200, "update": 2}
    assert leftovers(root) == []
