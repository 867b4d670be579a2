"""The exceptions DatasetRT raises.

Every error is a :class:`DatasetRTError`; most also inherit the builtin a
Python user would catch for that situation::

    DatasetRTError
    ├── InvalidInputError      (also ValueError)    bad argument, row, column or value
    ├── CacheNotFoundError     (also FileNotFoundError)
    ├── CorruptCacheError                           stored bytes fail their checks
    ├── UnsupportedFormatError                      written by another format version
    ├── StorageError           (also OSError)       the operating system refused
    ├── ConflictError                               another writer moved the population
    ├── QueryError             (also ValueError)    SQL that cannot be planned or run
    ├── ArrowError             (also ValueError)    Arrow refused the data (types, lengths)
    └── InternalError          (also RuntimeError)  a bug in DatasetRT: please report it

A rejected operation changes nothing. The culprit is in attributes, so
nobody needs to parse messages: errors about a file carry it as ``path``
(an ``s3://`` URL for an object); a :class:`CorruptCacheError` about one
record also ``record``, ``shard`` and ``offset``; an
:class:`InvalidInputError` ``row``, ``column`` and ``value`` where one is at
fault; a :class:`ConflictError` ``base`` and ``head``.
"""

from __future__ import annotations

__all__ = [
    "ArrowError",
    "CacheNotFoundError",
    "ConflictError",
    "CorruptCacheError",
    "DatasetRTError",
    "InternalError",
    "InvalidInputError",
    "QueryError",
    "StorageError",
    "UnsupportedFormatError",
]


class DatasetRTError(Exception):
    """Base class of every DatasetRT error."""


class InvalidInputError(DatasetRTError, ValueError):
    """An argument, row, column or value was rejected; nothing was changed.

    ``row`` (int), ``column`` (str) and ``value`` (str) name the culprit where
    one is known, else are ``None``. ``path`` (str) names the file at fault
    when there is one (a source's missing or damaged file: a Parquet file, a
    tar shard, an MDS shard or ``index.json``, an Arrow file, a Lance data
    file), else is ``None``.
    """

    row: int | None = None
    column: str | None = None
    value: str | None = None
    path: str | None = None


class CacheNotFoundError(DatasetRTError, FileNotFoundError):
    """A cache, shard, index or snapshot file does not exist."""


class CorruptCacheError(DatasetRTError):
    """Stored bytes do not match their checksum, header or manifest.

    ``path`` names the file (or object URL). For one record, ``record`` is
    its sample id, ``shard`` its shard number and ``offset`` its byte offset
    (in the shard, or the object); otherwise they are ``None``.
    """

    path: str | None = None
    record: int | None = None
    shard: int | None = None
    offset: int | None = None


class UnsupportedFormatError(DatasetRTError):
    """A file was written by a format version this build cannot read."""


class StorageError(DatasetRTError, OSError):
    """The operating system refused a read or write."""


class ConflictError(DatasetRTError):
    """An update was derived from snapshot ``base``, but another writer made
    snapshot ``head`` the population meanwhile. Nothing was changed:
    ``refresh()``, redo the change on the new population and update again, or
    pass ``force=True`` to replace it anyway."""


class QueryError(DatasetRTError, ValueError):
    """A SQL statement could not be planned or executed."""


class ArrowError(DatasetRTError, ValueError):
    """Arrow refused the data: a type it cannot convert, columns of different
    lengths, a malformed stream."""


class InternalError(DatasetRTError, RuntimeError):
    """A bug in DatasetRT (a worker thread panicked, a task was lost): never
    the caller's fault. Please report it with the message."""
