"""DatasetRT: cache preprocessed ML samples once; choose, reweight and read them
with SQL or Polars without rewriting the payload bytes.

>>> import datasetrt as drt, tempfile, numpy as np
>>> class Squares:
...     name = "squares-v1"
...     def __iter__(self):
...         for i in range(10):
...             yield drt.CacheInput({"x": np.full(4, i * i)}, {"label": i % 2})
>>> ds = drt.build(tempfile.mkdtemp(), [Squares()], progress=False)
>>> ds.sql("SELECT label, count(*) AS n FROM metadata GROUP BY label ORDER BY label").rows()
[(0, 5), (1, 5)]
>>> import polars as pl
>>> ds.update_metadata(ds.get_metadata().filter(pl.col("label") == 1))
1
>>> {int(s.fields()["x"][0]) for s in ds.iter(seed=7)} <= {1, 9, 25, 49, 81}
True
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import _native, exceptions, sources
from ._build import CacheInput, build_sources, check_names, writer_spec
from ._native import __version__
from ._state import check_int, check_text
from .dataset import Dataset, PathLike, _storage_options
from .exceptions import (
    ArrowError,
    CacheNotFoundError,
    ConflictError,
    CorruptCacheError,
    DatasetRTError,
    InternalError,
    InvalidInputError,
    QueryError,
    StorageError,
    UnsupportedFormatError,
)
from .loader import Batch, Loader, Sample
from .mixing import MixtureController
from .records import Field
from .worker import Worker

__all__ = [
    "ArrowError",
    "Batch",
    "CacheInput",
    "CacheNotFoundError",
    "ConflictError",
    "CorruptCacheError",
    "Dataset",
    "DatasetRTError",
    "Field",
    "InternalError",
    "InvalidInputError",
    "Loader",
    "MixtureController",
    "QueryError",
    "Sample",
    "StorageError",
    "UnsupportedFormatError",
    "Worker",
    "__version__",
    "build",
    "build_ray",
    "exceptions",
    "load_ipython_extension",
    "open",
    "sources",
]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext datasetrt``: adds the ``%drt_sql`` / ``%%drt_sql`` magic (see
    :mod:`datasetrt.magic`)."""
    from .magic import load_ipython_extension as load

    load(ipython)


