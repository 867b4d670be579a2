"""Caches in an S3-compatible bucket: a real S3 server (moto's, on loopback),
the same API and the same guarantees as local caches."""

from __future__ import annotations

import contextlib
import json
import pickle
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

import datasetrt as drt
from conftest import Source, run_child

pytest.importorskip("moto.server")


def sources() -> list[Source]:
    return [
        Source("alpha-v1", 300, payload=lambda i: (b"a%05d" % i) * (50 + i % 200)),
        Source("beta-v1", 200),
    ]


def expected(ds: drt.Dataset) -> dict[tuple[int, int], bytes]:
    by_id = {c["cache_id"]: next(s for s in sources() if s.name == c["name"]) for c in ds.caches}
    return {
        (cid, sid): by_id[cid].payload(sid) for cid, src in by_id.items() for sid in range(src.n)
    }


@pytest.fixture
def remote(bucket, tmp_path):
    url, options, client, name = bucket
    ds = drt.build(
        url, sources(), storage_options=options, cache_dir=tmp_path / "build-cache", progress=False
    )
    return url, options, client, name, ds


def test_a_cache_built_into_a_bucket_opens_elsewhere_with_the_same_samples(remote, tmp_path):
    url, options, client, bucket, _ = remote
    listed = client.list_objects_v2(Bucket=bucket, Prefix="datasets/demo/")["Contents"]
    keys = {o["Key"].removeprefix("datasets/demo/") for o in listed}
    assert {"alpha-v1/MANIFEST", "alpha-v1/index.drti", "beta-v1/shard-00000.drts"} <= keys

    ds = drt.open(url, storage_options=options, cache_dir=tmp_path / "reader")
    assert len(ds) == 500
    assert sorted(c["url"] for c in ds.caches) == [f"{url}/alpha-v1", f"{url}/beta-v1"]
    want = expected(ds)
    assert ds.fetch_stats()["bytes"] == 0  # opening reads metadata only
    for (cid, sid), data in list(want.items())[::37]:
        assert ds.get_item(cid, sid).data == data
    got = {}
    for batch in ds.loader(64, seed=3, sampling="permutation"):
        for cid, sid, data in zip(batch.cache_id, batch.sample_id, batch.data, strict=True):
            got[(cid, sid)] = data
    assert got == want
    stats = ds.fetch_stats()
    # no budget: whole chunks, every byte downloaded at most once
    stored = sum(len(v) for v in want.values())
    assert 0 < stats["bytes"] <= stored * 1.05
    assert stats["evicted_bytes"] == 0


@pytest.mark.parametrize(
    "sampling", ["replacement", "permutation", "weighted_without_replacement", "balanced"]
)
def test_every_sampling_mode_reads_the_local_sequence(remote, tmp_path, sampling):
    url, options, _, _, built = remote
    local = drt.open(Path(built.caches[0]["path"]).parent)  # the builder's local copy
    ds = drt.open(url, storage_options=options, cache_dir=tmp_path / "r", cache_bytes=1_000)
    for d in (local, ds):
        d.update_metadata(d.get_metadata().with_columns(weight=pl.col("sample_id") % 3 + 0.5))

    def run(d):
        return [
            (b.cache_id, b.sample_id, b.data)
            for b in d.loader(50, seed=11, epoch=2, sampling=sampling)
        ]

    assert run(ds) == run(local)
    assert ds.fetch_stats()["evicted_bytes"] > 0  # 1 kB holds a few compressed records


def test_metadata_updates_and_exact_resume_on_a_remote_dataset(remote, tmp_path):
    url, options, *_ = remote
    ds = drt.open(url, storage_options=options, cache_dir=tmp_path / "r")
    meta = ds.get_metadata()
    ds.update_metadata(meta.filter(pl.col("label") < 5))
    again = drt.open(url, storage_options=options, cache_dir=tmp_path / "r")
    assert again.version == ds.version and len(again) == len(ds) == 250

    whole = [b.sample_id for b in ds.loader(20, seed=5, sampling="permutation")]
    first = ds.loader(20, seed=5, sampling="permutation")
    head = [next(first).sample_id for _ in range(4)]
    rest = [b.sample_id for b in again.loader(20, resume=first.state_dict())]
    assert head + rest == whole


