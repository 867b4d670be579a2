"""The ``datasetrt`` command: look at and manage a dataset from a shell.

    datasetrt info PATH [--json]
    datasetrt sql PATH "SELECT ..." [--format table|csv|json|parquet] [--output FILE]
    datasetrt history PATH [--json]
    datasetrt diff PATH A B
    datasetrt checkout PATH N|TAG
    datasetrt tag PATH NAME [--snapshot N]
    datasetrt cleanup PATH --keep N [--apply]
    datasetrt export PATH --to FILE.parquet
    datasetrt verify PATH [--json] [--no-progress]
    datasetrt worker [--host HOST] [--port N]

``PATH`` is what :func:`datasetrt.open` takes: a root holding caches or a
cache directory (``worker`` takes none: it serves distributed SQL, see
:mod:`datasetrt.worker`). Exit codes: 0 ok, 1 an error while running (the message
names what is wrong), 2 a usage error, 3 ``verify`` found damage. Also run
as ``python -m datasetrt``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from . import _native
from . import open as open_dataset
from .dataset import Dataset
from .exceptions import CorruptCacheError, DatasetRTError

OK, FAILED, USAGE, CORRUPT = 0, 1, 2, 3

#: Rows a table prints before it says how many it left out.
TABLE_ROWS = 50


def _snapshot(text: str) -> int | str:
    """A snapshot argument: a number, or else a tag."""
    return int(text) if text.isdigit() else text


def _table(frame: pl.DataFrame, rows: int = TABLE_ROWS) -> str:
    with pl.Config(
        tbl_rows=rows,
        tbl_cols=-1,
        fmt_str_lengths=200,
        tbl_width_chars=200,
        tbl_hide_dataframe_shape=True,
    ):
        return str(frame)


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, default=str)


def _open(args: argparse.Namespace) -> Dataset:
    workers = getattr(args, "worker", None) or ()
    return open_dataset(args.path, snapshot_dir=args.snapshot_dir, workers=workers)


def info_of(ds: Dataset) -> dict[str, Any]:
    """What ``datasetrt info`` reports, as data."""
    version = ds.version
    history = ds.history().filter(pl.col("version") == version)
    meta = ds.get_metadata()
    return {
        "caches": [
            {**{k: v for k, v in c.items() if k != "path"}, "path": os.fspath(c["path"])}
            for c in ds.caches
        ],
        "rows": len(ds),
        "columns": {name: str(dtype) for name, dtype in meta.schema.items()},
        "snapshot": version,
        "head": ds.head,
        "fingerprint": ds.fingerprint,
        "note": history["note"][0] if history.height else None,
        "tags": ds.tags(),
        "snapshots": ds.history().height,
    }


def cmd_info(args: argparse.Namespace) -> int:
    info = info_of(_open(args))
    if args.json:
        print(_json(info))
        return OK
    print(f"{info['rows']:,} rows in snapshot {info['snapshot']} (head {info['head']})")
    print(f"fingerprint {info['fingerprint']}; note: {info['note']}")
    print(
        f"{info['snapshots']} snapshots; tags: "
        + (", ".join(f"{t}={n}" for t, n in sorted(info["tags"].items())) or "none")
    )
    print(f"\n{len(info['caches'])} caches:")
    print(
        _table(pl.DataFrame(info["caches"]).select("name", "cache_id", "records", "codec", "path"))
    )
    print(f"\n{len(info['columns'])} columns:")
    for name, dtype in info["columns"].items():
        print(f"  {name}: {dtype}")
    return OK


def cmd_sql(args: argparse.Namespace) -> int:
    frame = _open(args).sql(args.query)
    if args.format == "parquet":
        frame.write_parquet(args.output)
    elif args.format in ("csv", "json"):
        text = frame.write_csv() if args.format == "csv" else frame.write_json()
        if args.output is None:
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
        else:
            Path(args.output).write_text(text)
    else:
        text = _table(frame)
        if args.output is None:
            print(text)
            if frame.height > TABLE_ROWS:
                print(f"({frame.height:,} rows; --format csv prints them all)")
        else:
            Path(args.output).write_text(text + "\n")
    return OK


def cmd_worker(args: argparse.Namespace) -> int:
    from .worker import Worker

    worker = Worker(args.host, args.port)
    # the first line says where it serves (a script starting it reads it)
    print(f"datasetrt worker serving on {worker.url}", flush=True)
    worker.serve_forever()
    return OK


def cmd_history(args: argparse.Namespace) -> int:
    ds = _open(args)
    history = ds.history()
    tags: dict[int, list[str]] = {}
    for name, number in sorted(ds.tags().items()):
        tags.setdefault(number, []).append(name)
    history = history.with_columns(
        pl.col("version")
        .map_elements(lambda v: ",".join(tags.get(v, [])), pl.String)
        .alias("tags"),
        (pl.col("version") == ds.head).alias("head"),
    )
    if args.json:
        print(_json(history.to_dicts()))
    else:
        print(_table(history, rows=-1))
    return OK


def cmd_diff(args: argparse.Namespace) -> int:
    diff = _open(args).diff(_snapshot(args.a), _snapshot(args.b))
    counts = diff["change"].value_counts().sort("change")
    summary = ", ".join(f"{n:,} {c}" for c, n in counts.iter_rows()) or "no change"
    print(f"{args.a} -> {args.b}: {summary}")
    if diff.height:
        print(_table(diff))
    return OK


def cmd_checkout(args: argparse.Namespace) -> int:
    ds = _open(args)
    number = ds.checkout(_snapshot(args.snapshot))
    print(f"head is snapshot {number} ({len(ds):,} rows)")
    return OK


def cmd_tag(args: argparse.Namespace) -> int:
    ds = _open(args)
    number = ds.version if args.snapshot is None else args.snapshot
    ds.tag(args.name, number)
    print(f"tagged snapshot {number} as {args.name!r}")
    return OK


def cmd_cleanup(args: argparse.Namespace) -> int:
    ds = _open(args)
    if not args.apply:
        doomed = ds.cleanup(args.keep, dry_run=True)
        if doomed:
            print(f"would delete {len(doomed)} snapshots: {', '.join(map(str, doomed))}")
            print("(a dry run: add --apply to delete them)")
        else:
            print("nothing to delete")
        return OK
    deleted = ds.cleanup(args.keep)
    print(
        f"deleted {len(deleted)} snapshots"
        + (f": {', '.join(map(str, deleted))}" if deleted else "")
    )
    return OK


def cmd_export(args: argparse.Namespace) -> int:
    ds = _open(args)
    target = Path(args.to)
    meta = ds.get_metadata()
    # Written under a temporary name and renamed: a failed export leaves no half file.
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or ".")
    os.close(fd)
    try:
        meta.write_parquet(tmp)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    print(f"wrote {meta.height:,} rows of snapshot {ds.version} to {target}")
    return OK


def _problem(exc: DatasetRTError) -> pl.DataFrame:
    path = getattr(exc, "path", None)
    return pl.DataFrame(
        {"kind": [type(exc).__name__], "path": [path and os.fspath(path)], "message": [str(exc)]},
        schema={"kind": pl.String, "path": pl.String, "message": pl.String},
    )


def verify_report(path: str, snapshot_dir: str | None, progress: bool) -> pl.DataFrame:
    """:meth:`Dataset.verify` of the dataset at ``path``. When damage keeps
    it from opening (a cut shard), that problem, plus the report of each
    cache under ``path`` that still opens on its own."""
    try:
        return open_dataset(path, snapshot_dir=snapshot_dir).verify(progress=progress)
    except CorruptCacheError as exc:
        problems = [_problem(exc)]
        bad = getattr(exc, "path", None)
    below = sorted(Path(path).iterdir()) if Path(path).is_dir() else []
    caches = [p for p in below if _native.is_cache_dir(p)] or [Path(path)]
    for cache in caches:
        if bad is not None and Path(bad).is_relative_to(cache):
            continue  # reported above
        # Alone, a cache gets a throwaway snapshot directory: verify writes nothing here.
        with tempfile.TemporaryDirectory() as scratch:
            try:
                report = open_dataset(cache, snapshot_dir=scratch).verify(progress=progress)
            except DatasetRTError as exc:
                report = _problem(exc)
            problems.append(report.filter(~pl.col("path").fill_null("").str.starts_with(scratch)))
    return pl.concat(problems)


def cmd_verify(args: argparse.Namespace) -> int:
    report = verify_report(args.path, args.snapshot_dir, not args.no_progress)
    if args.json:
        print(_json({"ok": report.height == 0, "problems": report.to_dicts()}))
    elif report.height == 0:
        print("ok: every record and snapshot file is intact")
    else:
        print(f"{report.height} problems:")
        for kind, path, message in report.iter_rows():
            print(f"{kind}: {path}: {message}")
    return OK if report.height == 0 else CORRUPT


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="datasetrt",
        description="Look at and manage a DatasetRT dataset (caches + metadata snapshots).",
        epilog="exit codes: 0 ok, 1 error, 2 usage error, 3 verify found damage",
    )
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.add_argument("path", metavar="PATH", help="a root holding caches, or a cache directory")
        p.add_argument("--snapshot-dir", help="where the metadata snapshots live (if elsewhere)")
        return p

    p = command("info", "caches, rows, columns, the active snapshot and tags")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=cmd_info)

    p = command("sql", "run a read-only SQL query (tables: metadata, payloads)")
    p.add_argument("query", help='e.g. "SELECT label, count(*) FROM metadata GROUP BY label"')
    p.add_argument("--format", choices=("table", "csv", "json", "parquet"), default="table")
    p.add_argument("--output", "-o", help="write to this file instead of stdout")
    p.add_argument(
        "--worker",
        action="append",
        metavar="URL",
        help="run on this worker (repeat for each; see `datasetrt worker`)",
    )
    p.set_defaults(run=cmd_sql)

    p = command("history", "every snapshot: version, time, rows, fingerprint, note, tags")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=cmd_history)

    p = command("diff", "samples added, removed or reweighted from snapshot A to B")
    p.add_argument("a", metavar="A", help="snapshot number or tag")
    p.add_argument("b", metavar="B", help="snapshot number or tag")
    p.set_defaults(run=cmd_diff)

    p = command("checkout", "make snapshot N (or a tag) the population again, for every process")
    p.add_argument("snapshot", metavar="N|TAG")
    p.set_defaults(run=cmd_checkout)

    p = command("tag", "name a snapshot (default: the active one); tagged ones survive cleanup")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--snapshot", type=int, help="the snapshot to tag")
    p.set_defaults(run=cmd_tag)

    p = command("cleanup", "list (or, with --apply, delete) old untagged snapshots")
    p.add_argument("--keep", type=int, required=True, metavar="N", help="newest snapshots to keep")
    p.add_argument("--apply", action="store_true", help="delete (default: a dry run)")
    p.set_defaults(run=cmd_cleanup)

    p = command("export", "write the active population (metadata) to a Parquet file")
    p.add_argument("--to", required=True, metavar="FILE.parquet")
    p.set_defaults(run=cmd_export)

    p = command("verify", "read every record and snapshot file; report every problem")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=cmd_verify)

    help = "serve distributed SQL until stopped (Ctrl-C): `sql --worker URL` runs on it"
    p = sub.add_parser("worker", help=help, description=help)
    p.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)"
    )
    p.add_argument("--port", type=int, default=0, help="the port (default 0: any free one)")
    p.set_defaults(run=cmd_worker)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    top = parser()
    args = top.parse_args(argv)  # exits with 2 on a usage error
    if args.command == "sql" and args.format == "parquet" and args.output is None:
        top.error("sql --format parquet needs --output FILE")
    if args.command == "cleanup" and args.keep < 0:
        top.error("cleanup --keep must be 0 or more")
    try:
        return args.run(args)
    except (DatasetRTError, OSError) as exc:
        print(f"datasetrt {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return FAILED
    except KeyboardInterrupt:
        return 130
