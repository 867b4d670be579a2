"""Writing caches from Python sources (see :func:`datasetrt.build`)."""

from __future__ import annotations

import numbers
import os
import pickle
import queue
import shutil
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import polars as pl

from . import _native, records
from ._arrow import arrow_stream
from ._progress import Progress
from ._state import check_text
from .exceptions import InternalError, InvalidInputError

RESERVED = tuple(_native.RESERVED_COLUMNS)
CHUNK_RECORDS = 4096
CHUNK_BYTES = 16 << 20


class CacheInput(NamedTuple):
    """One sample of a source: its payload bytes and a flat metadata dict.

    A plain ``(bytes, dict)`` tuple is accepted wherever a ``CacheInput`` is;
    ``metadata=None`` means no metadata keys. ``data`` may instead be a dict
    of numpy arrays and numbers (``{"image": array, "label": 3}``): the
    record is then stored typed (:mod:`datasetrt.records`) and read back with
    ``batch.tensor(name)``, no pickle. Every record of such a source has the
    fields, dtypes and shapes of record 0, or of the source's ``fields``
    attribute (``{"audio": drt.Field("float32", (None, 80))}``) when it has
    one.

    >>> CacheInput(b"payload", {"label": 3}).metadata["label"]
    3
    """

    data: bytes | Mapping[str, Any]
    metadata: dict[str, Any] | None = None


_DTYPES = {
    "bool": pl.Boolean,
    "int": pl.Int64,
    "float": pl.Float64,
    "str": pl.String,
    "bytes": pl.Binary,
}


def _kind(t: type) -> str | None:
    if t is bool or t.__name__ == "bool_":
        return "bool"
    if issubclass(t, numbers.Integral):
        return "int"
    if issubclass(t, numbers.Real):
        return "float"
    if issubclass(t, str):
        return "str"
    if issubclass(t, bytes):
        return "bytes"
    return None


def _column(source: str, key: str, values: list[Any]) -> pl.Series:
    """One metadata column, checked: one kind of value per key (None allowed)."""
    kinds = {t: _kind(t) for t in set(map(type, values)) if t is not type(None)}
    unsupported = [t for t, k in kinds.items() if k is None]
    if unsupported:
        t = unsupported[0]
        i = next(i for i, v in enumerate(values) if type(v) is t)
        raise InvalidInputError(
            f"source {source!r}: record {i}: metadata key {key!r} has a value of type "
            f"{t.__name__}; supported types are bool, int, float, str and bytes"
        )
    distinct = set(kinds.values())
    if len(distinct) > 1:
        first = next(v for v in values if v is not None)
        k0 = _kind(type(first))
        i0 = values.index(first)
        i = next(i for i, v in enumerate(values) if v is not None and _kind(type(v)) != k0)
        raise InvalidInputError(
            f"source {source!r}: metadata key {key!r} is {type(first).__name__} in record {i0} "
            f"but {type(values[i]).__name__} in record {i}; a key must have one type in a source"
        )
    if not distinct:
        return pl.Series(key, values, dtype=pl.Null)
    kind = distinct.pop()
    if any(t not in (bool, int, float, str, bytes) for t in kinds):
        cast = {"bool": bool, "int": int, "float": float, "str": str, "bytes": bytes}[kind]
        values = [None if v is None else cast(v) for v in values]
    if kind == "int":  # stored as Int64: a larger value is the caller's, named here
        _check_int64(source, key, values)
    try:
        return pl.Series(key, values, dtype=_DTYPES[kind], strict=True)
    except UnicodeEncodeError:  # a str value polars cannot store: say which
        _check_texts(source, key, values)
        raise


def _check_int64(source: str, key: str, values: list[Any]) -> None:
    """Metadata key `key`'s ints fit the Int64 a column stores, or the
    error names the record."""
    low, high = -(1 << 63), (1 << 63) - 1
    for i, v in enumerate(values):
        if v is not None and not low <= v <= high:
            error = InvalidInputError(
                f"source {source!r}: record {i}: metadata key {key!r} has the value {v}, "
                f"outside the 64-bit integers metadata stores"
            )
            error.row, error.column, error.value = i, key, str(v)
            raise error