def test_snapshots_live_in_the_bucket_and_a_moved_head_is_a_conflict(remote, tmp_path):
    url, options, client, bucket, _ = remote
    # two machines: each its own cache_dir
    a = drt.open(url, storage_options=options, cache_dir=tmp_path / "machine-a")
    b = drt.open(url, storage_options=options, cache_dir=tmp_path / "machine-b")
    assert a.version == b.version
    a.update_metadata(a.get_metadata().filter(pl.col("label") < 5))
    listed = client.list_objects_v2(Bucket=bucket, Prefix="datasets/demo/_snapshots/")
    names = {o["Key"].rsplit("/", 1)[-1] for o in listed["Contents"]}
    assert "HEAD" in names and any(n.endswith(".arrow") for n in names)

    with pytest.raises(drt.ConflictError) as err:
        b.update_metadata(b.get_metadata().head(10))
    assert (err.value.base, err.value.head) == (0, a.version)
    assert b.head == a.version
    assert b.refresh() == a.version and len(b) == 250
    b.update_metadata(b.get_metadata().head(10))
    b.tag("ten")

    c = drt.open(url, storage_options=options, cache_dir=tmp_path / "machine-c")
    assert (c.version, len(c)) == (b.version, 10)
    assert c.tags()["ten"] == b.version
    c.checkout(a.version)
    assert (
        a.head == a.version
        and len(drt.open(url, storage_options=options, cache_dir=tmp_path / "machine-d")) == 250
    )


def test_sql_joins_payloads_of_a_remote_dataset(remote, tmp_path):
    url, options, *_ = remote
    ds = drt.open(url, storage_options=options, cache_dir=tmp_path / "r")
    want = expected(ds)
    out = ds.sql(
        "SELECT m.cache_id, m.sample_id, p.data FROM metadata m "
        "JOIN payloads p USING (cache_id, sample_id) WHERE m.label = 3"
    )
    assert out.height == 50
    for cid, sid, data in out.iter_rows():
        assert data == want[(cid, sid)]


def test_pickled_remote_datasets_reopen_with_their_options(remote, tmp_path):
    url, options, *_ = remote
    ds = drt.open(url, storage_options=options, cache_dir=tmp_path / "r", cache_bytes=50_000)
    copy = pickle.loads(pickle.dumps(ds))
    cid = ds.caches[0]["cache_id"]
    assert copy.get_item(cid, 5).data == ds.get_item(cid, 5).data


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_torch_dataloader_workers_read_a_remote_dataset(remote, tmp_path, method):
    torch = pytest.importorskip("torch")
    url, options, *_ = remote
    ds = drt.open(url, storage_options=options, cache_dir=tmp_path / "r")
    tds = ds.to_torch(batch_size=50, seed=4, sampling="permutation")
    loader = torch.utils.data.DataLoader(
        tds, batch_size=None, num_workers=2, multiprocessing_context=method
    )
    want = expected(ds)
    seen = 0
    for b in loader:
        for cid, sid, data in zip(
            b["cache_id"].tolist(), b["sample_id"].tolist(), b["data"], strict=True
        ):
            assert data == want[(cid, sid)]
            seen += 1
    assert seen == 500


def test_a_flipped_byte_in_a_remote_shard_is_a_corrupt_cache_error(remote, tmp_path):
    url, options, client, bucket, _ = remote
    key = "datasets/demo/alpha-v1/shard-00000.drts"
    raw = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    raw[16 + 3000] ^= 0x40
    client.put_object(Bucket=bucket, Key=key, Body=bytes(raw))
    ds = drt.open(url, storage_options=options, cache_dir=tmp_path / "fresh")
    with pytest.raises(drt.CorruptCacheError) as err:
        for _ in ds.loader(100, seed=1, sampling="permutation"):
            pass
    assert "alpha-v1/shard-00000.drts" in str(err.value)
    assert str(err.value.path).startswith(url)


def test_a_second_cache_of_the_same_name_is_refused(remote, tmp_path):
    url, options, *_ = remote
    other = Source("alpha-v1", 10)
    local = drt.build(tmp_path / "elsewhere", [other], progress=False)
    with pytest.raises(drt.InvalidInputError, match="different cache named"):
        drt._native.publish_remote(url, local.caches[0]["path"], "alpha-v1", list(options.items()))


def test_bad_urls_and_options_are_typed_errors(bucket, tmp_path):
    url, options, *_ = bucket
    with pytest.raises(drt.InvalidInputError, match="unsupported URL scheme"):
        drt.open("gs://bucket/x", cache_dir=tmp_path)
    with pytest.raises(drt.InvalidInputError, match="unknown storage option"):
        drt.open(url, storage_options={"aws_endpiont": "x"}, cache_dir=tmp_path)
    with pytest.raises(drt.CacheNotFoundError):
        drt.open(url + "-empty", storage_options=options, cache_dir=tmp_path)


