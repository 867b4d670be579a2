"""Metadata at scale: what a population of 10^6, 10^7, 10^8 rows costs today.

For each size (rows repeat the samples of one small cache, as a population
that duplicates samples does; the per-row costs are those of the metadata,
not of the payloads):

- publish: ``update_metadata`` of the whole frame (every column written);
- reweight: ``update_metadata`` of a new ``weight`` column (timed apart
  from polars computing it, which is the caller's work), and the bytes it
  writes (snapshots share unchanged columns: it should write one column);
  then a reweight of 1 % of the rows, contiguous (one source's rows, say:
  only the partitions holding them are written) and scattered (every 100th
  row: every partition's weight column is written);
- open + first batch: ``drt.open`` and the first batch of ``ds.loader`` in a
  fresh process, the host's first (no chunk of the snapshot checked yet) and
  a later one (the chunks it reads were checked by an earlier process:
  ``/dev/shm/datasetrt-<uid>/verified``); then ``get_metadata`` in the same
  process (reads, and the first process checks, every column whole);
- SQL group-by: ``SELECT label, count(*), sum(weight) ... GROUP BY label``;
  then the same on two workers (``datasetrt worker`` processes on this host:
  they open the snapshot themselves, scan and aggregate partially, and
  shuffle to a final aggregate) against this process alone, alternating
  (2 cores: no speed-up to expect; what it costs over one process); and a
  ``select`` that reweights every row of one label (every partition's
  weight column written): in this process (the result collected, cut and
  written here) against on the two workers (each stores the partitions it
  computes; this process commits their descriptions);
- alias build: the first weighted draw on a new weight column, then the
  first batch (256 draws): the alias tables they need are built, stored and
  mapped (one per partition a draw lands in); then the first batch after a
  reweight of 1 % of the rows (the tables of the partitions it changed);
- filter: a fresh process (the host's first) opens the dataset and counts
  the rows of ``weight > 1.5`` (only the doubled 1 % weighs that much: the
  partitions' recorded weight ranges leave one partition to read) against
  ``abs(weight) > 1.5`` (the same rows; the ranges cannot see through
  ``abs``, so every partition's weights are mapped, checked and filtered);
- per-reader memory: a fresh process that opens the dataset and reads 100
  batches through ``ds.loader``: anonymous memory it owns (its own heap) and
  the mapped file pages it touched (shared between readers by the OS).

Then, for each ``--distinct`` size, a cache of that many *distinct* records
(the sizes above repeat a small cache's samples; here the cache itself is
large): open + first batch in a fresh process, the host's first and a later
one, with the cache's chunk tables (its index entries and attributes checked
by chunk when read, once per host) against the same cache without them (as
a cache written before them is read: every process checks the index and the
attributes whole when it opens the cache).

Then, for each ``--bucket`` size, such a cache in a bucket (a moto server
on 127.0.0.1, started here): open + first batch in a fresh process, the
host's first (an empty ``cache_dir``: it downloads the cache's index and
attributes) and a later one (the same ``cache_dir``), the anonymous
memory each holds after the batch (what a process keeps per record of a
cache it reads from a bucket), and the next 99 batches.

Last, for each ``--gain`` size, a root of ``--gain-caches`` caches of that
many distinct records in all gains one more cache: ``drt.open`` of the new
set of caches (its first snapshot), assembled from the partitions the set
before recorded (linked, not written) against built from nothing, and the
bytes each writes.

Run by hand: ``python tests/bench/bench_scale.py --profile release --json out.json``.
``--profile`` labels the figures with the profile the extension was built in
(``make release`` for benchmarks; the tests build the dev profile, which is
many times slower in Rust-bound steps). The JSON feeds ``scale_sim.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

import datasetrt as drt

BASE = 100_000
BATCH = 256
VERIFIED = Path(f"/dev/shm/datasetrt-{os.getuid()}/verified")


class Tiny:
    name = "scale-base"

    def __len__(self) -> int:
        return BASE

    def __iter__(self):
        for i in range(BASE):
            yield i.to_bytes(16, "little"), {"label": i % 10, "quality": (i % 100) / 100.0}


def tree_bytes(path: Path) -> dict[str, int]:
    return {str(p): p.stat().st_size for p in path.rglob("*") if p.is_file()}


def snapshot_bytes(ds: drt.Dataset) -> int:
    """Bytes of the active snapshot's column files (from its manifest's ``column=`` lines)."""
    lines = ds.snapshot_path.read_text().splitlines()
    return sum(int(line.split()[2]) for line in lines if line.startswith("column="))


READER = """
import json, os, sys, time
from pathlib import Path