def _check_texts(source: str, key: str, values: list[Any]) -> None:
    """Raise the error naming the first str value of metadata key `key`
    that is not valid text (none is: the caller raises what it caught)."""
    for i, v in enumerate(values):
        if isinstance(v, str):
            try:
                check_text(v, f"source {source!r}: record {i}: metadata key {key!r}")
            except InvalidInputError as error:
                error.row, error.column, error.value = i, key, repr(v)
                raise


def source_name(source: object) -> str:
    name = getattr(source, "name", None)
    if not isinstance(name, str):
        raise InvalidInputError(
            f"a source needs a string attribute `name` (got {type(source).__name__} "
            f"with name={name!r}); the name decides cache reuse"
        )
    return check_text(name, "a source name")


def check_metadata_name(source: str, key: str, what: str) -> None:
    """A metadata key (``what``: "metadata key" or "metadata column") a
    population can hold: valid text, not reserved, a name SQL can use."""
    check_text(key, f"source {source!r}: {what} {key!r}")
    if key in RESERVED:
        raise InvalidInputError(
            f"source {source!r}: {what} {key!r} is reserved (cache_id, sample_id and weight "
            f"are set by DatasetRT)"
        )
    try:
        _native.check_column_name(key)
    except InvalidInputError as exc:
        raise InvalidInputError(f"source {source!r}: {what}: {exc}") from None


#: The metadata column types of a table source, as the population stores them.
_KINDS = {
    pl.Boolean: pl.Boolean,
    pl.String: pl.String,
    pl.Categorical: pl.String,
    pl.Enum: pl.String,
    pl.Binary: pl.Binary,
    pl.Null: pl.Null,
}


def metadata_frame(frame: pl.DataFrame, source: str) -> pl.DataFrame:
    """A table's metadata columns in the types every cache shares (Int64,
    Float64, Boolean, String, Binary), so that the populations of several
    sources (or Ray parts) stack; names checked as :func:`write_source` does."""
    casts = []
    for name, dtype in frame.schema.items():
        check_metadata_name(source, name, "metadata column")
        if dtype.is_integer():
            if dtype == pl.UInt64 and (frame[name].max() or 0) >= 1 << 63:
                raise InvalidInputError(
                    f"source {source!r}: metadata column {name!r} holds {frame[name].max()}, "
                    f"past the 64-bit signed integers a population stores"
                )
            casts.append(pl.col(name).cast(pl.Int64))
        elif dtype.is_float():
            casts.append(pl.col(name).cast(pl.Float64))
        elif type(dtype) in _KINDS or dtype in _KINDS:
            target = _KINDS.get(dtype, _KINDS.get(type(dtype)))
            casts.append(pl.col(name).cast(target))
        else:
            raise InvalidInputError(
                f"source {source!r}: metadata column {name!r} has type {dtype}; supported "
                f"types are integers, floats, bool, str and bytes"
            )
    return frame.with_columns(casts) if casts else frame


def write_table_source(
    root: Path, name: str, source: Any, *, spec: _native.WriterSpec, progress: bool
) -> dict[str, Any]:
    """Publish a *table source* as cache `root/name`: ``source.tables()``
    yields polars DataFrames (or any object with ``__arrow_c_stream__``)
    whose column ``source.data_column`` (default ``"data"``) holds each
    sample's bytes, handed to the engine as Arrow (no Python object per
    record); the other columns become the sample's metadata."""
    data_column = getattr(source, "data_column", "data")
    check_text(data_column, f"source {name!r}: data_column")
    total = len(source) if hasattr(source, "__len__") else None
    writer = _native.CacheWriter(os.fspath(root), name, spec)
    with _writing(writer, name, total, progress) as bar:
        metas: list[pl.DataFrame] = []
        rows = 0
        tables = source.tables()
        if getattr(source, "read_ahead", False) is True:
            tables = _read_ahead(tables, name)
        for i, table in enumerate(tables):
            frame = table if isinstance(table, pl.DataFrame) else pl.DataFrame(table)
            if frame.height == 0:
                continue  # an empty batch adds nothing (its columns may be all Null)
            if data_column not in frame.columns:
                raise InvalidInputError(
                    f"source {name!r}: table {i} has no data column {data_column!r} "
                    f"(it has {frame.columns})"
                )
            meta = metadata_frame(frame.drop(data_column), name)
            if metas and meta.schema != metas[0].schema:
                raise InvalidInputError(
                    f"source {name!r}: table {i} has metadata columns {dict(meta.schema)}, but "
                    f"table 0 has {dict(metas[0].schema)}; every table of a source needs the same"
                )
            rows += writer.add_arrow(frame.get_column(data_column))
            metas.append(meta)
            bar.update(frame.height)
        frame = pl.concat(metas, how="vertical", rechunk=False) if metas else pl.DataFrame()
        return _publish(writer, name, rows, frame if frame.width else pl.DataFrame())


