"""Imports at disk speed: ``drt.build`` over each of ``drt.sources``'
formats against reading the same files alone through the same reader (the
source's ``tables()``, every payload byte hashed, nothing written), in the same
run, alternating, on about 1 GiB of payloads per format.

Run by hand: ``python tests/bench/bench_imports.py [--format mds]`` (``make
bench`` runs every format). The target (issue 38): the build's throughput
at least 0.8x that of reading the source alone. Payloads are incompressible
by default, as JPEG or preprocessed tensors are, and written with
``codec="none"`` unless ``--codec`` says otherwise: the ratio then measures
what the import adds to the read (the records' copy, checksums, the shard
writes, the metadata), not zstd's speed. A source read from the page
cache reads faster than any disk writes, so each format also shows the
build against writing the same bytes alone (fsynced, as a build's shards
are): the ceiling the read ratio meets. With ``--cold`` the source files
are dropped from the page cache (``posix_fadvise(POSIX_FADV_DONTNEED)``,
as bench_cold does) before every read and every build: both then read the
disk, as an import of data that lives there does. With ``--processes N``
each format's one source is instead built by N processes (cut into N
parts, written at once, joined into one cache) against one process,
alternating: the speed-up of ``build(processes=N)`` for a single source.

Format ``memory`` has no files: tables already in memory, so its build
shows what a build costs beyond any source, against the durable write.

The files are made with each format's library where the dev extra has it
(polars for Parquet, tarfile for WebDataset, ``datasets``, ``pylance``); MDS
shards are laid out here as MDSWriter lays them (mosaicml-streaming is not
in the dev extra; the tests read fixtures its writer made).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl

import datasetrt as drt


def payloads(total_bytes: int, record_bytes: int, parts: int) -> list[list[bytes]]:
    per_part = max(1, total_bytes // record_bytes // parts)
    return [[os.urandom(record_bytes) for _ in range(per_part)] for _ in range(parts)]


def make_parquet(directory: Path, parts: list[list[bytes]]) -> Callable[[str], object]:
    for k, data in enumerate(parts):
        frame = pl.DataFrame(
            {
                "data": pl.Series(data, dtype=pl.Binary),
                "label": [i % 10 for i in range(len(data))],
                "caption": [f"file {k} record {i}" for i in range(len(data))],
            }
        )
        frame.write_parquet(directory / f"part-{k:03d}.parquet", compression="uncompressed")
    return lambda name: drt.sources.Parquet(directory / "*.parquet", name=name)


def make_webdataset(directory: Path, parts: list[list[bytes]]) -> Callable[[str], object]:
    for k, data in enumerate(parts):
        with tarfile.open(directory / f"shard-{k:03d}.tar", "w") as tar:
            for i, blob in enumerate(data):
                for ext, body in (("jpg", blob), ("cls", str(i % 10).encode())):
                    info = tarfile.TarInfo(f"s{k:03d}{i:06d}.{ext}")
                    info.size = len(body)
                    tar.addfile(info, io.BytesIO(body))
    return lambda name: drt.sources.WebDataset(
        directory / "*.tar", name=name, data="jpg", metadata={"cls": int}
    )


def make_mds(directory: Path, parts: list[list[bytes]]) -> Callable[[str], object]:
    """MDS version 2 shards as MDSWriter lays them: count, offsets, the
    writer's settings (JSON), then each sample (its variable sizes, then
    its columns: data bytes, label int)."""
    shards = []
    settings = {
        "column_encodings": ["bytes", "int"],
        "column_names": ["data", "label"],
        "column_sizes": [None, 8],
        "compression": None,
        "format": "mds",
        "hashes": [],
        "size_limit": 1 << 26,
        "version": 2,
    }
    config = json.dumps(settings, sort_keys=True).encode()
    for k, data in enumerate(parts):
        samples = [
            len(blob).to_bytes(4, "little") + blob + (i % 10).to_bytes(8, "little")
            for i, blob in enumerate(data)
        ]
        start = 4 * (len(samples) + 2) + len(config)
        offsets = np.cumsum([start] + [len(s) for s in samples], dtype=np.uint32)
        body = len(samples).to_bytes(4, "little") + offsets.astype("<u4").tobytes() + config
        name = f"shard.{k:05d}.mds"
        with open(directory / name, "wb") as f:
            f.write(body)
            for sample in samples:
                f.write(sample)
        raw = {"basename": name, "bytes": int(offsets[-1]), "hashes": {}}
        shards.append({**settings, "raw_data": raw, "samples": len(data), "zip_data": None})
    (directory / "index.json").write_text(json.dumps({"shards": shards, "version": 2}))
    return lambda name: drt.sources.MDS(directory, name=name, data="data")


def make_huggingface(directory: Path, parts: list[list[bytes]]) -> Callable[[str], object]:
    import datasets

    datasets.disable_progress_bars()
    data = [blob for part in parts for blob in part]
    features = datasets.Features(
        {"data": datasets.Value("binary"), "label": datasets.Value("int64")}
    )
    table = {"data": data, "label": [i % 10 for i in range(len(data))]}
    datasets.Dataset.from_dict(table, features=features).save_to_disk(
        directory / "saved", num_shards=len(parts)
    )
    return lambda name: drt.sources.HuggingFace(directory / "saved", name=name, data="data")


def make_lance(directory: Path, parts: list[list[bytes]]) -> Callable[[str], object]:
    import lance
    import pyarrow as pa

    def batches():
        for part in parts:
            yield pa.record_batch(
                {"data": pa.array(part, pa.binary()), "label": list(range(len(part)))}
            )

    schema = pa.schema([("data", pa.binary()), ("label", pa.int64())])
    lance.write_dataset(pa.RecordBatchReader.from_batches(schema, batches()), directory / "d.lance")
    return lambda name: drt.sources.Lance(directory / "d.lance", name=name, data="data")


class InMemory:
    """Tables already in memory: the build's own cost, no source to read
    (what a build costs beyond its source; against the durable write)."""

    read_ahead = True

    def __init__(self, name: str, frames: list[pl.DataFrame]):
        self.name, self.frames = name, frames

    def tables(self):
        yield from self.frames


def make_memory(directory: Path, parts: list[list[bytes]]) -> Callable[[str], object]:
    frames = [
        pl.DataFrame({"data": pl.Series(data, dtype=pl.Binary), "label": range(len(data))})
        for data in parts
    ]
    return lambda name: InMemory(name, frames)


FORMATS = {
    "parquet": make_parquet,
    "webdataset": make_webdataset,
    "mds": make_mds,
    "huggingface": make_huggingface,
    "lance": make_lance,
    "memory": make_memory,
}


def read_alone(source: object) -> float:
    """Read every batch's payload and metadata, as the import does, and drop it."""
    t = time.perf_counter()
    for table in source.tables():
        # every payload byte read once (a memory-mapped source reads nothing
        # until its bytes are touched), by polars' hash, at memory speed
        table[source_column(source)].hash()
    return time.perf_counter() - t


