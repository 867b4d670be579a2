"""Sources for :func:`datasetrt.build` over data where it already lives.

A *table source* is an object with a ``name`` and a ``tables()`` method that
yields polars DataFrames (or any object with ``__arrow_c_stream__``): the
column ``data_column`` (default ``"data"``) holds each sample's bytes, which
go to the engine's writer as Arrow, with no Python object per record; the
other columns become the sample's metadata (integers, floats, bool, str,
bytes). ``build`` takes one like any source: its name decides reuse,
so the same files under the same name give the same cache, built once.
A source whose ``read_ahead`` is ``True`` (every one here) is read on a
thread of its own, ahead of the writer: its generator must not change a
table it has yielded, nor depend on the thread it runs on.

Here: :class:`Parquet` (files), :class:`WebDataset` (tar shards),
:class:`MDS` (MosaicML Streaming shards), :class:`HuggingFace` (a
``datasets`` dataset's Arrow files), :class:`Lance` (a dataset at one
version).

>>> src = drt.sources.Parquet("shards/*.parquet", name="img-v1")  # doctest: +SKIP
>>> ds = drt.build("cache", [src])                               # doctest: +SKIP
"""

from __future__ import annotations

import copy
import glob
import importlib
import json
import os
import posixpath
import tarfile
import zlib
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

import numpy as np
import polars as pl

from . import _native
from ._state import check_int, check_text
from .exceptions import InvalidInputError

PathLike = str | os.PathLike[str]

#: About how many bytes of rows a source hands over at once (a default
#: batch's rows are sized to it, so memory stays bounded by bytes, not rows).
BATCH_BYTES = 64 << 20


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


def _shown(paths: list[str]) -> str:
    return ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


#: How a WebDataset metadata member's text becomes a column value.
_DECODE = {int: pl.Int64, float: pl.Float64, str: pl.String, bytes: pl.Binary}