def mem():
    fields = {}
    for line in Path(f"/proc/{os.getpid()}/smaps_rollup").read_text().splitlines()[1:]:
        k, v = line.split(":", 1)
        fields[k] = int(v.split()[0])
    return fields

import datasetrt as drt
m0 = mem()
t = time.perf_counter()
ds = drt.open(sys.argv[1])
opened = time.perf_counter() - t
batches = iter(ds.loader(batch_size=int(sys.argv[2]), seed=3, threads=1, prefetch_batches=1))
next(batches)
first_batch = time.perf_counter() - t
m1 = mem()
for _ in range(99):
    next(batches)
m2 = mem()
metadata = None
if sys.argv[3] == "get_metadata":
    t = time.perf_counter()
    meta = ds.get_metadata()
    metadata = time.perf_counter() - t
print(json.dumps({
    "open_s": opened,
    "first_batch_s": first_batch,
    "get_metadata_s": metadata,
    "anon_open_mib": (m1["Anonymous"] - m0["Anonymous"]) / 1024,
    "anon_read_mib": (m2["Anonymous"] - m0["Anonymous"]) / 1024,
    "rss_mib": m2["Rss"] / 1024,
    "file_pages_mib": (m2["Rss"] - m2["Anonymous"] - m0["Rss"] + m0["Anonymous"]) / 1024,
}))
"""


def reader(root: Path, get_metadata: bool = True) -> dict[str, float]:
    """A fresh process: open, 100 loader batches, get_metadata (unless not
    ``get_metadata``); its memory."""
    then = "get_metadata" if get_metadata else "-"
    out = subprocess.run(
        [sys.executable, "-c", READER, str(root), str(BATCH), then],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


FILTER = """
import json, sys, time
import datasetrt as drt
t = time.perf_counter()
n = drt.open(sys.argv[1]).sql(sys.argv[2]).item()
print(json.dumps({"s": time.perf_counter() - t, "rows": n}))
"""


def filtered(root: Path, where: str) -> dict[str, float]:
    """A fresh process, the host's first (it checks what it reads): open and
    count the rows matching ``where``."""
    shutil.rmtree(VERIFIED, ignore_errors=True)
    query = f"SELECT count(*) FROM metadata WHERE {where}"
    out = subprocess.run(
        [sys.executable, "-c", FILTER, str(root), query],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


SLICE = 1 << 22  # the default partition's rows


def by_slices(meta: pl.DataFrame, make) -> pl.DataFrame:
    """``make(piece, start)`` over ``meta`` cut in slices of ``SLICE`` rows,
    as one chunked frame (``update_metadata`` takes it chunk by chunk).

    A new column computed over the whole frame at once holds several
    columns' worth of polars temporaries (a ``when/then`` over 10^9 rows
    holds four columns of 8 GB: more than this machine has); slice by slice
    it holds one slice's. The result is the same frame."""
    pieces = [make(meta.slice(at, SLICE), at) for at in range(0, meta.height, SLICE)]
    return pl.concat(pieces, rechunk=False)


def on_workers(root: Path, ds: drt.Dataset, q: str, repeat: int) -> dict:
    """The group-by ``q`` and a reweighting ``select`` on two worker
    processes of this host against this process alone, alternating."""
    res: dict = {}
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "datasetrt", "worker", "--port", "0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        urls = [w.stdout.readline().split()[-1] for w in workers]
        there = drt.open(root, workers=urls)
        want = ds.sql(q).sort("label")
        got = there.sql(q).sort("label")
        assert got["n"].equals(want["n"]), (got, want)
        assert (got["w"] - want["w"]).abs().max() <= 1e-6 * want["w"].abs().max()
        here_t, there_t = [], []
        for _ in range(repeat):
            t0 = time.perf_counter()
            ds.sql(q)
            here_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            there.sql(q)
            there_t.append(time.perf_counter() - t0)
        res["groupby_here_s"] = statistics.median(here_t)
        res["groupby_two_workers_s"] = statistics.median(there_t)

        # a reweighting select (a new factor each run: every run writes)
        def reweight(k: int) -> str:
            return (
                "SELECT cache_id, sample_id, label, quality, CASE WHEN label = 3 "
                f"THEN weight * {1 + k / 1000} ELSE weight END AS weight FROM metadata"
            )

        here_t, there_t = [], []
        for k in range(repeat):
            for who, times in ((ds, here_t), (there, there_t)):
                who.refresh()
                t0 = time.perf_counter()
                who.select(reweight(2 * k + (who is there)))
                times.append(time.perf_counter() - t0)
        ds.refresh()
        res["select_here_s"] = statistics.median(here_t)
        res["select_two_workers_s"] = statistics.median(there_t)
    finally:
        for w in workers:
            w.terminate()
            w.wait(timeout=30)
    return res


