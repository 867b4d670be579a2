"""Object-storage benchmark: a cache in a real S3 server behind a latency proxy.

Run by hand against the release extension (`make bench`, which installs the
server). Workload: one cache of 16 KiB random records (64 MiB by default) in
`s3s-fs` (an S3 server over the file system that serves a range by reading
it, as S3 does; `--server moto` for moto, which copies the whole object to
serve a range), reached through a TCP proxy (its own process) that delays
every request by 20-50 ms, as a real bucket's first byte is; a permutation
epoch through `ds.loader` whose consumer touches `batch.data`. Two links:
the delay alone, and the delay with the bandwidth towards the client capped
(1 Gbit/s by default, one link shared by every connection). Every figure is
the median with min-max over `--trials` runs (5), a first epoch each time
into an empty `cache_dir`.

Each epoch is compared with
- (a) a plain client on the same server and link: threads, keep-alive HTTP,
  no checksums, one range GET per record in the same order, the same number
  of requests in flight;
- (b) the link limit: the least time any client needs to move the epoch's
  bytes over that link, `bytes / bandwidth + one round trip` (capped link
  only; without a cap it is one round trip).

Targets (issue 22, part 4): first epoch >= 0.8x the link limit in every
trial; the warm second epoch (the replica holds everything) within noise of
the warm local loader. Also: with `cache_bytes` = half the data, bytes
downloaded per epoch against an LRU of the same size on the same sequences.
"""

from __future__ import annotations

import argparse
import http.client
import os
import random
import shutil
import socket
import statistics
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
rate = float(sys.argv[4])  # bytes/s of the link towards the client, 0: no cap
counter = open(sys.argv[5], "r+b") if len(sys.argv) > 5 else None  # bytes sent, 8 bytes LE
link_free = 0.0  # when the shared link is free again
sent = 0

async def pipe(reader, writer, delay):
    global link_free, sent
    loop = asyncio.get_running_loop()
    try:
        while data := await reader.read(1 << 16):
            if delay:
                await asyncio.sleep(random.uniform(low, high))
            elif rate:  # one link shared by every connection
                link_free = max(loop.time(), link_free) + len(data) / rate
                await asyncio.sleep(link_free - loop.time())
            writer.write(data)
            await writer.drain()
            if not delay and counter is not None:
                sent += len(data)
                counter.seek(0)
                counter.write(sent.to_bytes(8, "little"))
                counter.flush()
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


#: Where `make bench` installs s3s-fs (an S3 server over the file system).
S3S_FS = Path.home() / ".cache" / "datasetrt-tools" / "bin" / "s3s-fs"


def wait_for(port: int) -> None:
    for _ in range(400):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"no server came up on port {port}")


def start_s3(kind: str, root: Path) -> tuple[subprocess.Popen, int]:
    """An S3 server on loopback: s3s-fs (serves ranges from the file) or moto
    (copies the whole object to serve a range of it)."""
    port = free_port()
    if kind == "s3s":
        if not S3S_FS.exists():
            sys.exit(f"{S3S_FS} missing: `make bench` installs it (or pass --server moto)")
        root.mkdir(parents=True, exist_ok=True)
        cmd = [
            str(S3S_FS),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--access-key",
            "testing",
            "--secret-key",
            "testing",
            str(root),
        ]
    else:
        cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(port)
    return server, port


def start_proxy(
    port: int, low: float, high: float, rate: float, counter: Path | None = None
) -> tuple[subprocess.Popen, int]:
    """The delaying proxy in front of `port` (`rate` bytes/s towards the client,
    0: no cap); it counts the bytes it sent into the file `counter`."""
    extra = []
    if counter is not None:
        counter.write_bytes(bytes(8))
        extra = [str(counter)]
    proxy = subprocess.Popen(
        [sys.executable, "-c", PROXY, str(port), str(low), str(high), str(rate), *extra],
        stdout=subprocess.PIPE,
        text=True,
    )
    return proxy, int(proxy.stdout.readline())


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


