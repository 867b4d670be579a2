"""The Lance source: :class:`Lance`, a dataset (``pylance``) at one version."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterator, Sequence
from typing import Any

import polars as pl

from .._state import check_int, check_text
from ._common import PathLike, _invalid


class Lance:
    """A Lance dataset (``pylance``) as one source, at one version.

    Column ``data`` (bytes) is the payload, the other columns (or only
    ``columns``) the metadata, read in order ``batch_rows`` rows at a time.
    ``version`` pins the dataset version read (default: the latest when the
    source is made), so a source keeps naming the same rows while the Lance
    dataset moves on. A dataset that is not there, or a data file that is
    missing or damaged, is :class:`InvalidInputError` naming it, as its
    ``path`` too.
    """

    #: read on a thread of its own, ahead of the writer (see build)
    read_ahead = True

    def __init__(
        self,
        uri: PathLike,
        *,
        name: str,
        data: str,
        columns: Sequence[str] | None = None,
        version: int | None = None,
        batch_rows: int = 1024,
    ):
        import lance

        self.name = name
        self.uri = check_text(os.fspath(uri), "a Lance dataset path")
        self.data_column = check_text(data, "data")
        self.columns = None if columns is None else [check_text(c, "a column") for c in columns]
        self.batch_rows = check_int(batch_rows, "batch_rows", 1)
        try:
            self.version = lance.dataset(self.uri, version=version).version
        except (ValueError, OSError) as exc:
            raise _invalid(
                f"source {name!r}: no Lance dataset at {self.uri!r}: {exc}", self.uri
            ) from None

    def __repr__(self) -> str:
        return f"Lance({self.name!r}, {self.uri!r}, version {self.version})"

    def tables(self) -> Iterator[pl.DataFrame]:
        """The dataset's rows at ``version``, ``batch_rows`` at a time, in order."""
        import lance
        import pyarrow as pa

        try:
            dataset = lance.dataset(self.uri, version=self.version)
        except (ValueError, OSError) as exc:
            raise _invalid(
                f"source {self.name!r}: no Lance dataset at {self.uri!r} (version "
                f"{self.version}): {exc}",
                self.uri,
            ) from None
        wanted = None if self.columns is None else [self.data_column, *self.columns]
        # what Lance raises (pyarrow's ArrowInvalid for a missing data file),
        # named here with the data file at fault when one is found
        failures = (pa.ArrowException, OSError, ValueError, RuntimeError)
        batches = None
        while True:
            try:
                if batches is None:
                    batches = iter(
                        dataset.to_batches(
                            columns=wanted, batch_size=self.batch_rows, scan_in_order=True
                        )
                    )
                batch = next(batches, None)
            except failures as exc:
                try:
                    path = _lance_culprit(dataset, self.uri, wanted, str(exc), failures)
                except failures:  # the dataset cannot say which: the dataset is named
                    path = None
                raise _invalid(
                    f"source {self.name!r}: cannot read Lance "
                    + (f"data file {path!r}" if path else f"dataset {self.uri!r}")
                    + f" (version {self.version}): {type(exc).__name__}: {exc}",
                    path or self.uri,
                ) from None
            if batch is None:
                return
            yield pl.DataFrame(batch)


def _lance_file(uri: str, data_file: Any) -> tuple[str, bool]:
    """Where a Lance data file is, and whether that is a local path: under
    the dataset's ``data/`` (one in another base, ``base_id``, by its name
    as the manifest has it)."""
    if getattr(data_file, "base_id", None) is not None or "://" in data_file.path:
        return data_file.path, False
    if "://" in uri:
        return posixpath.join(uri, "data", data_file.path), False
    return os.path.join(uri, "data", data_file.path), True


def _lance_culprit(
    dataset: Any, uri: str, wanted: list[str] | None, message: str, failures: tuple
) -> str | None:
    """The data file a scan of `dataset` failed on (only after a failure):
    the one its error names, else one missing or of another size than the
    manifest says, else the first that fails when its columns are read
    alone; ``None`` if none does."""
    files = [
        (fragment, data_file, *_lance_file(uri, data_file))
        for fragment in dataset.get_fragments()
        for data_file in fragment.data_files()
    ]
    for _, data_file, path, _ in files:
        if data_file.path in message:
            return path
    for _, data_file, path, local in files:
        size = data_file.file_size_bytes
        if local and (not os.path.isfile(path) or (size and os.path.getsize(path) != size)):
            return path
    names = {field.id(): field.name() for field in dataset.lance_schema.fields()}
    for fragment, data_file, path, _ in files:
        columns = [names[i] for i in data_file.fields if i in names]
        columns = [c for c in columns if wanted is None or c in wanted]
        if not columns:
            continue  # none of its columns is read
        try:
            for _ in fragment.to_batches(columns=columns):
                pass
        except failures:
            return path
    return None