class WebDataset:
    """WebDataset tar shards as one source: the files of one sample (members
    ``<key>.<ext>``, consecutive in a tar) become one record.

    The member of extension ``data`` (``"jpg"``, ``"npy"``...) is the
    payload, as stored; ``metadata`` maps other extensions to the type their
    text becomes (``{"cls": int, "txt": str}``; ``bytes`` keeps a member's
    bytes), one column each (a dot in an extension becomes ``_``), null
    where a sample lacks that member. Columns ``key`` (the sample's key) and
    ``shard`` (the tar's index in ``paths``) say where a record came from.
    Shards are read as streams, in order, ``batch_rows`` samples at a time.
    A missing or damaged shard, a sample without its ``data`` member, or a
    member whose text is not of its type, is :class:`InvalidInputError`
    naming the shard (as its ``path`` too) and the key.
    """

    #: read on a thread of its own, ahead of the writer (see build)
    read_ahead = True

    def __init__(
        self,
        paths: PathLike | Sequence[PathLike],
        *,
        name: str,
        data: str,
        metadata: dict[str, type] | None = None,
        batch_rows: int = 4096,
    ):
        self.name = name
        given = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
        if not given:
            raise InvalidInputError(f"source {name!r}: no tar shards given")
        found = [
            _expand(check_text(os.fspath(p), "a shard path"), name, "tar shard") for p in given
        ]
        self.paths = [p for group in found for p in group]
        self.data = check_text(data, "data").lower()
        self.metadata = {
            check_text(e, "a metadata extension").lower(): k for e, k in (metadata or {}).items()
        }
        seen = {"data", "key", "shard"}
        for ext, kind in self.metadata.items():
            if kind not in _DECODE:
                raise InvalidInputError(
                    f"source {name!r}: metadata {ext!r} has type {kind!r}; use int, float, "
                    f"str or bytes"
                )
            column = ext.replace(".", "_")
            if column in seen or ext == self.data:
                raise InvalidInputError(
                    f"source {name!r}: metadata {ext!r} would be column {column!r}, which "
                    f"another column already is (data, key, shard, or another extension)"
                )
            seen.add(column)
        self.batch_rows = check_int(batch_rows, "batch_rows", 1)
        self._first_shard = 0  # of a part (split): its first shard's index

    def __repr__(self) -> str:
        return f"WebDataset({self.name!r}, {len(self.paths)} shards)"

    def split(self, n: int) -> list[WebDataset]:
        """This source as at most `n` sources over runs of its shards, in
        order, column ``shard`` still the shard's index in the whole list."""
        parts = []
        for first, paths in _runs(self.paths, n):
            part = copy.copy(self)
            part.paths, part._first_shard = paths, self._first_shard + first
            parts.append(part)
        return parts

    def tables(self) -> Iterator[pl.DataFrame]:
        """The shards' samples, ``batch_rows`` at a time, in order."""
        for shard, path in enumerate(self.paths):
            for table in self._batches(path):
                yield self._frame(shard, table)

    def _batches(self, path: str) -> Iterator[pl.DataFrame]:
        """One shard's samples a batch at a time: columns ``/key``,
        ``/members`` (the sample's extensions) and one binary column per
        wanted extension (null where a sample lacks it). An uncompressed
        shard is read natively (members no column wants are skipped, not
        copied); a compressed one through :mod:`tarfile`."""
        wanted = [self.data, *self.metadata]
        if _compressed(path):
            yield from self._stream_batches(path, wanted)
            return
        try:
            for batch in _native.TarSamples(path, wanted, self.batch_rows, _TAR_BATCH_BYTES):
                yield pl.DataFrame(batch)
        except (InvalidInputError, OSError) as exc:
            # the engine's error names the shard in its message: here as `path` too
            raise _invalid(f"source {self.name!r}: {_reason(exc, path)}", path) from None

    def _stream_batches(self, path: str, wanted: list[str]) -> Iterator[pl.DataFrame]:
        rows: list[tuple[str, dict[str, bytes]]] = []
        size = 0
        for key, members in self._samples(path):
            rows.append((key, members))
            size += sum(len(members.get(ext, b"")) for ext in wanted)
            if len(rows) >= self.batch_rows or size >= BATCH_BYTES:
                yield _members_table(rows, wanted)
                rows, size = [], 0
        if rows:
            yield _members_table(rows, wanted)

    def _samples(self, path: str) -> Iterator[tuple[str, dict[str, bytes]]]:
        """(key, {extension: bytes}) of each sample of one compressed shard,
        in order, read as the native reader reads an uncompressed one."""
        key, members = None, {}
        try:
            with tarfile.open(path, "r|*") as tar:
                for member in tar:
                    if not member.isfile():
                        continue
                    if not member.name.isascii():
                        _check_utf8(member.name, self.name, path)
                    folder, base = posixpath.split(member.name)
                    stem, dot, ext = base.partition(".")
                    if not dot or base.startswith("."):
                        continue  # not a sample's file (WebDataset skips them too)
                    name = posixpath.join(folder, stem)
                    if name != key and key is not None:
                        yield key, members
                        members = {}
                    key = name
                    reader = tar.extractfile(member)
                    # extensions compare lowercased, as webdataset reads them
                    members[ext.lower()] = reader.read() if reader is not None else b""
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise _invalid(
                f"source {self.name!r}: cannot read tar shard {path!r}: {exc}", path
            ) from None
        if key is not None:
            yield key, members

    def _frame(self, shard: int, table: pl.DataFrame) -> pl.DataFrame:
        data = table[self.data]
        if data.null_count():
            row = int(data.is_null().arg_max())
            members = table[_MEMBERS][row].split(", ") if table[_MEMBERS][row] else []
            raise _invalid(
                f"source {self.name!r}: sample {table[_KEY][row]!r} of shard "
                f"{self.paths[shard]!r} has no {self.data!r} member (it has {members})",
                self.paths[shard],
            )
        columns = [
            data.cast(pl.Binary).alias("data"),
            table[_KEY].alias("key"),
            pl.Series("shard", [self._first_shard + shard], dtype=pl.Int64).new_from_index(
                0, len(table)
            ),
        ]
        for ext, kind in self.metadata.items():
            column = self._decoded(table[ext], kind, ext, shard, table[_KEY])
            columns.append(column.alias(ext.replace(".", "_")))
        return pl.DataFrame(columns)

    def _decoded(
        self, raw: pl.Series, kind: type, ext: str, shard: int, keys: pl.Series
    ) -> pl.Series:
        """A metadata member's column as its type: bytes as they are, text
        (UTF-8) as str, int or float, null where a sample lacks it."""
        if kind is bytes:
            return raw.cast(pl.Binary)
        try:
            text = raw.cast(pl.String)
            if kind is str:
                return text
            return text.str.strip_chars().cast(_DECODE[kind], strict=True)
        except pl.exceptions.PolarsError:
            pass  # one value is not plain text of its type: Python says which
        values = [
            self._decode(v, kind, ext, shard, k)
            for v, k in zip(raw.to_list(), keys.to_list(), strict=True)
        ]
        try:
            return pl.Series(values, dtype=_DECODE[kind])
        except OverflowError:
            at = next(
                i for i, v in enumerate(values) if v is not None and not -(1 << 63) <= v < 1 << 63
            )
            raise _invalid(
                f"source {self.name!r}: member {keys[at]}.{ext} of shard "
                f"{self.paths[shard]!r} holds an integer outside the 64-bit range",
                self.paths[shard],
            ) from None

    def _decode(self, raw: bytes | None, kind: type, ext: str, shard: int, key: str) -> Any:
        if raw is None:
            return raw
        try:
            text = raw.decode("utf-8")
            return text if kind is str else kind(text.strip())
        except ValueError:
            raise _invalid(
                f"source {self.name!r}: member {key}.{ext} of shard {self.paths[shard]!r} is "
                f"not {kind.__name__} text: {raw[:40]!r}",
                self.paths[shard],
            ) from None


