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
    └── QueryError             (also ValueError)    SQL that cannot be planned or run

A rejected operation changes nothing. Errors about a file carry it as
``path``; a :class:`ConflictError` carries ``base`` and ``head``.
"""

from __future__ import annotations

__all__ = [
    "CacheNotFoundError",
    "ConflictError",
    "CorruptCacheError",
    "DatasetRTError",
    "InvalidInputError",
    "QueryError",
    "StorageError",
    "UnsupportedFormatError",
]


class DatasetRTError(Exception):
    """Base class of every DatasetRT error."""


class InvalidInputError(DatasetRTError, ValueError):
    """An argument, row, column or value was rejected; nothing was changed."""


class CacheNotFoundError(DatasetRTError, FileNotFoundError):
    """A cache, shard, index or snapshot file does not exist."""


class CorruptCacheError(DatasetRTError):
    """Stored bytes do not match their checksum, header or manifest.

    The message names the file, and for payloads the shard and offset.
    """


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