def _read_ahead(tables: Iterable[Any], name: str) -> Iterator[Any]:
    """`tables`, read ahead on a thread of its own (up to two tables: one
    handed over, one waiting): the source reads (polars, a tar, a shard)
    while the engine writes the table before (it releases the GIL), so a
    build takes about the longer of the two, not their sum. Only for
    sources that say ``read_ahead = True`` (those of ``drt.sources``): the
    source's generator runs on that thread and goes on past a table before
    it is written, so it must not change a table it yielded. An error of
    the source is raised here, in order; stopping early stops the thread."""
    ready: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=1)
    stop = threading.Event()

    def read() -> None:
        try:
            for table in tables:
                if not _hand_over(ready, stop, ("table", table)):
                    return
            _hand_over(ready, stop, ("end", None))
        except BaseException as exc:  # handed to the reader, raised there
            _hand_over(ready, stop, ("error", exc))

    thread = threading.Thread(target=read, name=f"datasetrt-read-{name}", daemon=True)
    thread.start()
    try:
        while True:
            kind, item = ready.get()
            if kind == "end":
                return
            if kind == "error":
                raise item
            yield item
    finally:
        stop.set()
        thread.join()


def _hand_over(
    ready: queue.Queue[tuple[str, Any]], stop: threading.Event, item: tuple[str, Any]
) -> bool:
    """Put `item` in `ready` once there is room; ``False`` (not put) once
    `stop` is set, as it is when the reader is gone."""
    while not stop.is_set():
        try:
            ready.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


@contextmanager
def _writing(writer: _native.CacheWriter, name: str, total: int | None, progress: bool):
    """The progress bar of a cache being written; `writer` is aborted
    (nothing published) if the body raises."""
    bar = Progress(f"caching {name}", total, enabled=progress, unit=" samples")
    try:
        yield bar
    except BaseException:
        writer.abort()
        raise
    finally:
        bar.close()


class NoSamples(InvalidInputError):
    """A source (or a part of one) that yielded no samples."""


def _publish(writer: Any, name: str, records: int, metadata: pl.DataFrame) -> dict[str, Any]:
    """Publish `records` records with their metadata (a frame without columns: none)."""
    if records == 0:
        raise NoSamples(f"source {name!r} yielded no samples")
    attributes, nulls = arrow_stream(metadata, "build()")
    return writer.finish(attributes, nulls=nulls)


def writer_spec(
    codec: str | None, level: int | None, shard_bytes: int | None, threads: int | None
) -> _native.WriterSpec:
    """The engine's writer options of ``build``'s arguments (``None``: its
    default), checked before any source is read."""
    if codec is not None:
        check_text(codec, "codec")  # names the position of a character UTF-8 cannot hold
    return _native.WriterSpec(codec=codec, level=level, shard_bytes=shard_bytes, threads=threads)


def write_source(
    root: Path,
    name: str,
    source: Iterable[Any],
    *,
    spec: _native.WriterSpec,
    progress: bool,
) -> dict[str, Any]:
    """Iterate `source` once and publish it as cache `root/name`, written as `spec` says."""
    total = len(source) if hasattr(source, "__len__") else None  # type: ignore[arg-type]
    fields = getattr(source, "fields", None)
    if fields is not None:
        fields = records.check_fields(fields, f"source {name!r}")
    writer = _native.CacheWriter(os.fspath(root), name, spec)
    with _writing(writer, name, total, progress) as bar:
        n, columns = _write_records(writer, bar, name, source, fields)
        # With no metadata keys the frame has no columns; the engine takes that as "none".
        return _publish(
            writer, name, n, pl.DataFrame([_column(name, k, v) for k, v in columns.items()])
        )