# -- processes: a shared cache directory, a server that goes away -------------

CHILD = """
import sys, hashlib, datasetrt as drt
url, cache_dir, seed, endpoint = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
budget = int(sys.argv[5]) if sys.argv[5] else None
options = dict(aws_endpoint=endpoint, aws_access_key_id="testing",
               aws_secret_access_key="testing", aws_region="us-east-1", aws_allow_http="true")
ds = drt.open(url, storage_options=options, cache_dir=cache_dir, cache_bytes=budget)
for epoch in range(2):
    for b in ds.loader(25, seed=seed, epoch=epoch, sampling="permutation"):
        for cid, sid, data in zip(b.cache_id, b.sample_id, b.data):
            print(cid, sid, hashlib.sha256(data).hexdigest())
print("BYTES", ds.fetch_stats()["bytes"])
"""


def finish_all(children: list[subprocess.Popen], timeout: float) -> list[tuple]:
    """(child, stdout, stderr) of each, waiting at most `timeout` s for each;
    every child is killed when the waiting ends, however it ends."""
    try:
        return [(child, *child.communicate(timeout=timeout)) for child in children]
    finally:
        for child in children:
            child.kill()


def run_children(url, options, shared, budget, want):
    """Two processes reading all of `url` through one cache_dir; each
    delivered record checked; the bytes each downloaded."""
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                CHILD,
                url,
                str(shared),
                str(seed),
                options["aws_endpoint"],
                "" if budget is None else str(budget),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in (1, 2)
    ]
    downloaded = []
    for child, out, err in finish_all(children, timeout=180):
        assert child.returncode == 0, err
        *rows, last = [line.split() for line in out.splitlines()]
        assert len(rows) == 1000
        for cid, sid, digest in rows:
            assert want[(int(cid), int(sid))] == digest
        downloaded.append(int(last[1]))
    return downloaded


def test_two_processes_sharing_a_cache_dir_read_correct_bytes(remote, tmp_path):
    import hashlib

    url, options, _, _, built = remote
    ds = drt.open(url, storage_options=options, cache_dir=tmp_path / "r")
    want = {k: hashlib.sha256(v).hexdigest() for k, v in expected(ds).items()}
    # a budget far below the data: both evict all the time, each punching
    # holes the other may be reading
    run_children(url, options, tmp_path / "small", 30_000, want)
    # no budget: a range one process is downloading, the other waits for and
    # finds; together they download the data about once
    stored = sum(
        p.stat().st_size for c in built.caches for p in Path(c["path"]).glob("shard-*.drts")
    )
    downloaded = run_children(url, options, tmp_path / "whole", None, want)
    # each process alone would download all of it (2x together); the range
    # locks make one wait for the other's download instead. How much the two
    # overlap at the locks' edges depends on scheduling, so the bound sits
    # between "about once" and "twice" rather than at a measured 1.1x
    assert sum(downloaded) <= stored * 1.9, (downloaded, stored)


STOPPED = """
import sys, time, datasetrt as drt
from moto.server import ThreadedMotoServer
import boto3
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
host, port = server.get_host_and_port()
endpoint = f"http://{host}:{port}"
options = dict(aws_endpoint=endpoint, aws_access_key_id="testing", timeout="3s",
               aws_secret_access_key="testing", aws_region="us-east-1", aws_allow_http="true")
boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
             aws_secret_access_key="testing", region_name="us-east-1").create_bucket(Bucket="bkt")
src = [drt.CacheInput(bytes([i % 251]) * 4000, {"i": i}) for i in range(400)]
class S:
    name = "gone-v1"
    def __iter__(self):
        return iter(src)
ds = drt.build("s3://bkt/x", [S()], storage_options=options, cache_dir=sys.argv[1],
               codec="none", progress=False)
ds = drt.open("s3://bkt/x", storage_options=options, cache_dir=sys.argv[1] + "-2",
              cache_bytes=40_000)
batches = ds.loader(20, seed=0, sampling="permutation")
next(batches)
server.stop()
start = time.monotonic()
try:
    for _ in batches:
        pass
except drt.StorageError as e:
    print("StorageError", round(time.monotonic() - start, 1), e.path)
else:
    print("no error")
"""