def build(
    root: PathLike,
    sources: Sequence[Any],
    *,
    codec: str | None = None,
    level: int | None = None,
    shard_bytes: int | None = None,
    threads: int | None = None,
    snapshot_dir: PathLike | None = None,
    progress: bool = True,
    storage_options: Mapping[str, str] | None = None,
    cache_dir: PathLike | None = None,
    cache_bytes: int | None = None,
    processes: int = 1,
) -> Dataset:
    """Cache each source under ``root/<source.name>`` and open them as one dataset.

    A source is any object with a string ``name`` that iterates over
    :class:`CacheInput` (or ``(bytes, dict)`` pairs). A source whose name is
    already published under ``root`` is reused without iterating it: **a
    changed preprocessing needs a new source name (e.g. ``digits-v2``) or a
    new root.** Payloads are compressed with ``codec`` ("zstd", the
    default, "lz4" or "none"; zstd at ``level``, default 3) into shards of
    about ``shard_bytes`` (default 256 MiB) on native threads while Python
    iterates; each cache is published atomically (a crash leaves the whole
    cache or nothing). These options become one ``_native.WriterSpec``,
    which holds the defaults and checks every value before any source is
    read.

    ``root`` may be a bucket URL (``s3://bucket/prefix``, see :func:`open`
    for ``storage_options``, ``cache_dir`` and ``cache_bytes``): each cache is
    then written into a local staging directory (``cache_dir``, apart from
    the replicas of what was read) and uploaded, its MANIFEST last, so
    readers never see a partial cache; a name already published in the
    bucket is reused. Only caches this call wrote, or complete ones an
    interrupted call left staged, are uploaded: every record is checked
    against its index first, and a replica is never taken for a source.

    ``processes`` > 1 writes the sources in that many processes at once
    (started with ``spawn``, so each source must pickle: define its class
    in a module, not in ``__main__`` of a notebook), each publishing its
    cache when it is done, the native threads (``threads``, by default the
    cores) shared between them; with fewer sources than processes, a source
    that can cut itself (``split``: the sources of :mod:`datasetrt.sources`
    over several files) is written in parts at once and joined into its one
    cache (shards moved, not copied). A source that fails raises its error here;
    the caches already published stay, so calling ``build`` again writes
    only the rest. A cache of half a partition's rows or more
    (``$DATASETRT_PARTITION_ROWS``, default 4,194,304) also gets the
    partitions of its first snapshot from the process that wrote it, beside
    the snapshots (``snapshot_dir``): the first ``open`` links them, so
    caches built in parallel are partitioned in parallel.
    """
    sources = list(sources)
    if not sources:
        raise InvalidInputError("build() needs at least one source")
    names = check_names(sources)
    processes = check_int(processes, "processes", 1, 1024)
    if threads is None and processes > 1:  # the cores, shared between the processes
        threads = max(1, (os.cpu_count() or 1) // processes)
    spec = writer_spec(codec, level, shard_bytes, threads)
    url = check_text(os.fspath(root), "the root URL") if _is_url(root) else None
    options = _storage_options(storage_options)
    if url is None:
        local, published = Path(root), set()
    else:  # written into a staging directory (never a replica), then uploaded
        staging_dir = None if cache_dir is None else os.fspath(cache_dir)
        local = Path(_native.staging_root(url, staging_dir))
        published = set(_native.remote_caches(url, options))
    build_sources(
        local,
        [(n, s) for n, s in zip(names, sources, strict=True) if n not in published],
        processes=processes,
        upload=None if url is None else (url, options, staging_dir),
        progress=progress,
        snapshot_dir=None if snapshot_dir is None else os.fspath(snapshot_dir),
        spec=spec,
    )
    if url is None:
        return Dataset([local / name for name in names], snapshot_dir=snapshot_dir)
    return Dataset(
        [url],
        snapshot_dir=snapshot_dir,
        storage_options=storage_options,
        cache_dir=cache_dir,
        cache_bytes=cache_bytes,
    )


def build_ray(
    root: PathLike,
    ray_dataset: Any,
    *,
    name: str,
    data_column: str = "data",
    metadata_columns: Sequence[str] = (),
    codec: str | None = None,
    level: int | None = None,
    shard_bytes: int | None = None,
    threads: int | None = 1,
    snapshot_dir: PathLike | None = None,
) -> Dataset:
    """Cache a ``ray.data.Dataset`` under ``root``, one cache per non-empty Ray
    block, written by parallel Ray tasks; returns them opened as one dataset.

    Each row of ``ray_dataset`` is a sample: ``data_column`` holds its
    payload bytes, ``metadata_columns`` (integers, floats, bool, str or bytes)
    become its metadata. The caches are named ``<name>-00000-of-000NN`` and
    published only when every part is written (each into a hidden staging
    directory first, then moved into ``root``), so ``drt.open(root)`` sees
    all of them or none. As with :func:`build`, the name decides reuse: **if
    the parts of ``name`` are already published under ``root`` they are
    opened without running the Ray dataset** (their cache ids stay the same);
    a changed preprocessing needs a new name or root. The writing is
    :func:`datasetrt.ray.write_parts`.
    """
    from .ray import write_parts

    caches = write_parts(
        root,
        ray_dataset,
        name=name,
        data_column=data_column,
        metadata_columns=metadata_columns,
        spec=writer_spec(codec, level, shard_bytes, threads),
    )
    return Dataset(caches, snapshot_dir=snapshot_dir)


def open(
    paths: PathLike | Sequence[PathLike],
    *,
    snapshot_dir: PathLike | None = None,
    storage_options: Mapping[str, str] | None = None,
    cache_dir: PathLike | None = None,
    cache_bytes: int | None = None,
    workers: Sequence[str] = (),
    memory_limit: int | str | None = None,
) -> Dataset:
    """Open a dataset: a root holding caches, one cache directory, or a list of either.

    The order of the paths does not matter: ``cache_id`` values are stored
    in the caches. The snapshot the dataset's head record names becomes the
    active population.

    A path may be a bucket URL, ``s3://bucket/prefix`` (S3 or an
    S3-compatible server), whose caches are read through a local replica in
    ``cache_dir`` (default ``$DATASETRT_CACHE_DIR`` or ``~/.cache/datasetrt``)
    holding at most ``cache_bytes`` of payload (default: no limit).
    ``storage_options`` are ``object_store``'s keys, as Polars and delta-rs
    spell them (``aws_endpoint``, ``aws_access_key_id``,
    ``aws_secret_access_key``, ``aws_region``, ``aws_allow_http``,
    ``timeout``...); ``AWS_*`` environment variables are read too. The
    metadata snapshots of a remote dataset live in the replica directory
    unless ``snapshot_dir`` says otherwise.

    ``workers`` (URLs of :class:`Worker` processes) runs the dataset's SQL
    over ``metadata`` on them (see :mod:`datasetrt.worker`).

    ``memory_limit`` (bytes, or a size such as ``"4G"``) bounds the memory
    a SQL query holds: sorts and grouped aggregates spill to temporary
    files past it, and a query that still needs more raises
    :class:`QueryError` instead of ending the process. Default:
    ``$DATASETRT_MEMORY_LIMIT``, else half the machine's memory (a quarter
    of the address-space limit when that is lower).
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    # a URL is text (a local path may hold bytes that are not UTF-8)
    paths = [check_text(os.fspath(p), "the URL") if _is_url(p) else p for p in paths]
    return Dataset(
        paths,
        snapshot_dir=snapshot_dir,
        storage_options=storage_options,
        cache_dir=cache_dir,
        cache_bytes=cache_bytes,
        workers=workers,
        memory_limit=memory_limit,
    )


def _is_url(path: PathLike) -> bool:
    scheme, sep, _ = os.fspath(path).partition("://")
    return bool(sep) and scheme.isalnum()
