"""The Hugging Face source: :class:`HuggingFace`, a ``datasets``
dataset read from its own Arrow files."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

import polars as pl

from .._state import check_text
from ..exceptions import InvalidInputError
from ._common import _invalid, _runs


class HuggingFace:
    """A Hugging Face ``datasets`` dataset as one source, read from its own
    Arrow files: a directory ``save_to_disk`` wrote (its ``state.json`` names
    them), or a ``datasets.Dataset`` backed by cache files (``load_dataset``'s,
    without an indices mapping: ``flatten_indices()`` a selection first).

    Column ``data`` is the payload: a binary column, or a struct with a
    ``bytes`` field (an ``Image`` or ``Audio`` feature stores its file that
    way). The other columns (or only ``columns``) become metadata; a
    ``ClassLabel`` is its integer. Read batch by batch as the files hold
    them (pyarrow, which ``datasets`` itself needs). A missing or damaged
    file is :class:`InvalidInputError` naming it, as its ``path`` too.
    """

    #: read on a thread of its own, ahead of the writer (see build)
    read_ahead = True

    def __init__(
        self,
        dataset: Any,
        *,
        name: str,
        data: str,
        columns: Sequence[str] | None = None,
    ):
        self.name = name
        self.data_column = check_text(data, "data")
        self.columns = None if columns is None else [check_text(c, "a column") for c in columns]
        self.dataset = None
        if isinstance(dataset, (str, os.PathLike)):
            self.files = _saved_files(check_text(os.fspath(dataset), "a dataset path"), name)
        else:
            files = [f["filename"] for f in getattr(dataset, "cache_files", None) or []]
            if not files:
                raise InvalidInputError(
                    f"source {name!r}: this dataset has no Arrow files on disk (it lives in "
                    f"memory): save_to_disk() it and pass the directory"
                )
            if getattr(dataset, "_indices", None) is not None:
                raise InvalidInputError(
                    f"source {name!r}: this dataset is a selection of its files' rows (an "
                    f"indices mapping): call flatten_indices() first"
                )
            # its table: the files' rows as this dataset shows them (a take(),
            # a renamed or removed column), mapped, not copied
            self.dataset, self.files = dataset, files

    def __repr__(self) -> str:
        return f"HuggingFace({self.name!r}, {len(self.files)} files)"

    def split(self, n: int) -> list[HuggingFace]:
        """This source as at most `n` sources over runs of its Arrow files,
        in order; a loaded dataset (its own view of the files) stays whole."""
        if self.dataset is not None:
            return [self]
        parts = []
        for _, files in _runs(self.files, n):
            part = copy.copy(self)
            part.files = files
            parts.append(part)
        return parts

    def tables(self) -> Iterator[pl.DataFrame]:
        """The files' record batches, in order, as frames."""
        import pyarrow as pa

        if self.dataset is not None:
            for batch in self.dataset.data.table.to_batches(max_chunksize=1000):
                yield self._frame(pl.DataFrame(batch), None)
            return
        for path in self.files:
            try:
                with pa.memory_map(path) as source:
                    for batch in pa.ipc.open_stream(source):
                        yield self._frame(pl.DataFrame(batch), path)
            except (pa.ArrowException, OSError) as exc:
                raise _invalid(
                    f"source {self.name!r}: cannot read Arrow file {path!r}: {exc}", path
                ) from None

    def _frame(self, frame: pl.DataFrame, path: str | None) -> pl.DataFrame:
        """A batch of `path` (``None``: of the loaded dataset) as the source's frame."""
        column = self.data_column
        if column not in frame.columns:
            raise _invalid(
                f"source {self.name!r}: {path or 'the dataset'!r} has no column {column!r} "
                f"({frame.columns})",
                path,
            )
        dtype = frame.schema[column]
        if isinstance(dtype, pl.Struct):
            if "bytes" not in [f.name for f in dtype.fields]:
                raise InvalidInputError(
                    f"source {self.name!r}: column {column!r} is a struct without a 'bytes' "
                    f"field ({dtype}); name a column of bytes"
                )
            fields = [f.name for f in dtype.fields]
            if "path" in fields:
                by_path = frame.filter(
                    pl.col(column).struct.field("bytes").is_null()
                    & pl.col(column).struct.field("path").is_not_null()
                )
                if by_path.height:
                    path_of = by_path[column].struct.field("path")[0]
                    raise InvalidInputError(
                        f"source {self.name!r}: column {column!r} names its files by path "
                        f"({path_of!r}) instead of holding their bytes: embed them first "
                        f"(datasets' embed_external_files, or a map that reads each file)"
                    )
            frame = frame.with_columns(pl.col(column).struct.field("bytes").alias(column))
        if self.columns is not None:
            frame = frame.select([column, *self.columns])
        return frame


def _saved_files(directory: str, source: str) -> list[str]:
    """The Arrow files of a ``save_to_disk`` directory, in order."""
    state = os.path.join(directory, "state.json")
    try:
        with open(state, encoding="utf-8") as f:
            names = [entry["filename"] for entry in json.load(f)["_data_files"]]
    except FileNotFoundError:
        hint = (
            " (a DatasetDict: pass one split's directory)"
            if os.path.isfile(os.path.join(directory, "dataset_dict.json"))
            else ""
        )
        raise _invalid(
            f"source {source!r}: {directory!r} is not a dataset save_to_disk wrote: it has "
            f"no state.json{hint}",
            state,
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _invalid(f"source {source!r}: unreadable {state!r}: {exc}", state) from None
    return [os.path.join(directory, n) for n in names]