def test_a_server_that_dies_mid_epoch_is_a_storage_error_in_bounded_time(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", STOPPED, str(tmp_path / "c")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    kind, seconds, path = done.stdout.split()
    assert kind == "StorageError", done.stdout
    # 3 s requests: a wait, then one more try (about 21 s by the retry policy);
    # a hang would run to the child's 120 s timeout. 60 s leaves room for a
    # loaded machine without letting a hang pass
    assert float(seconds) < 60
    assert path.startswith("s3://bkt/x/gone-v1/shard-00000.drts")


def test_time_is_bounded_for_an_unreachable_endpoint(tmp_path):
    start = time.monotonic()
    with pytest.raises(drt.StorageError):
        drt.open(
            "s3://nobody/x",
            storage_options={
                "aws_endpoint": "http://127.0.0.1:9",
                "aws_allow_http": "true",
                "aws_access_key_id": "a",
                "aws_secret_access_key": "b",
                "aws_region": "us-east-1",
            },
            cache_dir=tmp_path,
        )
    # refused connections with retries take about 15 s by the retry policy;
    # a hang would run to pytest's 300 s timeout
    assert time.monotonic() - start < 60


RACER = r"""
import sys, polars as pl, datasetrt as drt
url, cache_dir, endpoint, me, start, commits = sys.argv[1:7]
options = {"aws_endpoint": endpoint, "aws_access_key_id": "testing",
           "aws_secret_access_key": "testing", "aws_region": "us-east-1",
           "aws_allow_http": "true"}
ds = drt.open(url, storage_options=options, cache_dir=cache_dir)
landed = conflicts = 0
while landed < int(commits):
    try:  # one more sample of mine dropped per commit
        ds.update_metadata(ds.get_metadata().filter(
            (pl.col("sample_id") % 3 != int(me))
            | (pl.col("sample_id") >= 3 * (int(start) + landed + 1))))
        landed += 1
    except drt.ConflictError:
        conflicts += 1
        ds.refresh()
print(landed, conflicts)
"""


def test_racing_machines_pull_consistent_heads_and_every_commit_lands(bucket, tmp_path):
    """Three machines (separate cache_dirs) commit 8 updates each on one bucket
    dataset at once, refreshing on a conflict: nothing but ConflictError is
    ever raised, all 24 commits land, and the head's parents form one chain."""
    url, options, *_ = bucket
    drt.build(
        url,
        [Source("race-v1", 150)],
        storage_options=options,
        cache_dir=tmp_path / "builder",
        progress=False,
    )
    for trial in range(5):
        racers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    RACER,
                    url,
                    str(tmp_path / f"t{trial}-m{m}"),
                    options["aws_endpoint"],
                    str(m),
                    str(8 * trial),
                    "8",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for m in range(3)
        ]
        for racer, out, err in finish_all(racers, timeout=240):
            assert racer.returncode == 0, err
            assert out.split()[0] == "8"
        ds = drt.open(url, storage_options=options, cache_dir=tmp_path / f"t{trial}-check")
        parents = dict(ds.history().select("version", "parent").iter_rows())
        chain, v = [], ds.version
        while v is not None:
            chain.append(v)
            v = parents[v]
        assert len(chain) == 1 + 24 * (trial + 1)  # the first snapshot and every commit
        # each commit dropped one more sample of its machine: none was lost
        assert len(ds) == 150 - 24 * (trial + 1)


def test_a_rebuild_uploads_what_it_wrote_never_a_partial_replica(bucket, tmp_path):
    """A machine that read part of a bucket's cache holds a replica with holes;
    the bucket is wiped and the machine builds the dataset again: the source
    is iterated and every record of the new cache reads back elsewhere."""
    url, options, client, bucket_name = bucket

    def big() -> Source:  # 10 MB: several 4 MiB chunks, fetched one by one
        return Source("big-v1", 200, payload=lambda i: bytes([i % 251]) * 50_000)

    machine = tmp_path / "machine-a"
    drt.build(url, [big()], storage_options=options, cache_dir=tmp_path / "b", progress=False)
    ds = drt.open(url, storage_options=options, cache_dir=machine)
    cid = ds.caches[0]["cache_id"]
    for sid in range(5):
        assert ds.get_item(cid, sid).data == big().payload(sid)
    assert 0 < ds.fetch_stats()["bytes"] < 200 * 50_000 / 2  # a replica with holes
    replica = ds.caches[0]["path"]

    listed = client.list_objects_v2(Bucket=bucket_name)["Contents"]
    for o in listed:
        client.delete_object(Bucket=bucket_name, Key=o["Key"])
    again = big()
    drt.build(url, [again], storage_options=options, cache_dir=machine, progress=False)
    assert again.iterations == 1

    fresh = drt.open(url, storage_options=options, cache_dir=tmp_path / "machine-c")
    cid = fresh.caches[0]["cache_id"]
    for sid in range(200):
        assert fresh.get_item(cid, sid).data == big().payload(sid)
    assert fresh.verify().is_empty()

    # the uploader itself refuses a cache with holes, whoever asks
    with pytest.raises(drt.CorruptCacheError, match="checksum"):
        drt._native.publish_remote(f"{url}-copy", replica, "big-v1", list(options.items()))
    assert "Contents" not in client.list_objects_v2(Bucket=bucket_name, Prefix="datasets/demo-copy")