#: Bytes of payloads in a batch of the native tar reader: below the size
#: from which malloc maps every allocation afresh (32 MiB), whose pages then
#: fault in one by one (64 MiB batches read at 1.3 GB/s here, 16 MiB at 2.8).
_TAR_BATCH_BYTES = 16 << 20

#: The first bytes of a compressed stream (gzip, bzip2, xz, legacy lzma,
#: zstd): a shard read through tarfile, as tarfile recognises them (zstd
#: from Python 3.14; before, tarfile's error names the shard).
_COMPRESSED = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00", b"]\x00\x00\x80", b"(\xb5/\xfd")


def _compressed(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(6).startswith(_COMPRESSED)
    except OSError:
        return False  # the native reader names the error


#: The tar readers' columns beside one per extension (no extension has a "/").
_KEY, _MEMBERS = "/key", "/members"


def _check_utf8(name: str, source: str, path: str) -> None:
    """A member name tarfile decoded with surrogates (bytes that are not
    UTF-8) is refused, as the native reader refuses it."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        shown = name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        raise _invalid(
            f"source {source!r}: cannot read tar shard {path!r}: member {shown!r} has a name "
            f"that is not UTF-8",
            path,
        ) from None


def _members_table(rows: list[tuple[str, dict[str, bytes]]], wanted: list[str]) -> pl.DataFrame:
    """The native reader's batch (see ``WebDataset._batches``) of samples
    read in Python."""
    columns = {
        _KEY: pl.Series([k for k, _ in rows], dtype=pl.String),
        _MEMBERS: pl.Series([", ".join(sorted(m)) for _, m in rows], dtype=pl.String),
    }
    for ext in wanted:
        columns[ext] = pl.Series([m.get(ext) for _, m in rows], dtype=pl.Binary)
    return pl.DataFrame(columns)


def _reason(exc: BaseException, path: str) -> str:
    """An error reading shard `path`, as one line naming it."""
    text = str(exc)
    return text if path in text else f"cannot read tar shard {path!r}: {text}"


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


#: MDS column encodings stored as a fixed-width little-endian number.
_MDS_NUMBERS = {
    **{k: k for k in ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64")},
    **{k: k for k in ("float16", "float32", "float64")},
    "int": "int64",
}
#: MDS column encodings stored as UTF-8 text, and the column type their text becomes.
_MDS_TEXT = {"str": pl.String, "json": pl.String, "str_decimal": pl.String}
_MDS_PARSED = {"str_int": pl.Int64, "str_float": pl.Float64}
#: Shard compressions: the engine's codec, or the standard library's module.
_MDS_CODECS = {"zstd": "zstd", "gz": "gzip", "bz2": "bz2"}


class MDS:
    """MosaicML Streaming (MDS) shards as one source: a directory with the
    ``index.json`` that ``MDSWriter`` wrote (or a ``merge_index`` of several),
    read shard by shard in the index's order.

    Column ``data`` is the payload, as the shards store it (a ``bytes``,
    ``jpeg`` or ``png`` column holds whole files; ``pkl`` a pickle). The
    other columns (or only ``columns``) become metadata: numbers (``int``,
    ``uint8`` ... ``float64``) as numbers, ``str``/``json``/``str_decimal``
    as text, ``str_int``/``str_float`` parsed, any other encoding as its
    stored bytes. Columns ``shard`` (the shard's place in the index) and
    ``index`` (the sample's index in the whole dataset, as
    ``StreamingDataset`` numbers it) say where a record came from.

    A shard is read from its raw file when present, else from its
    compressed one (``zstd`` by the engine, ``gz``, ``bz2``), in pieces of
    about :data:`BATCH_BYTES`. A missing or damaged index or shard, a shard
    whose samples disagree with the index, or a text column that is not
    UTF-8 is :class:`InvalidInputError` naming the file (and sample), as its
    ``path`` too: ``index.json`` when a whole shard disagrees with it.
    """

    #: read on a thread of its own, ahead of the writer (see build)
    read_ahead = True

    def __init__(
        self,
        directory: PathLike,
        *,
        name: str,
        data: str,
        columns: Sequence[str] | None = None,
    ):
        self.name = name
        self.directory = check_text(os.fspath(directory), "an MDS directory")
        self.data_column = check_text(data, "data")
        self.columns = None if columns is None else [check_text(c, "a column") for c in columns]
        self._index = index = os.path.join(self.directory, "index.json")
        try:
            with open(index, encoding="utf-8") as f:
                self.shards = _mds_shards(json.load(f))
        except FileNotFoundError:
            raise _invalid(
                f"source {name!r}: {self.directory!r} is not an MDS dataset: it has no index.json",
                index,
            ) from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise _invalid(f"source {name!r}: unreadable {index!r}: {exc}", index) from None
        for number, shard in enumerate(self.shards):
            names = shard["column_names"]
            if self.data_column not in names:
                raise _invalid(
                    f"source {name!r}: shard {number} of {index!r} has no column "
                    f"{self.data_column!r} ({names})",
                    index,
                )
            missing = sorted(set(self.columns or ()) - set(names))
            clash = {"shard", "index"} & set(self.columns if self.columns is not None else names)
            if missing or clash:
                raise _invalid(
                    f"source {name!r}: shard {number} of {index!r}: "
                    + (f"no columns {missing}" if missing else "")
                    + (" and " if missing and clash else "")
                    + (
                        f"columns {sorted(clash)} would hide the source's own 'shard' and "
                        f"'index' columns: pass columns= without them"
                        if clash
                        else ""
                    ),
                    index,
                )
        # of a part (split): the index of its first shard and first sample
        self._first_shard = self._first_sample = 0

    def __repr__(self) -> str:
        return f"MDS({self.name!r}, {len(self.shards)} shards)"

    def __len__(self) -> int:
        """Samples of all the shards (from the index)."""
        return sum(shard["samples"] for shard in self.shards)

    def split(self, n: int) -> list[MDS]:
        """This source as at most `n` sources over runs of its shards, in
        order, columns ``shard`` and ``index`` still numbered in the whole."""
        parts = []
        for first, shards in _runs(self.shards, n):
            part = copy.copy(self)
            part.shards, part._first_shard = shards, self._first_shard + first
            part._first_sample = self._first_sample + sum(s["samples"] for s in self.shards[:first])
            parts.append(part)
        return parts

    def tables(self) -> Iterator[pl.DataFrame]:
        """The shards' samples, in order, about :data:`BATCH_BYTES` at a time."""
        first = self._first_sample
        for number, shard in enumerate(self.shards, self._first_shard):
            path, raw = self._read(shard)
            yield from _MdsShard(self, number, path, raw, shard).frames(first)
            first += shard["samples"]

    def _read(self, shard: dict) -> tuple[str, bytes]:
        """A shard's raw bytes, and the file they came from."""
        raw, zipped = shard["raw_data"], shard.get("zip_data")
        path = os.path.join(self.directory, raw["basename"])
        try:
            if os.path.isfile(path) or not zipped:
                with open(path, "rb") as f:
                    return path, f.read()
            path = os.path.join(self.directory, zipped["basename"])
            with open(path, "rb") as f:
                packed = f.read()
        except OSError as exc:
            raise _invalid(
                f"source {self.name!r}: cannot read MDS shard {path!r}: {exc.strerror or exc}",
                path,
            ) from None
        algorithm = (shard.get("compression") or "").partition(":")[0]
        codec = _MDS_CODECS.get(algorithm)
        try:
            if codec == "zstd":
                return path, _native.decompress("zstd", packed, raw["bytes"])
            if codec is not None:
                return path, importlib.import_module(codec).decompress(packed)
        except (InvalidInputError, OSError, EOFError, ValueError, MemoryError, zlib.error) as exc:
            size = raw["bytes"]  # index.json's size of the raw shard: zstd's output size
            hint = f" (or {self._index!r} is wrong about its raw size, {size} bytes)"
            hint = hint if codec == "zstd" else ""
            raise _invalid(
                f"source {self.name!r}: MDS shard {path!r} is damaged: {exc}{hint}", path
            ) from None
        raise _invalid(
            f"source {self.name!r}: MDS shard {path!r} is compressed with {algorithm!r}; "
            f"this source reads zstd, gz and bz2 (or the raw shard beside it: "
            f"{raw['basename']!r})",
            path,
        )


def _mds_shards(index: Any) -> list[dict]:
    """The shards of an MDS ``index.json``, checked for what reading needs
    (a ValueError says what is wrong)."""
    if not isinstance(index, dict) or index.get("version") != 2:
        version = index.get("version") if isinstance(index, dict) else None
        raise ValueError(f"index version {version!r}; this source reads version 2")
    shards = index.get("shards")
    if not isinstance(shards, list):
        raise ValueError("its 'shards' is not a list")
    for number, shard in enumerate(shards):
        _check_mds_shard(shard, number)
    return shards


def _check_mds_shard(shard: Any, number: int) -> None:
    where = f"shard {number}"
    if not isinstance(shard, dict) or shard.get("format") != "mds":
        kind = shard.get("format") if isinstance(shard, dict) else type(shard).__name__
        raise ValueError(f"{where} is of format {kind!r}; this source reads mds")
    names, encodings, sizes = (
        shard.get("column_names"),
        shard.get("column_encodings"),
        shard.get("column_sizes"),
    )
    if not all(isinstance(x, list) for x in (names, encodings, sizes)) or not (
        len(names) == len(encodings) == len(sizes)
    ):
        raise ValueError(f"{where}: its column names, encodings and sizes do not line up")
    for name, encoding, size in zip(names, encodings, sizes, strict=True):
        if not isinstance(name, str) or not isinstance(encoding, str):
            raise ValueError(f"{where}: a column name or encoding is not text")
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
            raise ValueError(f"{where}: column {name!r} has size {size!r}")
        number_type = _MDS_NUMBERS.get(encoding)
        if number_type is not None and size != np.dtype(number_type).itemsize:
            raise ValueError(
                f"{where}: column {name!r} ({encoding}) has size {size!r}, not "
                f"{np.dtype(number_type).itemsize}"
            )
    samples = shard.get("samples")
    if not isinstance(samples, int) or isinstance(samples, bool) or not 0 <= samples < 1 << 32:
        raise ValueError(f"{where}: sample count {samples!r}")
    for key in ("raw_data", "zip_data"):
        entry = shard.get(key)
        if entry is None and key == "zip_data":
            continue
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: {key} is {entry!r}")
        base, size = entry.get("basename"), entry.get("bytes")
        parts = base.replace("\\", "/").split("/") if isinstance(base, str) else []
        if not parts or os.path.isabs(base) or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"{where}: {key} file {base!r} is not a path inside the dataset")
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size < 1 << 40:
            raise ValueError(f"{where}: {key} size {size!r}")


class _MdsShard:
    """One MDS shard's samples as frames. The layout (MDS version 2): the
    sample count (u32), count + 1 offsets (u32, from the shard's start), the
    writer's settings (JSON), then each sample: the sizes (u32) of its
    variable-size columns, then its columns' bytes in order."""

    def __init__(self, source: MDS, number: int, path: str, raw: bytes, shard: dict):
        self.source, self.number, self.path, self.raw = source, number, path, raw
        self.names, self.encodings = shard["column_names"], shard["column_encodings"]
        sizes = shard["column_sizes"]
        data = np.frombuffer(raw, np.uint8)
        count = shard["samples"]
        if len(raw) < 4 or int.from_bytes(raw[:4], "little") != count:
            whole = _mds_count(raw)
            if whole is not None:  # a whole shard of another count: the index is wrong
                raise _invalid(
                    f"source {source.name!r}: {source._index!r} gives MDS shard {path!r} "
                    f"{count} samples, but the shard holds {whole} (its count and offsets "
                    f"agree)",
                    source._index,
                )
            self.fail(f"it does not start with the index's sample count {count}")
        if len(raw) < 4 * (count + 2):
            self.fail(f"it is too short for {count} samples' offsets")
        offsets = np.frombuffer(raw, "<u4", count=count + 1, offset=4).astype(np.int64)
        if offsets[0] < 4 * (count + 2) or offsets[-1] != len(raw) or (np.diff(offsets) < 0).any():
            self.fail("its offsets do not span it in order")
        variable = [c for c, size in enumerate(sizes) if size is None]
        widths = np.empty((count, len(sizes)), np.int64)
        for j, c in enumerate(variable):
            at = np.minimum(offsets[:-1] + 4 * j, len(raw) - 4)  # checked below
            widths[:, c] = _u32_at(data, at)
        for c, size in enumerate(sizes):
            if size is not None:
                widths[:, c] = size
        self.ends = offsets[:-1, None] + 4 * len(variable) + np.cumsum(widths, axis=1)
        self.starts = self.ends - widths
        bad = np.flatnonzero(self.ends[:, -1] != offsets[1:])
        if len(bad):
            self.fail(f"sample {int(bad[0])}'s column sizes disagree with its offsets")
        self.data, self.offsets, self.count = data, offsets, count

    def fail(self, why: str) -> NoReturn:
        raise _invalid(
            f"source {self.source.name!r}: MDS shard {self.path!r} is damaged: {why}", self.path
        )

    def frames(self, first: int) -> Iterator[pl.DataFrame]:
        """Frames of about BATCH_BYTES of samples; ``first`` is the shard's
        first sample's index in the dataset."""
        stop = 0
        while stop < self.count:
            start = stop
            limit = self.offsets[start] + BATCH_BYTES
            stop = max(start + 1, int(np.searchsorted(self.offsets[1:], limit, side="right")))
            yield self.frame(start, stop, first)

    def frame(self, start: int, stop: int, first: int) -> pl.DataFrame:
        source = self.source
        wanted = source.columns if source.columns is not None else self.names
        columns = {
            source.data_column: self.binary(self.names.index(source.data_column), start, stop)
        }
        for name in wanted:
            if name != source.data_column:
                columns[name] = self.column(self.names.index(name), start, stop, first)
        columns["shard"] = pl.Series([self.number] * (stop - start), dtype=pl.Int64)
        columns["index"] = pl.Series(np.arange(first + start, first + stop, dtype=np.int64))
        return pl.DataFrame(columns)

    def values(self, c: int, start: int, stop: int) -> list[bytes]:
        """Column `c`'s stored bytes, sample by sample."""
        raw = self.raw
        spans = zip(
            self.starts[start:stop, c].tolist(), self.ends[start:stop, c].tolist(), strict=True
        )
        return [raw[s:e] for s, e in spans]

    def binary(self, c: int, start: int, stop: int) -> pl.Series:
        return pl.Series(self.values(c, start, stop), dtype=pl.Binary)

    def column(self, c: int, start: int, stop: int, first: int) -> pl.Series:
        encoding = self.encodings[c]
        number = _MDS_NUMBERS.get(encoding)
        if number is not None:
            dtype = np.dtype(number).newbyteorder("<")
            at = self.starts[start:stop, c, None] + np.arange(dtype.itemsize)
            values = self.data[at].view(dtype).ravel()  # the gather copies
            if dtype == np.float16:  # a column type polars lacks
                values = values.astype(np.float32)
            return pl.Series(values)
        if encoding not in _MDS_TEXT and encoding not in _MDS_PARSED:
            return self.binary(c, start, stop)
        texts = []
        for row, value in enumerate(self.values(c, start, stop)):
            try:
                texts.append(value.decode("utf-8"))
            except UnicodeDecodeError:
                self.fail(
                    f"sample {first + start + row}'s column {self.names[c]!r} "
                    f"({encoding}) is not UTF-8"
                )
        if encoding in _MDS_TEXT:
            return pl.Series(texts, dtype=pl.String)
        try:
            return pl.Series(texts, dtype=pl.String).str.strip_chars().cast(_MDS_PARSED[encoding])
        except pl.exceptions.PolarsError:
            self.fail(f"column {self.names[c]!r} ({encoding}) holds text that is not a number")


def _mds_count(raw: bytes) -> int | None:
    """The sample count of MDS shard bytes whose count and offsets agree
    (the offsets run in order from past themselves to the shard's end),
    else ``None``."""
    count = int.from_bytes(raw[:4], "little") if len(raw) >= 4 else -1
    if count < 0 or len(raw) < 4 * (count + 2):
        return None
    offsets = np.frombuffer(raw, "<u4", count=count + 1, offset=4).astype(np.int64)
    if offsets[0] < 4 * (count + 2) or offsets[-1] != len(raw) or (np.diff(offsets) < 0).any():
        return None
    return count


def _u32_at(data: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The little-endian u32 at each of the byte offsets ``at``."""
    out = np.zeros(len(at), np.int64)
    for k in range(4):
        out |= data[at + k].astype(np.int64) << (8 * k)
    return out


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
