"""The Parquet source: :class:`Parquet`."""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Sequence
from typing import Any

import polars as pl

from .._state import check_int, check_text
from ..exceptions import InvalidInputError
from ._common import BATCH_BYTES, PathLike, _expand, _invalid, _runs


class Parquet:
    """Parquet files as one source: column ``data_column`` (binary) is each
    sample's payload, the other columns (or only ``columns``) its metadata.

    ``paths`` is a path, a glob or a list of them, read in that order (a
    glob's matches sorted), streamed in batches of ``batch_rows`` rows; by
    default as many as hold about :data:`BATCH_BYTES` (64 MiB), from the
    files' size per row, so memory stays bounded whatever a row holds. A
    missing file, a glob that matches nothing or a file polars cannot read
    is :class:`InvalidInputError` naming it (as its ``path`` too): of a
    source of several files, the one that failed.
    """

    #: read on a thread of its own, ahead of the writer (see build)
    read_ahead = True

    def __init__(
        self,
        paths: PathLike | Sequence[PathLike],
        *,
        name: str,
        data_column: str = "data",
        columns: Sequence[str] | None = None,
        batch_rows: int | None = None,
    ):
        self.name = name
        given = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
        if not given:
            raise InvalidInputError(f"source {name!r}: no Parquet paths given")
        self.paths = [_expand(check_text(os.fspath(p), "a Parquet path"), name) for p in given]
        self.paths = [p for group in self.paths for p in group]
        self.data_column = check_text(data_column, "data_column")
        self.columns = None if columns is None else [check_text(c, "a column") for c in columns]
        self.batch_rows = None if batch_rows is None else check_int(batch_rows, "batch_rows", 1)
        self._rows: int | None = None

    def __repr__(self) -> str:
        return f"Parquet({self.name!r}, {len(self.paths)} files)"

    def split(self, n: int) -> list[Parquet]:
        """This source as at most `n` sources over runs of its files, in
        order (what ``build(processes=)`` writes in parallel and joins)."""
        parts = []
        for _, paths in _runs(self.paths, n):
            part = copy.copy(self)
            part.paths, part._rows = paths, None
            parts.append(part)
        return parts

    def _scan(self) -> pl.LazyFrame:
        # the paths are files already (a glob expanded, in order): no second glob
        frame = pl.scan_parquet(self.paths, glob=False)
        if self.columns is not None:
            frame = frame.select(self._wanted())
        return frame

    def __len__(self) -> int:
        """Rows of all the files (from their footers, read once)."""
        if self._rows is None:
            self._rows = int(self._read(lambda: self._scan().select(pl.len()).collect().item()))
        return self._rows

    def tables(self) -> Iterator[pl.DataFrame]:
        """The files' rows, ``batch_rows`` at a time, in order."""
        scan = self._scan()
        rows = self.batch_rows
        if rows is None:  # about BATCH_BYTES of rows, by the files' bytes per row
            count = len(self)
            size = self._read(lambda: sum(os.path.getsize(p) for p in self.paths))
            rows = max(1, min(count, BATCH_BYTES * max(count, 1) // max(size, 1)))
        if hasattr(scan, "collect_batches"):  # polars >= 1.32: streamed
            batches = self._read(lambda: iter(scan.collect_batches(chunk_size=rows)))
        else:  # an older polars: a file at a time
            batches = (
                part
                for path in self.paths
                for part in pl.read_parquet(path, columns=self._wanted()).iter_slices(rows)
            )
        done = 0  # rows read: a failure lies past them
        while True:
            batch = self._read(lambda: next(batches, None), done)
            if batch is None:
                return
            done += batch.height
            yield batch

    def _wanted(self) -> list[str] | None:
        return None if self.columns is None else [self.data_column, *self.columns]

    def _read(self, step: Any, done: int = 0) -> Any:
        """``step()``; a failure to read is :class:`InvalidInputError`
        naming the file that failed (``done`` rows were read before it)."""
        try:
            return step()
        except (pl.exceptions.PolarsError, OSError) as exc:
            error: Exception = exc
        culprit = self._culprit(done)
        if culprit is None:  # the failure did not repeat file by file
            raise InvalidInputError(
                f"source {self.name!r}: cannot read the Parquet files "
                f"({_shown(self.paths)}): {type(error).__name__}: {error}"
            ) from None
        path, error = culprit
        raise _invalid(
            f"source {self.name!r}: cannot read Parquet file {path!r}: "
            f"{type(error).__name__}: {error}",
            path,
        ) from None

    def _culprit(self, done: int) -> tuple[str, Exception] | None:
        """The file a read of all of them failed on, ``done`` rows in, and
        its error read alone: the first whose footer fails, else the first
        to fail when read alone from the file that holds row ``done`` on
        (only after a failure: the files stay one scan in the common path)."""
        counts = []
        for path in self.paths:
            try:
                counts.append(pl.scan_parquet(path, glob=False).select(pl.len()).collect().item())
            except (pl.exceptions.PolarsError, OSError) as exc:
                return path, exc
        start = 0
        for path, count in zip(self.paths, counts, strict=True):
            start += count
            if start <= done:
                continue  # read whole before the failure
            try:
                scan = pl.scan_parquet(path, glob=False)
                if self.columns is not None:
                    scan = scan.select(self._wanted())
                if hasattr(scan, "collect_batches"):  # streamed, as tables() reads
                    for _ in scan.collect_batches():
                        pass
                else:
                    scan.collect()
            except (pl.exceptions.PolarsError, OSError) as exc:
                return path, exc
        return None


def _shown(paths: list[str]) -> str:
    return ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