def source_column(source: object) -> str:
    return getattr(source, "data_column", "data")


def durable_write(directory: Path, size: int) -> float:
    """The floor of any build: `size` bytes written to a file and fsynced
    (as a build's shards are), in 4 MiB writes."""
    block = os.urandom(4 << 20)
    path = directory / "write-alone.bin"
    t = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for _ in range(-(-size // len(block))):
            os.write(fd, block)
        os.fsync(fd)
    finally:
        os.close(fd)
    elapsed = time.perf_counter() - t
    path.unlink()
    return elapsed


def evict(directory: Path) -> None:
    """Drop the files under `directory` from the page cache (written back
    first: only clean pages leave)."""
    os.sync()
    for f in directory.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def build(source: object, root: Path, codec: str, processes: int = 1) -> float:
    t = time.perf_counter()
    drt.build(root, [source], codec=codec, progress=False, processes=processes)
    return time.perf_counter() - t


def bench_split(name: str, args: argparse.Namespace) -> float:
    """One source built by ``processes=N`` (cut into N parts, written at
    once, joined) against the same source by one process, alternating."""
    with tempfile.TemporaryDirectory(prefix=f"drt-split-{name}-") as tmp:
        tmp = Path(tmp)
        (tmp / "src").mkdir()
        parts = payloads(int(args.gib * (1 << 30)), args.record_kib << 10, args.files)
        make = FORMATS[name](tmp / "src", parts)
        del parts
        print(f"{name}: one source of {args.files} files, codec={args.codec}")
        one, many = [], []
        for trial in range(args.trials):
            one.append(build(make(f"{name}-v1"), tmp / f"one-{trial}", args.codec))
            shutil.rmtree(tmp / f"one-{trial}")
            many.append(
                build(make(f"{name}-v1"), tmp / f"many-{trial}", args.codec, args.processes)
            )
            shutil.rmtree(tmp / f"many-{trial}")
        for what, times in (("1 process", one), (f"{args.processes} processes", many)):
            print(
                f"  {what:>12}: median {statistics.median(times):.2f} s, "
                f"trials {', '.join(f'{t:.2f}' for t in times)}"
            )
        speedup = [a / b for a, b in zip(one, many, strict=True)]
        print(
            f"  speed-up of processes={args.processes}: median {statistics.median(speedup):.2f}x "
            f"(trials {min(speedup):.2f}-{max(speedup):.2f}x)"
        )
        return statistics.median(speedup)


def bench(name: str, args: argparse.Namespace) -> float:
    with tempfile.TemporaryDirectory(prefix=f"drt-imports-{name}-") as tmp:
        tmp = Path(tmp)
        (tmp / "src").mkdir()
        parts = payloads(int(args.gib * (1 << 30)), args.record_kib << 10, args.files)
        n = sum(map(len, parts))
        make = FORMATS[name](tmp / "src", parts)
        del parts
        size = sum(f.stat().st_size for f in (tmp / "src").rglob("*") if f.is_file())
        size = size or n * (args.record_kib << 10)  # in memory: the payloads
        print(
            f"{name}: {n} records of {args.record_kib} KiB, {size / (1 << 30):.2f} GiB "
            f"on disk, codec={args.codec}, {'cold' if args.cold else 'page-cached'} source"
        )
        reads, builds, writes = [], [], []
        for trial in range(args.trials):
            if args.cold:
                evict(tmp / "src")
            reads.append(read_alone(make(f"{name}-v1")))
            if args.cold:
                evict(tmp / "src")
            builds.append(build(make(f"{name}-v1"), tmp / f"cache-{trial}", args.codec))
            writes.append(durable_write(tmp, size))
            shutil.rmtree(tmp / f"cache-{trial}")
        for what, times in (("read alone", reads), ("build", builds), ("write alone", writes)):
            print(
                f"  {what:>10}: median {statistics.median(times):.2f} s "
                f"({size / statistics.median(times) / (1 << 20):.0f} MiB/s), "
                f"trials {', '.join(f'{t:.2f}' for t in times)}"
            )
        ratios = [r / b for r, b in zip(reads, builds, strict=True)]
        print(
            f"  build throughput / read throughput: median {statistics.median(ratios):.2f}x "
            f"(trials {min(ratios):.2f}-{max(ratios):.2f}x; target >= 0.8x)"
        )
        ceiling = [w / b for w, b in zip(writes, builds, strict=True)]
        print(
            f"  build throughput / durable write of the same bytes: median "
            f"{statistics.median(ceiling):.2f}x (trials {min(ceiling):.2f}-{max(ceiling):.2f}x)"
        )
        return statistics.median(ratios)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--format", choices=[*FORMATS, "all"], default="all")
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--record-kib", type=int, default=64)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--codec", default="none")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--cold", action="store_true", help="read the sources from disk, not memory")
    p.add_argument(
        "--processes",
        type=int,
        default=1,
        help="above 1: one source split over this many processes against one process",
    )
    args = p.parse_args()
    names = list(FORMATS) if args.format == "all" else [args.format]
    if args.processes > 1:
        names = [n for n in names if n not in ("lance", "memory")]  # these do not split
        ratios = {name: bench_split(name, args) for name in names}
        print("median speed-ups: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
        return
    ratios = {name: bench(name, args) for name in names}
    print("median ratios: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))


if __name__ == "__main__":
    main()
