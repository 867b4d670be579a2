"""Object-storage benchmark: a cache in an S3 server behind a latency proxy.

Run by hand against the release extension (`make bench`). Workload: one
cache of 16 KiB random records (64 MiB by default) in a moto S3 server (its
own process), reached through a TCP proxy (its own process) that delays every
request by 20-50 ms, as a real bucket's first byte is; a permutation epoch
through `ds.loader` whose consumer only touches `batch.data`.

Measured in the same run, against its limit:
- the limit of a first epoch: a plain client (threads, keep-alive HTTP, no
  checksums, one process) doing one range GET per record in the same order,
  with the same number of requests in flight;
- first epoch (empty local replica, no budget) / that client;
- second epoch (the replica holds everything) / the warm local loader over
  the same cache on local disk;
- with `cache_bytes` = half the data: bytes downloaded in the second epoch /
  the data (an LRU cache would download all of it), and the same figure for
  a simulated LRU of the same size over the same sequence.

Targets (issue 9): first epoch >= 0.8x the client; second epoch >= 0.9x the
warm local loader; half budget <= 0.6x the data per epoch.
"""

from __future__ import annotations

import argparse
import http.client
import os
import random
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import datasetrt as drt

RECORD = 16 * 1024
SHARD_BYTES = 4 << 20
REQUESTS = 32


class RandomRecords:
    def __init__(self, n: int):
        self.name = "remote-16k"
        self.n = n

    def __iter__(self):
        rng = random.Random(7)
        for i in range(self.n):
            yield drt.CacheInput(rng.randbytes(RECORD), {"i": i})


PROXY = r"""
import asyncio, random, sys
upstream_port, low, high = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])

async def pipe(reader, writer, delay):
    try:
        while data := await reader.read(1 << 16):
            if delay:
                await asyncio.sleep(random.uniform(low, high))
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()

async def handle(client_r, client_w):
    try:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", upstream_port)
    except OSError:
        client_w.close()
        return
    await asyncio.gather(pipe(client_r, up_w, True), pipe(up_r, client_w, False))

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()

asyncio.run(main())
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_servers(low: float, high: float) -> tuple[list[subprocess.Popen], int, int]:
    port = free_port()
    moto = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            break
        except OSError:
            time.sleep(0.05)
    proxy = subprocess.Popen(
        [sys.executable, "-c", PROXY, str(port), str(low), str(high)],
        stdout=subprocess.PIPE,
        text=True,
    )
    proxy_port = int(proxy.stdout.readline())
    return [moto, proxy], port, proxy_port


def options(port: int) -> dict[str, str]:
    return {
        "aws_endpoint": f"http://127.0.0.1:{port}",
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
        "aws_region": "us-east-1",
        "aws_allow_http": "true",
    }


def epoch(ds: drt.Dataset, epoch_no: int) -> tuple[float, int]:
    """Seconds for one permutation epoch, touching every payload."""
    start = time.perf_counter()
    n = 0
    for batch in ds.loader(64, seed=1, epoch=epoch_no, sampling="permutation"):
        for data in batch.data:
            n += len(data) > 0
    return time.perf_counter() - start, n


def index_entries(path: Path) -> list[tuple[int, int]]:
    """(shard, offset) of every record, from a cache's index (docs/FORMAT.md)."""
    raw = path.read_bytes()
    out = []
    for at in range(32, len(raw), 32):
        offset, shard = struct.unpack_from("<QI", raw, at)
        out.append((shard, offset))
    return out


def plain_client(port: int, requests: list[tuple[str, int, int]]) -> float:
    """One range GET per record (presigned path, start, end), REQUESTS in
    flight, keep-alive connections, no checks."""
    local = threading.local()

    def get(r: tuple[str, int, int]) -> int:
        target, start, end = r
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", target, headers={"Range": f"bytes={start}-{end - 1}"})
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status == 206 and len(body) == end - start, resp.status
        return len(body)

    start = time.perf_counter()
    with ThreadPoolExecutor(REQUESTS) as pool:
        total = sum(pool.map(get, requests))
    assert total == sum(b - a for _, a, b in requests)
    return time.perf_counter() - start