def _write_records(
    writer: _native.CacheWriter,
    bar: Progress,
    name: str,
    source: Iterable[Any],
    fields: dict[str, records.Field] | None,
) -> tuple[int, dict[str, list[Any]]]:
    """Hand `source`'s records to `writer` in chunks, each checked (its
    payload encoded when `fields` or record 0 say the source is typed);
    returns how many there were and their metadata, column by column."""
    keys: list[str] | None = None
    keyset: Any = None
    columns: dict[str, list[Any]] = {}
    datas: list[bytes] = []
    metas: list[dict[str, Any]] = []
    pending = 0
    n = 0
    for item in source:
        try:
            data, meta = item
        except (TypeError, ValueError):
            raise InvalidInputError(
                f"source {name!r}: record {n} is a {type(item).__name__}; expected "
                f"CacheInput(data, metadata) or a (bytes, dict) pair"
            ) from None
        if n == 0 and fields is None and isinstance(data, Mapping):
            fields = records.infer_fields(data, f"source {name!r}: record 0")
        if fields is not None:
            data = records.encode(data, fields, f"source {name!r}: record {n}")
        elif type(data) is not bytes:
            data = _plain_bytes(data, name, n)
        if type(meta) is not dict:
            meta = _plain_dict(meta, name, n)
        if meta.keys() != keyset:  # record 0 (no keyset yet), or keys unlike its
            keys, keyset, columns = _metadata_keys(meta, name, n, keys)
        datas.append(data)
        metas.append(meta)
        pending += len(data)
        n += 1
        if len(datas) >= CHUNK_RECORDS or pending >= CHUNK_BYTES:
            _flush(writer, bar, datas, metas, columns)
            pending = 0
    if datas:
        _flush(writer, bar, datas, metas, columns)
    return n, columns


def _flush(
    writer: _native.CacheWriter,
    bar: Progress,
    datas: list[bytes],
    metas: list[dict[str, Any]],
    columns: dict[str, list[Any]],
) -> None:
    """Hand the payloads gathered to `writer` and their metadata to
    `columns`, then empty both lists for the next chunk."""
    for k in columns:
        columns[k].extend([m[k] for m in metas])
    writer.add(datas)
    bar.update(len(datas))
    datas.clear()
    metas.clear()


def _plain_bytes(data: Any, name: str, n: int) -> bytes:
    """Record `n`'s payload, not typed and not ``bytes``, as bytes."""
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise InvalidInputError(
        f"source {name!r}: record {n}: data is {type(data).__name__}; expected "
        f"bytes, bytearray or memoryview, or (as record 0 of a typed source) "
        f"a dict of arrays"
    )


def _plain_dict(meta: Any, name: str, n: int) -> dict[str, Any]:
    """Record `n`'s metadata, not of type ``dict``: ``None`` is no keys, a
    subclass of dict is itself, anything else is refused."""
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise InvalidInputError(
            f"source {name!r}: record {n}: metadata is {type(meta).__name__}, expected a dict"
        )
    return meta


def _metadata_keys(
    meta: dict[str, Any], name: str, n: int, keys: list[str] | None
) -> tuple[list[str], Any, dict[str, list[Any]]]:
    """Record 0's metadata keys (`keys` is ``None``), each checked, with
    their set and an empty column each; the keys of record `n` > 0 are
    unlike `keys`, record 0's: an error."""
    if keys is not None:
        raise InvalidInputError(
            f"source {name!r}: record {n} has metadata keys {sorted(meta)}, but record 0 "
            f"has {sorted(keys)}; every record of a source needs the same keys"
        )
    keys = list(meta)
    for k in keys:
        if not isinstance(k, str):
            raise InvalidInputError(f"source {name!r}: metadata key {k!r} is not a string")
        check_metadata_name(name, k, "metadata key")
    return keys, meta.keys(), {k: [] for k in keys}