SILENT = r"""
import socket, sys, threading, time
import datasetrt as drt
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(64)
held = []
def accept():  # take every connection, never answer
    while True:
        held.append(server.accept()[0])
threading.Thread(target=accept, daemon=True).start()
options = {"aws_endpoint": f"http://127.0.0.1:{server.getsockname()[1]}",
           "aws_allow_http": "true", "aws_access_key_id": "a",
           "aws_secret_access_key": "b", "aws_region": "us-east-1"}
start = time.monotonic()
try:
    drt.open("s3://bkt/x", storage_options=options, cache_dir=sys.argv[1])
except drt.StorageError as e:
    print("StorageError", round(time.monotonic() - start, 1), len(held))
else:
    print("no error")
"""


def test_a_server_that_never_answers_fails_within_the_documented_bound(tmp_path):
    """Default settings: a request times out after 20 s and no retry starts
    after 15 s, so one request ends within 35 s (docs/buckets.md); opening
    a dataset stops at the first request that fails."""
    done = subprocess.run(
        [sys.executable, "-c", SILENT, str(tmp_path / "c")],
        capture_output=True,
        text=True,
        timeout=150,  # a hang fails here, not in pytest's timeout
    )
    assert done.returncode == 0, done.stderr
    kind, seconds, connections = done.stdout.split()
    assert kind == "StorageError", done.stdout
    assert 19 <= float(seconds) <= 35, seconds  # the 20 s timeout, once
    assert int(connections) >= 1


class EvictingDataset:
    """A bucket dataset of `n` records of `size` bytes (record i: byte i % 251
    repeated), opened through a fresh cache_dir with `cache_bytes` = `share`
    of the data."""

    def __init__(self, bucket, tmp_path: Path, name: str, n: int, size: int, share: float):
        url, options, *_ = bucket
        self.n, self.size = n, size
        self.records = Source(name, n, payload=lambda i: bytes([i % 251]) * size)
        drt.build(
            url,
            [self.records],
            storage_options=options,
            cache_dir=tmp_path / "b",
            shard_bytes=1 << 20,
            codec="none",
            progress=False,
        )
        self.budget = int(n * size * share)
        self.ds = drt.open(
            url, storage_options=options, cache_dir=tmp_path / "host", cache_bytes=self.budget
        )
        self.replica = Path(self.ds.caches[0]["path"])

    def held(self) -> int:
        """Bytes the replica's shards take on disk now (every process's)."""
        return sum(p.stat().st_blocks * 512 for p in self.replica.glob("shard-*.drts"))

    @contextlib.contextmanager
    def peak(self):
        """Sample held() every 2 ms while the block runs; yields a list whose
        first item is the peak."""
        import threading

        peak, done = [0], threading.Event()

        def watch():
            while not done.is_set():
                peak[0] = max(peak[0], self.held())
                time.sleep(0.002)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            yield peak
        finally:
            done.set()
            watcher.join(timeout=10)