def lru_downloads(sequence: list[int], size: int, capacity: int, epochs: int) -> list[int]:
    """Bytes an LRU cache of `capacity` bytes downloads per epoch."""
    cache: OrderedDict[int, None] = OrderedDict()
    out = []
    for e in range(epochs):
        got = 0
        for s in sequence[e]:
            if s in cache:
                cache.move_to_end(s)
                continue
            got += size
            cache[s] = None
            while len(cache) * size > capacity:
                cache.popitem(last=False)
        out.append(got)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64, help="data size")
    parser.add_argument("--low-ms", type=float, default=20)
    parser.add_argument("--high-ms", type=float, default=50)
    args = parser.parse_args()
    n = args.mib * (1 << 20) // RECORD
    work = Path(tempfile.mkdtemp(prefix="drt-bench-remote-"))
    servers, port, proxy_port = start_servers(args.low_ms / 1000, args.high_ms / 1000)
    try:
        import boto3
        from botocore.config import Config

        s3 = boto3.client(
            "s3",
            config=Config(s3={"addressing_style": "path"}),
            endpoint_url=f"http://127.0.0.1:{port}",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        s3.create_bucket(Bucket="bench")
        url = "s3://bench/data"
        t = time.perf_counter()
        built = drt.build(
            url,
            [RandomRecords(n)],
            codec="none",
            # small objects: moto copies a whole object to serve a range of it
            shard_bytes=SHARD_BYTES,
            storage_options=options(port),
            cache_dir=work / "builder",
            progress=False,
        )
        data_bytes = n * RECORD
        print(
            f"{n} records of 16 KiB ({args.mib} MiB) built and uploaded in "
            f"{time.perf_counter() - t:.1f} s; proxy delay {args.low_ms:.0f}-{args.high_ms:.0f} ms"
            f" per request, {REQUESTS} in flight"
        )

        # the local, warm loader over the builder's copy
        local = drt.open(Path(built.caches[0]["path"]))
        epoch(local, 0)
        warm = min(epoch(local, 1)[0] for _ in range(3))

        # the plain client: the same records in the same order, one GET each
        order = [
            int(s)
            for s in local.get_metadata()["sample_id"][local.draws(1, 0, sampling="permutation")]
        ]
        entries = index_entries(Path(built.caches[0]["path"]) / "index.drti")
        requests = [(entries[s][0], entries[s][1], entries[s][1] + RECORD) for s in order]
        # signed once (presigned URLs), so the client's requests cost no signing
        targets = {}
        for shard in sorted({r[0] for r in requests}):
            signed = s3.generate_presigned_url(
                "get_object",
                Params={"Bucket": "bench", "Key": f"data/remote-16k/shard-{shard:05}.drts"},
                ExpiresIn=3600,
            )
            targets[shard] = signed.split(f":{port}", 1)[1]
        client = plain_client(proxy_port, [(targets[sh], a, b) for sh, a, b in requests])

        # ours, through the proxy: first epoch into an empty replica, then warm
        ds = drt.open(url, storage_options=options(proxy_port), cache_dir=work / "reader")
        first, count = epoch(ds, 0)
        assert count == n
        stats1 = ds.fetch_stats()
        second = min(epoch(ds, 1)[0] for _ in range(3))
        stats2 = ds.fetch_stats()

        # half the data as budget: bytes downloaded per epoch
        half = drt.open(
            url,
            storage_options=options(proxy_port),
            cache_dir=work / "half",
            cache_bytes=data_bytes // 2,
        )
        per_epoch = []
        times = []
        before = 0
        for e in range(3):
            times.append(epoch(half, e)[0])
            got = half.fetch_stats()["bytes"]
            per_epoch.append(got - before)
            before = got
        seqs = [
            [
                int(s)
                for s in local.get_metadata()["sample_id"][
                    local.draws(1, e, sampling="permutation")
                ]
            ]
            for e in range(3)
        ]
        lru = lru_downloads(seqs, RECORD, data_bytes // 2, 3)

        mb = data_bytes / 1e6
        print()
        print("| run | time | MB/s | vs its limit |")
        print("|---|---|---|---|")
        rows = [
            ("plain client, 1 GET per record (limit of a first epoch)", client, "1.00"),
            ("**first epoch**, empty replica", first, f"**{client / first:.2f}x** the client"),
            ("warm local loader (limit of a second epoch)", warm, "1.00"),
            ("**second epoch**, replica holds all", second, f"**{warm / second:.2f}x** local"),
        ]
        for e in range(3):
            ratio = f"**{per_epoch[e] / data_bytes:.2f}x** the data"
            lru_ratio = f"LRU: {lru[e] / data_bytes:.2f}x"
            rows.append((f"budget = half the data, epoch {e}", times[e], f"{ratio} ({lru_ratio})"))
        for name, seconds, versus in rows:
            print(f"| {name} | {seconds:.3f} s | {mb / seconds:.1f} | {versus} |")
        print()
        print(
            f"first epoch: {stats1['requests']} requests, {stats1['bytes'] / 1e6:.1f} MB "
            f"downloaded, hits {stats1['hits']}, misses {stats1['misses']}"
        )
        hits = stats2["hits"] - stats1["hits"]
        misses = stats2["misses"] - stats1["misses"]
        print(
            f"second epochs: {stats2['requests'] - stats1['requests']} requests, hit ratio "
            f"{hits / max(1, hits + misses):.3f}"
        )
        hs = half.fetch_stats()
        print(
            f"half budget: {hs['requests']} requests, {hs['bytes'] / 1e6:.1f} MB downloaded, "
            f"{hs['evicted_bytes'] / 1e6:.1f} MB evicted, hits {hs['hits']}, "
            f"misses {hs['misses']}"
        )
    finally:
        for p in servers:
            p.terminate()
            p.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    main()