def check_names(sources: Sequence[Any]) -> list[str]:
    names = [source_name(s) for s in sources]
    seen: set[str] = set()
    for name in names:
        _native.check_source_name(name)
        if name in seen:
            raise InvalidInputError(
                f"two sources are named {name!r}; each source needs its own name"
            )
        seen.add(name)
    return names


def build_sources(
    local: Path,
    sources: Sequence[tuple[str, Any]],
    *,
    processes: int,
    upload: tuple[str, list[tuple[str, str]] | None, str | None] | None,
    progress: bool,
    snapshot_dir: str | None = None,
    spec: _native.WriterSpec,
) -> None:
    """Cache each ``(name, source)`` under ``local`` (and upload it, when
    ``upload`` is ``(url, storage options, staging dir)``) unless it is
    there already; ``processes`` > 1 writes them in that many spawned
    processes, each cache published as it finishes. With fewer sources
    than processes, a source that can cut itself into parts (``split(n)``:
    the sources of :mod:`datasetrt.sources` over several files) is written
    as that many parts at once, and joined into its one cache here once all
    its parts are written (:func:`split_sources`). A local cache large
    enough to be partitions of its own gets them where ``snapshot_dir``
    (default ``<local>/_snapshots``) keeps snapshots, built by the process
    that wrote it (here, for a source written in parts): the first ``open``
    links them. ``spec`` says how caches are written."""
    if processes == 1:
        for name, source in sources:
            build_source(
                local, name, source, upload, progress=progress, snapshot_dir=snapshot_dir, spec=spec
            )
        return
    check_picklable(sources)
    plan = split_sources(local, sources, processes)
    run_plan(
        local, plan, processes, upload, progress=progress, snapshot_dir=snapshot_dir, spec=spec
    )


def check_picklable(sources: Sequence[tuple[str, Any]]) -> None:
    """Each source can be sent to a build process, or an error names it."""
    for name, source in sources:
        try:
            pickle.dumps(source)
        except Exception as e:
            raise InvalidInputError(
                f"source {name!r} cannot be sent to a build process ({type(e).__name__}: {e}); "
                f"define its class in a module, or build with processes=1"
            ) from None


