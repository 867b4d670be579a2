"""The user-facing :class:`Dataset` and :class:`Sample`."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from . import _native
from .exceptions import InvalidInputError

PathLike = str | os.PathLike[str]

_U64 = 1 << 64


class Sample:
    """One sample: its payload ``data`` (bytes), identity and metadata.

    ``metadata`` is the sample's row in the population the sample was read
    from (updated values and added columns included), built on first access;
    it is ``None`` for a stored sample that is not in that population.
    """

    __slots__ = ("_frame", "_metadata", "_row", "cache_id", "data", "sample_id")

    def __init__(
        self,
        data: bytes,
        cache_id: int,
        sample_id: int,
        row: int | None,
        frame: pl.DataFrame | None,
    ):
        self.data = data
        self.cache_id = cache_id
        self.sample_id = sample_id
        self._row = row
        self._frame = frame
        self._metadata: dict[str, Any] | None = None

    @property
    def metadata(self) -> dict[str, Any] | None:
        if self._metadata is None and self._row is not None and self._frame is not None:
            self._metadata = self._frame.row(self._row, named=True)
        return self._metadata

    def __repr__(self) -> str:
        return (
            f"Sample(cache_id={self.cache_id}, sample_id={self.sample_id}, {len(self.data)} bytes)"
        )


def _check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InvalidInputError(
            f"seed must be an int (got {seed!r}); sampling is never silently random"
        )
    if not 0 <= seed < _U64:
        raise InvalidInputError(f"seed must be in [0, 2**64), got {seed}")
    return seed


class Dataset:
    """One or more caches and their active metadata snapshot.

    Open one with :func:`datasetrt.open` or :func:`datasetrt.build`. The
    population (which samples, how often, with which weight) lives in numbered,
    immutable metadata snapshots; changing it never rewrites payload bytes.
    """

    def __init__(self, paths: Sequence[PathLike], snapshot_dir: PathLike | None = None):
        self._paths = [os.fspath(p) for p in paths]
        self._snapshot_dir = None if snapshot_dir is None else os.fspath(snapshot_dir)
        self._native = _native.Dataset(self._paths, self._snapshot_dir)
        self._frame: tuple[int, pl.DataFrame] | None = None

    # -- pickling by recipe: paths, snapshot directory, snapshot number --------
    def __getstate__(self) -> dict[str, Any]:
        return {"paths": self._paths, "snapshot_dir": self._snapshot_dir, "snapshot": self.version}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["paths"], state["snapshot_dir"])  # type: ignore[misc]
        if self.version != state["snapshot"]:
            self._native.checkout(state["snapshot"])

    # -- the population --------------------------------------------------------
    @property
    def version(self) -> int:
        """Number of the active metadata snapshot."""
        return self._native.snapshot

    @property
    def snapshot_path(self) -> Path:
        """The Arrow IPC file of the active snapshot."""
        return Path(self._native.snapshot_path)

    @property
    def caches(self) -> list[dict[str, Any]]:
        """One dict per cache: ``cache_id``, ``name``, ``path``, ``records``, ``codec``."""
        return self._native.caches()

    def __len__(self) -> int:
        """Rows in the active population (draws per epoch)."""
        return len(self._native)

    def __repr__(self) -> str:
        names = ", ".join(c["name"] for c in self.caches)
        return f"<datasetrt.Dataset [{names}] snapshot {self.version}, {len(self)} rows>"

    def get_metadata(self) -> pl.DataFrame:
        """The active population as a polars DataFrame (zero-copy over the snapshot file).

        Columns: ``cache_id``, ``sample_id``, the sources' metadata keys, any
        columns added by updates, and ``weight``.
        """
        version = self.version
        if self._frame is None or self._frame[0] != version:
            self._frame = (version, pl.DataFrame(self._native.metadata()))
        return self._frame[1]

    def update_metadata(self, data: Any) -> int:
        """Make ``data`` the population and return the new snapshot number.

        ``data`` is a polars DataFrame or LazyFrame, or any object with
        ``__arrow_c_stream__`` (pyarrow, DuckDB...). It needs integer
        ``cache_id`` and ``sample_id`` columns naming stored samples; rows may
        repeat (duplicates are drawn more often). ``weight`` defaults to 1.0 and
        must be finite and non-negative with a positive sum. Other columns are
        kept as given. A rejected update raises and changes nothing.
        """
        if isinstance(data, pl.LazyFrame):
            data = data.collect()
        if not hasattr(data, "__arrow_c_stream__"):
            raise InvalidInputError(
                f"update_metadata() takes a polars DataFrame or an object with "
                f"__arrow_c_stream__, not {type(data).__name__}"
            )
        return self._native.update(data)

    def sql(self, query: str) -> pl.DataFrame:
        """Run SQL over table ``metadata`` (the active population); returns polars."""
        return pl.DataFrame(self._native.sql(query))

    def select(self, query: str) -> int:
        """Make the result of ``query`` the population; returns the snapshot number."""
        return self._native.select(query)

    def checkout(self, version: int) -> int:
        """Make an earlier snapshot the active population again."""
        return self._native.checkout(version)

    # -- reading -----------------------------------------------------------------
    def get_item(self, cache_id: int, sample_id: int) -> Sample:
        """Read one stored sample (checksum verified)."""
        data, row = self._native.get(cache_id, sample_id)
        return Sample(data, cache_id, sample_id, row, self.get_metadata())

    def iter(self, seed: int, epoch: int = 0, *, batch_size: int = 256) -> Iterator[Sample]:
        """One epoch of ``len(self)`` weighted draws with replacement.

        Draw ``k`` of ``epoch`` depends only on ``(seed, epoch, k)`` and the
        snapshot, so the same arguments repeat exactly. The iterator keeps the
        snapshot that was active when it was created.
        """
        seed = _check_seed(seed)
        if not isinstance(epoch, int) or epoch < 0:
            raise InvalidInputError(f"epoch must be a non-negative int, got {epoch!r}")
        frame = self.get_metadata()
        reader = self._native.draws(seed, epoch, 0, len(frame), batch_size)
        return _samples(reader, frame)


def _samples(reader: Any, frame: pl.DataFrame) -> Iterator[Sample]:
    for _snapshot, rows, cache_ids, sample_ids, payloads in reader:
        for i, data in enumerate(payloads):
            yield Sample(data, cache_ids[i], sample_ids[i], rows[i], frame)