@pytest.mark.parametrize("workers", [2, 4])
def test_dataloader_workers_sharing_a_cache_dir_share_one_budget(bucket, tmp_path, workers):
    """The budget is the host's: DataLoader workers reading one bucket dataset
    through one cache_dir hold at most cache_bytes of payload together (plus
    one read-ahead step per process in flight), not cache_bytes each."""
    torch = pytest.importorskip("torch")

    e = EvictingDataset(bucket, tmp_path, "budget-v1", 1200, 16 * 1024, 0.5)
    n, size, budget, ds = e.n, e.size, e.budget, e.ds
    tds = ds.to_torch(batch_size=16, seed=3, sampling="permutation")
    loader = torch.utils.data.DataLoader(
        tds, batch_size=None, num_workers=workers, multiprocessing_context="fork"
    )
    seen = 0
    with e.peak() as peak:
        for batch in loader:
            for sid, data in zip(batch["sample_id"].tolist(), batch["data"], strict=True):
                assert data == e.records.payload(sid)
                seen += 1
    assert seen == n
    # the documented slack: a page per held record at its edges; one step of
    # read-ahead per worker (32 records) may land before its eviction runs;
    # the shard headers' pages stay
    slack = budget // size * 4096 + workers * 32 * size + (1 << 20)
    assert peak[0] <= budget + slack, (peak[0], budget, slack)
    # the workers downloaded and evicted; this process read nothing itself,
    # and the host's counters hold what the workers did after they ended
    assert ds.fetch_stats()["bytes"] == 0
    host = ds.fetch_stats(host=True)
    # (records of zeros are never downloaded: a hole reads back as them)
    assert host["bytes"] >= (n - len(range(0, n, 251))) * size, host
    assert host["evicted_bytes"] > 0, host


def test_get_item_and_sql_reads_count_against_the_budget(bucket, tmp_path):
    """Reads outside a loader count against the host's budget too: get_item
    and SQL over a replica whose budget holds a quarter of the data evict what
    reads fetched longest ago, and every record still reads back right."""
    import random

    e = EvictingDataset(bucket, tmp_path, "reads-v1", 400, 16 * 1024, 0.25)
    n, size, budget, ds = e.n, e.size, e.budget, e.ds
    cid = ds.caches[0]["cache_id"]
    # the documented bound: the budget, a page at the edges of each record it
    # holds, the shard headers' pages; plus the record being read
    bound = budget + budget // size * 4096 + (1 << 20) + size
    peak = 0
    for sid in random.Random(5).sample(range(n), n):
        assert ds.get_item(cid, sid).data == e.records.payload(sid)
        peak = max(peak, e.held())
    assert peak <= bound, (peak, bound)
    assert ds.fetch_stats()["evicted_bytes"] >= n * size // 2

    with e.peak() as sql_peak:
        out = ds.sql(
            "SELECT m.sample_id, p.data FROM metadata m JOIN payloads p USING (cache_id, sample_id)"
        )
    assert out.height == n
    for sid, data in out.iter_rows():
        assert data == e.records.payload(sid)
    # SQL reads in parallel partitions: one record in flight per thread more
    assert sql_peak[0] <= bound + 8 * size, (sql_peak[0], bound)


HELD_CHILD = r"""
import json, os, sys
from pathlib import Path
import datasetrt as drt

def anon_mib():
    for line in Path(f"/proc/{os.getpid()}/smaps_rollup").read_text().splitlines():
        if line.startswith("Anonymous:"):
            return int(line.split()[1]) / 1024

url, options, cache_dir = json.loads(sys.argv[1])
before = anon_mib()
ds = drt.open(url, storage_options=options, cache_dir=cache_dir)
opened = anon_mib() - before
batch = next(iter(ds.loader(256, seed=3, threads=1, prefetch_batches=1)))
print(json.dumps({"rows": len(ds), "batch": len(batch.data), "open": opened,
                  "read": anon_mib() - before}))
"""


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="needs Linux /proc")
def test_a_process_reading_a_cache_in_a_bucket_holds_no_memory_per_record(bucket, tmp_path):
    """Opening a cache in a bucket streams its index to disk and reads it in
    place: a process holds no copy of the index and no state per record it
    has not read. Before, the index passed through memory whole and every
    process kept 25 bytes per record: for the 10^6 records here, opening
    held 63 MiB in the host's first process and 31 MiB in a later one
    (now 5 and 0.5 MiB). The first process's first batch downloads whole
    4 MiB chunks, a few at a time: that memory is bounded by the requests in
    flight, not by records, so it is not counted here."""
    url, options, _, _ = bucket
    n = 1_000_000
    drt.build(
        url,
        [Source("many-v1", n, payload=lambda i: i.to_bytes(8, "little"), meta=lambda i: {})],
        storage_options=options,
        cache_dir=tmp_path / "build",
        progress=False,
    )
    arg = json.dumps([url, options, str(tmp_path / "reader")])
    first = json.loads(run_child(HELD_CHILD, arg))  # downloads the index
    later = json.loads(run_child(HELD_CHILD, arg))  # maps the one on disk
    assert first["rows"] == later["rows"] == n
    assert first["batch"] == later["batch"] == 256
    # wide margins: the old layout held 63 and 31 MiB
    assert first["open"] < 16 and later["open"] < 8 and later["read"] < 8, (first, later)