def measure(
    root: Path, ds: drt.Dataset, base: pl.DataFrame, rows: int, repeat: int, lean: bool
) -> dict:
    """Every figure at ``rows``; with ``lean``, only those of the issue's
    table (publish, SQL group-by once, a contiguous 1 % reweight, the alias
    tables, readers without ``get_metadata``): what fits this machine's
    memory and disk at 10^9 rows."""
    res: dict = {"rows": rows, "lean": lean}
    reps = -(-rows // base.height)
    frame = pl.concat([base] * reps).head(rows)  # chunks share base's buffers
    t0 = time.perf_counter()
    ds.update_metadata(frame)
    res["publish_s"] = time.perf_counter() - t0
    del frame
    res["snapshot_bytes_per_row"] = snapshot_bytes(ds) / rows
    print(f"{rows:.0e}: published in {res['publish_s']:.1f} s", file=sys.stderr)

    if not lean:
        # reweight: a new weight column (1 / count over label); what it writes
        meta = ds.get_metadata()
        before = tree_bytes(root)
        counts = meta.group_by("label").len()
        new = by_slices(
            meta,
            lambda m, _: m.with_columns(
                pl.col("label")
                .replace_strict(counts["label"], 1.0 / counts["len"], return_dtype=pl.Float64)
                .alias("weight")
            ),
        )
        t0 = time.perf_counter()
        ds.update_metadata(new)
        res["reweight_s"] = time.perf_counter() - t0
        del new, meta
        after = tree_bytes(root)
        res["reweight_written_bytes"] = sum(v for k, v in after.items() if k not in before)
    res["weight_column_bytes"] = rows * 8
    history = ds.history()
    res["partitions"] = int(history["partitions"][-1]) if "partitions" in history.columns else 1

    def reweight_1pct(chosen) -> pl.DataFrame:
        """The active population with the weight of the rows ``chosen(row)`` doubled."""
        return by_slices(
            ds.get_metadata(),
            lambda m, at: m.with_columns(
                pl.when(chosen(pl.int_range(pl.len()) + at))
                .then(pl.col("weight") * 2)
                .otherwise(pl.col("weight"))
            ),
        )

    ways = [("contiguous", lambda row: row < rows // 100)]
    if not lean:
        ways.append(("scattered", lambda row: row % 100 == 0))
    for name, chosen in ways:
        before = tree_bytes(root)
        t0 = time.perf_counter()
        new = reweight_1pct(chosen)
        res[f"reweight_1pct_{name}_polars_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        ds.update_metadata(new)
        res[f"reweight_1pct_{name}_s"] = time.perf_counter() - t0
        del new
        after = tree_bytes(root)
        res[f"reweight_1pct_{name}_written_bytes"] = sum(
            v for k, v in after.items() if k not in before
        )
    res["alias_bytes_per_row"] = 12  # f64 probability + u32 alias (docs/FORMAT.md)

    # SQL group-by (median of `repeat`; one run when lean)
    q = "SELECT label, count(*) AS n, sum(weight) AS w FROM metadata GROUP BY label"
    ds.sql(q)
    times = []
    for _ in range(1 if lean else repeat):
        t0 = time.perf_counter()
        ds.sql(q)
        times.append(time.perf_counter() - t0)
    res["groupby_s"] = statistics.median(times)
    if not lean:
        res.update(on_workers(root, ds, q, repeat))

    # alias tables of a fresh weight column: the first weighted draw makes
    # the table of the partition it lands in, the rest of a first batch the
    # tables of every partition its draws land in (together, on the
    # engine's threads); then a reweight of 1 % of the rows (contiguous)
    # and the next first batch: one partition's table is new. The weight
    # differs in every partition (the base's samples repeat with a period
    # that would give partitions equal weight columns, which share a table)
    def aliases() -> set[str]:
        return {p.name for p in root.rglob("*.alias")}

    ds.update_metadata(
        by_slices(
            ds.get_metadata(),
            lambda m, at: m.with_columns(
                ((pl.col("quality") + 0.01) * (1.0 + at / rows)).alias("weight")
            ),
        )
    )
    before = aliases()
    t0 = time.perf_counter()
    ds.draws(1, count=1)
    res["alias_first_draw_s"] = time.perf_counter() - t0
    ds.draws(1, count=BATCH)
    res["alias_build_s"] = time.perf_counter() - t0
    res["alias_tables_built"] = len(aliases() - before)
    ds.update_metadata(reweight_1pct(lambda row: row < rows // 100))
    before = aliases()
    t0 = time.perf_counter()
    ds.draws(1, count=BATCH)
    res["alias_after_reweight_1pct_s"] = time.perf_counter() - t0
    res["alias_tables_after_reweight_1pct"] = len(aliases() - before)
    print(f"{rows:.0e}: alias tables measured", file=sys.stderr)

    if not lean:
        # a filter the partitions' recorded ranges answer (only the doubled
        # 1 % weighs over 1.5: one partition read) against the same rows
        # through an expression the ranges cannot see through (every
        # partition read)
        pruned = [filtered(root, "weight > 1.5") for _ in range(repeat)]
        full = [filtered(root, "abs(weight) > 1.5") for _ in range(repeat)]
        assert {r["rows"] for r in pruned} == {r["rows"] for r in full}, (pruned, full)
        res["filter_rows"] = pruned[0]["rows"]
        res["filter_pruned_s"] = statistics.median(r["s"] for r in pruned)
        res["filter_full_s"] = statistics.median(r["s"] for r in full)

    # a fresh reader process (page cache warm: the files were just written):
    # the host's first checks the chunks it reads and records that; the
    # second and later ones skip them (/dev/shm/datasetrt-<uid>/verified,
    # emptied here so that the first is the host's first). The alias tables
    # of the partitions the readers' draws land in are made first (they are
    # stored in the dataset, made once by whichever process draws first:
    # their cost is the alias figures above)
    ds.draws(3, count=100 * BATCH)
    shutil.rmtree(VERIFIED, ignore_errors=True)
    first = reader(root, get_metadata=not lean)
    for key in first:
        res[f"reader_{key}"] = first[key]
    runs = [reader(root, get_metadata=not lean) for _ in range(max(1, repeat // 2))]
    for key in runs[0]:
        got = [r[key] for r in runs if r[key] is not None]
        res[f"second_reader_{key}"] = statistics.median(got) if got else None
    return res


class Distinct:
    """``n`` distinct 16-byte records with one metadata key."""

    def __init__(self, n: int, name: str | None = None):
        self.n = n
        self.name = name or f"distinct-{n}"

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        for i in range(self.n):
            yield i.to_bytes(16, "little"), {"label": i % 10}


def distinct_cache(tmp: Path, n: int, repeat: int) -> dict:
    """Open + first batch over one cache of ``n`` distinct records, with and
    without its chunk tables (the layout before them), alternating."""
    root = tmp / f"distinct-{n}"
    t = time.perf_counter()
    drt.build(root, [Distinct(n)], progress=False)  # and its first population
    res: dict = {"records": n, "build_s": time.perf_counter() - t}
    tables = {p: p.read_bytes() for p in (root / f"distinct-{n}").glob("*.chunks")}
    assert len(tables) == 2, tables
    runs: dict[str, list] = {"chunked": [], "whole": []}
    for _ in range(repeat):
        for layout in ("whole", "chunked"):
            for p, b in tables.items():
                if layout == "chunked":
                    p.write_bytes(b)
                else:
                    p.unlink(missing_ok=True)
            shutil.rmtree(VERIFIED, ignore_errors=True)
            first = reader(root)  # the host's first process
            later = reader(root)
            runs[layout].append((first, later))
    for layout, pairs in runs.items():
        res[f"{layout}_first_s"] = statistics.median(f["first_batch_s"] for f, _ in pairs)
        res[f"{layout}_later_s"] = statistics.median(x["first_batch_s"] for _, x in pairs)
        res[f"{layout}_anon_mib"] = statistics.median(x["anon_open_mib"] for _, x in pairs)
    shutil.rmtree(root)
    return res


BUCKET_READER = """
import json, os, sys, time
from pathlib import Path

def anon():
    for line in Path(f"/proc/{os.getpid()}/smaps_rollup").read_text().splitlines()[1:]:
        if line.startswith("Anonymous:"):
            return int(line.split()[1]) / 1024

import datasetrt as drt
url, options, cache_dir, batch = json.loads(sys.argv[1])
m0 = anon()
t = time.perf_counter()
ds = drt.open(url, storage_options=options, cache_dir=cache_dir)
batches = iter(ds.loader(batch_size=batch, seed=3, threads=1, prefetch_batches=1))
next(batches)
took = time.perf_counter() - t
held = anon() - m0
t = time.perf_counter()
for _ in range(99):
    if next(batches, None) is None:
        break
print(json.dumps({"first_batch_s": took, "anon_mib": held, "next_99_s": time.perf_counter() - t}))
"""


def bucket_cache(tmp: Path, n: int, repeat: int) -> dict:
    """Open + first batch over one cache of ``n`` distinct records in a
    bucket (moto on 127.0.0.1): the host's first process and a later one,
    and the anonymous memory each holds then."""
    import boto3
    from bench_remote import options as s3_options  # this directory's
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        options = s3_options(port)
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        ).create_bucket(Bucket="scale")
        url = f"s3://scale/distinct-{n}"
        t = time.perf_counter()
        drt.build(
            url,
            [Distinct(n)],
            storage_options=options,
            cache_dir=tmp / f"bucket-build-{n}",
            progress=False,
        )
        res: dict = {"records": n, "build_s": time.perf_counter() - t}
        shutil.rmtree(tmp / f"bucket-build-{n}")
        runs = []
        for _ in range(repeat):
            cache_dir = tmp / f"bucket-read-{n}"
            shutil.rmtree(cache_dir, ignore_errors=True)
            shutil.rmtree(VERIFIED, ignore_errors=True)
            arg = json.dumps([url, options, str(cache_dir), BATCH])
            got = []
            for _ in ("first", "later"):
                out = subprocess.run(
                    [sys.executable, "-c", BUCKET_READER, arg],
                    capture_output=True,
                    text=True,
                    timeout=1800,
                )
                if out.returncode != 0:
                    raise RuntimeError(out.stderr)
                got.append(json.loads(out.stdout.strip().splitlines()[-1]))
            runs.append(got)
            shutil.rmtree(cache_dir)
        for i, who in enumerate(("first", "later")):
            res[f"{who}_s"] = statistics.median(r[i]["first_batch_s"] for r in runs)
            res[f"{who}_anon_mib"] = statistics.median(r[i]["anon_mib"] for r in runs)
            res[f"{who}_next_99_s"] = statistics.median(r[i]["next_99_s"] for r in runs)
        return res
    finally:
        server.stop()


def written_bytes(snapshot_dir: Path) -> int:
    """Bytes of the files in ``snapshot_dir`` written there (a file linked
    from another snapshot directory has more than one link)."""
    return sum(
        p.stat().st_size for p in snapshot_dir.rglob("*") if p.is_file() and p.stat().st_nlink == 1
    )


def gained_source(tmp: Path, rows: int, caches: int, repeat: int) -> dict:
    """A root of ``caches`` caches holding ``rows`` distinct records gains one
    more cache of ``rows / caches``: ``drt.open`` of the new set (its first
    population) assembled from the partitions the set before recorded,
    against built from nothing (a snapshot base without records, as every
    new set of caches was built before), alternating."""
    root = tmp / f"gain-{rows}"
    each = rows // caches
    t = time.perf_counter()
    drt.build(root, [Distinct(each, f"part-{i}") for i in range(caches)], progress=False)
    res: dict = {"rows": rows, "caches": caches, "build_s": time.perf_counter() - t}
    snapshots = root / "_snapshots"
    records = snapshots / "parts"
    saved = {p.name: p.read_bytes() for p in records.iterdir()}
    before = set(snapshots.iterdir())
    # the new cache is written beside the root, then moved in: building it
    # in place would open (and assemble) the new set
    side = tmp / f"gain-{rows}-side"
    drt.build(side, [Distinct(each, "added")], progress=False)
    shutil.move(side / "added", root / "added")
    shutil.rmtree(side)
    fresh = tmp / f"gain-{rows}-fresh"
    runs: dict[str, list] = {"assembled": [], "built": []}
    for _ in range(repeat):
        for way in ("built", "assembled"):
            for d in set(snapshots.iterdir()) - before:
                shutil.rmtree(d)
            shutil.rmtree(records)
            records.mkdir()
            for name, raw in saved.items():
                (records / name).write_bytes(raw)
            shutil.rmtree(fresh, ignore_errors=True)
            base = fresh if way == "built" else None
            t = time.perf_counter()
            ds = drt.open(root, snapshot_dir=base)
            took = time.perf_counter() - t
            assert len(ds) == rows + each, len(ds)
            new = [d for d in (fresh if base else snapshots).iterdir() if d not in before]
            new = [d for d in new if d.name != "parts"]
            assert len(new) == 1, new
            runs[way].append((took, written_bytes(new[0])))
            del ds
    for way, got in runs.items():
        res[f"{way}_s"] = statistics.median(t for t, _ in got)
        res[f"{way}_written_bytes"] = statistics.median(b for _, b in got)
    shutil.rmtree(root)
    shutil.rmtree(fresh, ignore_errors=True)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rows", type=int, nargs="*", default=[1_000_000, 10_000_000])
    p.add_argument(
        "--lean",
        type=int,
        nargs="*",
        default=[],
        help="sizes of --rows measured for the issue's table only (1e9 fits this machine so)",
    )
    p.add_argument("--distinct", type=int, nargs="*", default=[1_000_000, 10_000_000])
    p.add_argument("--bucket", type=int, nargs="*", default=[1_000_000])
    p.add_argument("--gain", type=int, nargs="*", default=[1_000_000, 10_000_000])
    p.add_argument("--gain-caches", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--profile", required=True, help="the extension's build profile (dev/release)")
    p.add_argument("--json", type=Path)
    p.add_argument("--dir", type=Path, default=None, help="where to build (default: a temp dir)")
    args = p.parse_args()

    results = {
        "profile": args.profile,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "sizes": [],
        "distinct": [],
        "bucket": [],
        "gain": [],
    }
    with tempfile.TemporaryDirectory(prefix="drt-scale-", dir=args.dir) as tmp:
        root = Path(tmp)
        ds = drt.build(root, [Tiny()], progress=False)
        base = ds.get_metadata().select("cache_id", "sample_id", "label", "quality", "weight")
        print(f"extension profile: {args.profile}; {os.cpu_count()} CPUs")
        for rows in args.rows:
            res = measure(root, ds, base, rows, args.repeat, rows in args.lean)
            results["sizes"].append(res)
            print(json.dumps(res))
            sys.stdout.flush()
            ds.cleanup(keep=1)
        for n in args.distinct:
            res = distinct_cache(root, n, args.repeat)
            results["distinct"].append(res)
            print(json.dumps(res))
            sys.stdout.flush()
        for n in args.bucket:
            res = bucket_cache(root, n, args.repeat)
            results["bucket"].append(res)
            print(json.dumps(res))
            sys.stdout.flush()
        for rows in args.gain:
            res = gained_source(root, rows, args.gain_caches, args.repeat)
            results["gain"].append(res)
            print(json.dumps(res))
            sys.stdout.flush()
    ms = lambda s: f"{s * 1e3:.0f} ms"  # noqa: E731
    print(
        "\n| rows (partitions) | open + first batch, the host's first process / a later one "
        "| reweight 1 % of rows, contiguous (written) "
        "| alias build: first batch (tables) / after a 1 % reweight (tables) "
        "| publish | SQL group-by | reader heap, first / later |\n|---|---|---|---|---|---|---|"
    )
    for r in results["sizes"]:
        print(
            f"| {r['rows']:.0e} ({r['partitions']}) | {ms(r['reader_first_batch_s'])} / "
            f"{ms(r['second_reader_first_batch_s'])} "
            f"| {ms(r['reweight_1pct_contiguous_s'])} "
            f"({r['reweight_1pct_contiguous_written_bytes'] / 2**20:.0f} MiB) "
            f"| {ms(r['alias_build_s'])} ({r['alias_tables_built']}) / "
            f"{ms(r['alias_after_reweight_1pct_s'])} ({r['alias_tables_after_reweight_1pct']}) "
            f"| {r['publish_s']:.1f} s | {ms(r['groupby_s'])} "
            f"| {r['reader_anon_read_mib']:.1f} / {r['second_reader_anon_read_mib']:.1f} MiB |"
        )
    print(
        "\n| rows | open + first batch, the host's first process / a later one "
        "| get_metadata, first / later | SQL group-by "
        "| reweight all (written) | reweight 1 %, contiguous / scattered (written) "
        "| alias build: first draw / first batch (tables) / after a 1 % reweight (tables) "
        "| filter, pruned / every partition (ratio) "
        "| group-by on 2 workers / here (ratio) | select reweight on 2 workers / here (ratio) "
        "| reader anon / file pages |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|"
    )
    for r in results["sizes"]:
        if r["lean"]:
            continue
        print(
            f"| {r['rows']:.0e} | {ms(r['reader_first_batch_s'])} / "
            f"{ms(r['second_reader_first_batch_s'])} "
            f"| {ms(r['reader_get_metadata_s'])} / {ms(r['second_reader_get_metadata_s'])} "
            f"| {r['groupby_s'] * 1e3:.0f} ms "
            f"| {r['reweight_s'] * 1e3:.0f} ms ({r['reweight_written_bytes'] / 2**20:.0f} MiB) "
            f"| {ms(r['reweight_1pct_contiguous_s'])} "
            f"({r['reweight_1pct_contiguous_written_bytes'] / 2**20:.0f} MiB) / "
            f"{ms(r['reweight_1pct_scattered_s'])} "
            f"({r['reweight_1pct_scattered_written_bytes'] / 2**20:.0f} MiB) "
            f"| {ms(r['alias_first_draw_s'])} / {ms(r['alias_build_s'])} "
            f"({r['alias_tables_built']}) / {ms(r['alias_after_reweight_1pct_s'])} "
            f"({r['alias_tables_after_reweight_1pct']}) "
            f"| {ms(r['filter_pruned_s'])} / {ms(r['filter_full_s'])} "
            f"({r['filter_pruned_s'] / r['filter_full_s']:.2f}x) "
            f"| {ms(r['groupby_two_workers_s'])} / {ms(r['groupby_here_s'])} "
            f"({r['groupby_two_workers_s'] / r['groupby_here_s']:.2f}x) "
            f"| {ms(r['select_two_workers_s'])} / {ms(r['select_here_s'])} "
            f"({r['select_two_workers_s'] / r['select_here_s']:.2f}x) "
            f"| {r['reader_anon_read_mib']:.0f} / "
            f"{r['reader_file_pages_mib']:.0f} MiB |"
        )
    print(
        "\n| distinct records in one cache | open + first batch, the host's first process: "
        "whole → by chunk | a later process: whole → by chunk | reader heap after open |\n"
        "|---|---|---|---|"
    )
    for r in results["distinct"]:
        print(
            f"| {r['records']:.0e} | {ms(r['whole_first_s'])} → {ms(r['chunked_first_s'])} "
            f"({r['chunked_first_s'] / r['whole_first_s']:.2f}x) "
            f"| {ms(r['whole_later_s'])} → {ms(r['chunked_later_s'])} "
            f"({r['chunked_later_s'] / r['whole_later_s']:.2f}x) "
            f"| {r['whole_anon_mib']:.1f} → {r['chunked_anon_mib']:.1f} MiB |"
        )
    print(
        "\n| distinct records in one cache in a bucket | open + first batch, "
        "the host's first process / a later one | heap held then, first / later "
        "| the next 99 batches, first / later |\n"
        "|---|---|---|---|"
    )
    for r in results["bucket"]:
        print(
            f"| {r['records']:.0e} | {ms(r['first_s'])} / {ms(r['later_s'])} "
            f"| {r['first_anon_mib']:.1f} / {r['later_anon_mib']:.1f} MiB "
            f"| {ms(r['first_next_99_s'])} / {ms(r['later_next_99_s'])} |"
        )
    print(
        "\n| rows in the root | a root that gains a cache: open the new set, "
        "built from nothing → assembled (ratio) | written |\n|---|---|---|"
    )
    for r in results["gain"]:
        mib = lambda b: f"{b / 2**20:.0f} MiB"  # noqa: E731
        print(
            f"| {r['rows']:.0e} in {r['caches']} caches, + {r['rows'] // r['caches']:.0e} "
            f"| {ms(r['built_s'])} → {ms(r['assembled_s'])} "
            f"({r['assembled_s'] / r['built_s']:.2f}x) "
            f"| {mib(r['built_written_bytes'])} → {mib(r['assembled_written_bytes'])} |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
