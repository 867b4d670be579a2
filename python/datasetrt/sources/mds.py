"""The MosaicML Streaming source: :class:`MDS`, its ``index.json``
checked and its shards read (``_MdsShard``)."""

from __future__ import annotations

import copy
import importlib
import json
import os
import zlib
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

import numpy as np
import polars as pl

from .. import _native
from .._state import check_text
from ..exceptions import InvalidInputError
from ._common import BATCH_BYTES, PathLike, _invalid, _runs

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
    _check_mds_columns(shard, where)
    samples = shard.get("samples")
    if not isinstance(samples, int) or isinstance(samples, bool) or not 0 <= samples < 1 << 32:
        raise ValueError(f"{where}: sample count {samples!r}")
    _check_mds_files(shard, where)


def _check_mds_columns(shard: dict, where: str) -> None:
    """A shard's column names, encodings and sizes line up, a number's size
    is its encoding's."""
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


def _check_mds_files(shard: dict, where: str) -> None:
    """A shard's raw file (and compressed one, if any) is a path inside the
    dataset, of a plausible size."""
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
