"""Sources for :func:`datasetrt.build` over data where it already lives.

A *table source* is an object with a ``name`` and a ``tables()`` method that
yields polars DataFrames (or any object with ``__arrow_c_stream__``): the
column ``data_column`` (default ``"data"``) holds each sample's bytes, which
go to the engine's writer as Arrow, with no Python object per record; the
other columns become the sample's metadata (integers, floats, bool, str,
bytes). ``build`` takes one like any source: its name decides reuse, so the
same files under the same name give the same cache, built once.

>>> src = drt.sources.Parquet("shards/*.parquet", name="img-v1")  # doctest: +SKIP
>>> ds = drt.build("cache", [src])                               # doctest: +SKIP
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Sequence
from typing import Any

import polars as pl

from ._state import check_int, check_text
from .exceptions import InvalidInputError

PathLike = str | os.PathLike[str]


class Parquet:
    """Parquet files as one source: column ``data_column`` (binary) is each
    sample's payload, the other columns (or only ``columns``) its metadata.

    ``paths`` is a path, a glob or a list of them, read in that order (a
    glob's matches sorted) in batches of ``batch_rows`` rows, so memory stays
    bounded whatever the files hold. A missing file, a glob that matches
    nothing or a file polars cannot read is :class:`InvalidInputError`
    naming it.
    """

    def __init__(
        self,
        paths: PathLike | Sequence[PathLike],
        *,
        name: str,
        data_column: str = "data",
        columns: Sequence[str] | None = None,
        batch_rows: int = 65_536,
    ):
        self.name = name
        given = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
        if not given:
            raise InvalidInputError(f"source {name!r}: no Parquet paths given")
        self.paths = [_expand(check_text(os.fspath(p), "a Parquet path"), name) for p in given]
        self.paths = [p for group in self.paths for p in group]
        self.data_column = check_text(data_column, "data_column")
        self.columns = None if columns is None else [check_text(c, "a column") for c in columns]
        self.batch_rows = check_int(batch_rows, "batch_rows", 1)

    def __repr__(self) -> str:
        return f"Parquet({self.name!r}, {len(self.paths)} files)"

    def _scan(self) -> pl.LazyFrame:
        frame = pl.scan_parquet(self.paths)
        if self.columns is not None:
            frame = frame.select([self.data_column, *self.columns])
        return frame

    def __len__(self) -> int:
        """Rows of all the files (from their footers)."""
        return int(self._read(lambda: self._scan().select(pl.len()).collect().item()))

    def tables(self) -> Iterator[pl.DataFrame]:
        """The files' rows, ``batch_rows`` at a time, in order."""
        scan = self._scan()
        if hasattr(scan, "collect_batches"):  # polars >= 1.32: streamed
            batches = self._read(lambda: iter(scan.collect_batches(chunk_size=self.batch_rows)))
        else:
            batches = self._read(lambda: scan.collect().iter_slices(self.batch_rows))
        while True:
            batch = self._read(lambda: next(batches, None))
            if batch is None:
                return
            yield batch

    def _read(self, step: Any) -> Any:
        try:
            return step()
        except (pl.exceptions.PolarsError, OSError) as exc:
            raise InvalidInputError(
                f"source {self.name!r}: cannot read the Parquet files "
                f"({_shown(self.paths)}): {type(exc).__name__}: {exc}"
            ) from None


def _expand(path: str, source: str) -> list[str]:
    """The files a path names: itself, or a glob's matches in sorted order."""
    if glob.has_magic(path):
        found = sorted(glob.glob(path))
        if not found:
            raise InvalidInputError(f"source {source!r}: no file matches {path!r}")
        return found
    if not os.path.isfile(path):
        raise InvalidInputError(f"source {source!r}: no Parquet file at {path!r}")
    return [path]


def _shown(paths: list[str]) -> str:
    return ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