def spread(values: list[float], fmt: str = "{:.3f}") -> str:
    """Median (min-max)."""
    med, lo, hi = statistics.median(values), min(values), max(values)
    return f"{fmt.format(med)} ({fmt.format(lo)}-{fmt.format(hi)})"


def shared_budget(url: str, work: Path, port: int, args: argparse.Namespace, data: int) -> None:
    """4 DataLoader workers on one cache_dir, budget = half the data, three
    permutation epochs: the bytes the proxy sent per epoch, against an LRU of
    the same size shared by the workers, simulated on the same sequence."""
    try:
        import torch
    except ImportError:
        print("shared budget: torch missing, not measured (target: <= 0.6x the data per epoch)")
        return
    counter = work / "sent"
    proxy, proxy_port = start_proxy(port, args.low_ms / 1000, args.high_ms / 1000, 0.0, counter)
    try:
        ds = drt.open(
            url,
            storage_options=options(proxy_port),
            cache_dir=work / "shared",
            cache_bytes=data // 2,
        )
        tds = ds.to_torch(batch_size=64, seed=1, sampling="permutation")
        loader = torch.utils.data.DataLoader(
            tds, batch_size=None, num_workers=4, multiprocessing_context="fork"
        )
        sent, before, orders = [], 0, []
        for e in range(3):
            tds.set_epoch(e)
            order = []
            for batch in loader:
                order.extend(batch["sample_id"].tolist())
                for d in batch["data"]:
                    assert len(d) == RECORD
            orders.append(order)
            now = int.from_bytes(counter.read_bytes(), "little")
            sent.append(now - before)
            before = now
        lru = lru_downloads(orders, RECORD, data // 2, 3)
        for e in range(3):
            print(
                f"4 workers, one budget = half the data, epoch {e}: sent {sent[e] / data:.2f}x "
                f"the data (a shared LRU: {lru[e] / data:.2f}x)"
            )
        worst = max(sent[1:]) / data
        print(
            f"target: <= 0.6x the data per epoch after the first: "
            f"{'met' if worst <= 0.6 else 'MISSED'} ({worst:.2f}x)"
        )
    finally:
        proxy.terminate()
        proxy.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64, help="data size")
    parser.add_argument("--low-ms", type=float, default=20)
    parser.add_argument("--high-ms", type=float, default=50)
    parser.add_argument("--gbit", type=float, default=1.0, help="the capped link, Gbit/s")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--server", choices=["s3s", "moto"], default="s3s")
    parser.add_argument(
        "--only-shared-budget",
        action="store_true",
        help="measure only the DataLoader workers under one budget",
    )
    args = parser.parse_args()
    n = args.mib * (1 << 20) // RECORD
    work = Path(tempfile.mkdtemp(prefix="drt-bench-remote-"))
    latency = (args.low_ms + args.high_ms) / 2000  # the mean delay a request sees
    rate = args.gbit * 1e9 / 8
    server, port = start_s3(args.server, work / "s3-root")
    procs = [server]
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
            shard_bytes=SHARD_BYTES,
            storage_options=options(port),
            cache_dir=work / "builder",
            progress=False,
        )
        data_bytes = n * RECORD
        mb = data_bytes / 1e6
        if args.only_shared_budget:
            shared_budget(url, work, port, args, data_bytes)
            return
        print(
            f"{n} records of 16 KiB ({args.mib} MiB) in {args.server}, built and uploaded in "
            f"{time.perf_counter() - t:.1f} s; proxy delay {args.low_ms:.0f}-{args.high_ms:.0f} "
            f"ms per request, {REQUESTS} in flight; {args.trials} trials, median (min-max)"
        )

        # the local, warm loader over a complete copy (the builder kept it as its replica)
        local = drt.open(Path(built.caches[0]["path"]))
        epoch(local, 0)
        warm_local = [epoch(local, 1)[0] for _ in range(args.trials)]

        # the plain client's requests: the same records in the same order, one GET each
        order = [
            int(s)
            for s in local.get_metadata()["sample_id"][local.draws(1, 0, sampling="permutation")]
        ]
        entries = index_entries(Path(built.caches[0]["path"]) / "index.drti")
        requests = [(entries[s][0], entries[s][1], entries[s][1] + RECORD) for s in order]
        targets = {}  # signed once (presigned URLs): the client's requests cost no signing
        for shard in sorted({r[0] for r in requests}):
            signed = s3.generate_presigned_url(
                "get_object",
                Params={"Bucket": "bench", "Key": f"data/remote-16k/shard-{shard:05}.drts"},
                ExpiresIn=3600,
            )
            targets[shard] = signed.split(f":{port}", 1)[1]
        plain = [(targets[sh], a, b) for sh, a, b in requests]

        print()
        print("| link | run | seconds | vs the plain client | vs the link limit |")
        print("|---|---|---|---|---|")
        for cap in (0.0, rate):
            proxy, proxy_port = start_proxy(port, args.low_ms / 1000, args.high_ms / 1000, cap)
            procs.append(proxy)
            link = f"{args.low_ms:.0f}-{args.high_ms:.0f} ms" + (
                f", {args.gbit:g} Gbit/s" if cap else ""
            )
            # the least time any client needs to move the epoch's bytes over this
            # link: the bytes at its bandwidth, and at least one round trip
            limit = (data_bytes / cap if cap else 0.0) + latency
            client = [plain_client(proxy_port, plain) for _ in range(args.trials)]
            first, second, stats = [], [], []
            for t in range(args.trials):
                ds = drt.open(
                    url, storage_options=options(proxy_port), cache_dir=work / f"r-{cap}-{t}"
                )
                took, count = epoch(ds, 0)
                assert count == n
                first.append(took)
                stats.append(ds.fetch_stats())
                second.append(epoch(ds, 1)[0])
            med_client = statistics.median(client)
            rows = [
                ("plain client, 1 GET per record", client),
                ("**first epoch**, empty replica", first),
                ("second epoch, the replica holds all", second),
            ]
            for name, runs in rows:
                vs_client = spread([med_client / r for r in runs], "{:.2f}x")
                vs_limit = spread([limit / r for r in runs], "{:.2f}x") if cap else "n/a"
                print(f"| {link} | {name} | {spread(runs)} | {vs_client} | {vs_limit} |")
            requests_made = statistics.median(st["requests"] for st in stats)
            print(
                f"|  | first epoch: {requests_made:.0f} requests, link limit "
                f"{limit:.3f} s ({mb:.1f} MB{f' at {args.gbit:g} Gbit/s' if cap else ''} "
                f"+ {latency * 1000:.0f} ms) | | | |"
            )
            if cap:
                worst = max(first)
                print(
                    f"|  | target: first epoch >= 0.8x the link limit in every trial: "
                    f"{'met' if limit / worst >= 0.8 else 'MISSED'} "
                    f"(lowest {limit / worst:.2f}x) | | | |"
                )
        print(f"| local disk | warm local loader | {spread(warm_local)} | | |")
        ratios = [statistics.median(warm_local) / s for s in second]
        print(f"|  | second epoch (capped link) vs warm local: {spread(ratios, '{:.2f}x')} | | | |")

        # half the data as budget: bytes downloaded per epoch (latency-only link)
        proxy, proxy_port = start_proxy(port, args.low_ms / 1000, args.high_ms / 1000, 0.0)
        procs.append(proxy)
        half = drt.open(
            url,
            storage_options=options(proxy_port),
            cache_dir=work / "half",
            cache_bytes=data_bytes // 2,
        )
        per_epoch, times, before = [], [], 0
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
        print()
        for e in range(3):
            print(
                f"budget = half the data, epoch {e}: {times[e]:.2f} s, downloaded "
                f"{per_epoch[e] / data_bytes:.2f}x the data (LRU: {lru[e] / data_bytes:.2f}x)"
            )
        hs = half.fetch_stats()
        print(
            f"half budget: {hs['requests']} requests, {hs['bytes'] / 1e6:.1f} MB downloaded, "
            f"{hs['evicted_bytes'] / 1e6:.1f} MB evicted, hits {hs['hits']}, "
            f"misses {hs['misses']}"
        )
        shared_budget(url, work, port, args, data_bytes)
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    main()
