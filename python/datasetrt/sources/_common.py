"""What the table sources share: the path type, the batch size, a path
or glob expanded to files, the error that names a file, and a list cut
into runs (``split``)."""

from __future__ import annotations

import glob
import os

from ..exceptions import InvalidInputError

PathLike = str | os.PathLike[str]

#: About how many bytes of rows a source hands over at once (a default
#: batch's rows are sized to it, so memory stays bounded by bytes, not rows).
BATCH_BYTES = 64 << 20


def _expand(path: str, source: str, kind: str = "Parquet file") -> list[str]:
    """The files a path names: itself (a file named ``x[1].parquet`` too), or
    a glob's matches in sorted order."""
    if glob.has_magic(path) and not os.path.isfile(path):
        found = sorted(glob.glob(path))
        if not found:
            raise _invalid(f"source {source!r}: no file matches {path!r}", path)
        return found
    if not os.path.isfile(path):
        raise _invalid(f"source {source!r}: no {kind} at {path!r}", path)
    return [path]


def _invalid(message: str, path: str | None) -> InvalidInputError:
    """An :class:`InvalidInputError` about file ``path`` (its ``path``)."""
    error = InvalidInputError(message)
    error.path = path
    return error


def _runs(items: list, n: int) -> list[tuple[int, list]]:
    """`items` cut into at most `n` runs of nearly equal length, in order,
    each with the index of its first item."""
    k = max(1, min(n, len(items)))
    cuts = [len(items) * i // k for i in range(k + 1)]
    return [(cuts[i], items[cuts[i] : cuts[i + 1]]) for i in range(k)]