def run_plan(
    local: Path,
    plan: list[tuple[str, Any, list[Any]]],
    processes: int,
    upload: tuple[str, list[tuple[str, str]] | None, str | None] | None,
    *,
    progress: bool,
    snapshot_dir: str | None,
    spec: _native.WriterSpec,
) -> None:
    """Write the sources of `plan` (:func:`split_sources`) in `processes`
    spawned processes, a source in parts joined once its parts are all
    written (:func:`finish_parts`); see :func:`build_sources`."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    tasks = sum(max(1, len(parts)) for _, _, parts in plan)
    bar = Progress(
        f"caching {len(plan)} sources in {processes} processes",
        len(plan),
        enabled=progress,
        unit=" caches",
    )
    pool = ProcessPoolExecutor(
        max_workers=min(processes, tasks),
        mp_context=multiprocessing.get_context("spawn"),
    )
    # made only for a source written in parts; a temporary name of the
    # engine's: a build that dies leaves it to the next writer or open of
    # this root, which removes it
    parts_root = None
    if any(parts for _, _, parts in plan):
        parts_root = Path(_native.temp_dir(os.fspath(local), "parts"))
    try:
        jobs, waiting = submit_plan(
            pool, local, plan, parts_root, upload, snapshot_dir=snapshot_dir, spec=spec
        )
        for job in as_completed(jobs):
            job.result()  # a source's error is raised here, as in this process
            name = jobs[job]
            if name in waiting:
                waiting[name] -= 1
                if waiting[name]:
                    continue
                assert parts_root is not None  # made above for every source in parts
                finish_parts(local, name, parts_root / name, upload, snapshot_dir)
            bar.update(1)
    except BrokenProcessPool as e:
        raise InternalError(
            f"a build process ended without finishing ({e}); the caches already "
            f"published stay, and build() again writes the rest"
        ) from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if parts_root is not None:
            shutil.rmtree(parts_root, ignore_errors=True)
        bar.close()


def submit_plan(
    pool: Any,
    local: Path,
    plan: list[tuple[str, Any, list[Any]]],
    parts_root: Path | None,
    upload: tuple[str, list[tuple[str, str]] | None, str | None] | None,
    *,
    snapshot_dir: str | None,
    spec: _native.WriterSpec,
) -> tuple[dict[Any, str], dict[str, int]]:
    """Submit every job of `plan` to `pool`: a source written whole, or
    each of its parts (under ``parts_root/<name>``). Returns each job's
    source name, and how many parts each source in parts has."""
    jobs, waiting = {}, {}
    for name, source, parts in plan:
        if not parts:
            job = pool.submit(
                build_source,
                local,
                name,
                source,
                upload,
                progress=False,
                snapshot_dir=snapshot_dir,
                spec=spec,
            )
            jobs[job] = name
            continue
        waiting[name] = len(parts)
        assert parts_root is not None  # made for every source in parts
        for k, part in enumerate(parts):
            job = pool.submit(write_part, parts_root / name, f"{name}.part-{k:05d}", part, spec)
            jobs[job] = name
    return jobs, waiting


def finish_parts(
    local: Path,
    name: str,
    written: Path,
    upload: tuple[str, list[tuple[str, str]] | None, str | None] | None,
    snapshot_dir: str | None,
) -> None:
    """Join the parts of source `name` written under `written` into its
    one cache under `local`, then upload it or give it its partitions."""
    done = sorted(written.iterdir()) if written.exists() else []
    if not done:  # every part was empty
        raise InvalidInputError(f"source {name!r} yielded no samples")
    _native.merge_parts(os.fspath(local), name, [os.fspath(p) for p in done])
    finish_source(local, name, upload, snapshot_dir)


def split_sources(
    local: Path, sources: Sequence[tuple[str, Any]], processes: int
) -> list[tuple[str, Any, list[Any]]]:
    """Each ``(name, source)`` with the parts it is written in by
    ``processes`` processes: none (written whole) unless there are fewer
    sources than processes and the source, not cached yet, cuts itself
    (``split(n)``) into two or more."""
    spare = processes // max(1, len(sources))
    plan = []
    for name, source in sources:
        parts: list[Any] = []
        split = getattr(source, "split", None)
        tables = callable(getattr(source, "tables", None))  # a table source's parts
        if spare > 1 and tables and callable(split) and not _native.is_cache_dir(local / name):
            parts = list(split(spare))
            if len(parts) < 2:
                parts = []
        plan.append((name, source, parts))
    return plan


def write_part(root: Path, name: str, source: Any, spec: _native.WriterSpec) -> str | None:
    """Write one part of a split source as cache `root/name` (in a build
    process), to be joined with the others by ``_native.merge_parts``;
    ``None`` (nothing written) for a part without samples (an empty file)."""
    try:
        write_table_source(root, name, source, progress=False, spec=spec)
    except NoSamples:
        return None
    return name


def build_source(
    local: Path,
    name: str,
    source: Any,
    upload: tuple[str, list[tuple[str, str]] | None, str | None] | None,
    *,
    progress: bool,
    snapshot_dir: str | None = None,
    spec: _native.WriterSpec,
) -> str:
    """Cache one source under ``local`` unless it is published there; upload
    it when ``upload`` says where, else give it its partitions (see
    :func:`build_sources`)."""
    written = False
    if not _native.is_cache_dir(local / name):
        write = write_table_source if callable(getattr(source, "tables", None)) else write_source
        write(local, name, source, progress=progress, spec=spec)
        written = True
    finish_source(local, name, upload, snapshot_dir, written=written)
    return name


def finish_source(
    local: Path,
    name: str,
    upload: tuple[str, list[tuple[str, str]] | None, str | None] | None,
    snapshot_dir: str | None,
    *,
    written: bool = True,
) -> None:
    """What follows a cache written under ``local``: its upload when
    ``upload`` says where (every record checked first; a cache found there
    already is uploaded too), else its partitions (see :func:`build_sources`)."""
    if upload is None:
        if written:
            _native.prepare_partitions(local / name, snapshot_dir)
        return
    url, storage_options, staging_dir = upload
    _native.publish_staged(url, name, storage_options, staging_dir)
