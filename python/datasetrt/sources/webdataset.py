"""The WebDataset source: :class:`WebDataset`, tar shards read natively
(``_native.TarSamples``) or, compressed, through :mod:`tarfile`."""

from __future__ import annotations

import copy
import os
import posixpath
import tarfile
from collections.abc import Iterator, Sequence
from typing import Any

import polars as pl

from .. import _native
from .._state import check_int, check_text
from ..exceptions import InvalidInputError
from ._common import BATCH_BYTES, PathLike, _expand, _invalid, _runs

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
