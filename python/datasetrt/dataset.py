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
    def fingerprint(self) -> str:
        """Content fingerprint of the active population (log it with a training run)."""
        return self._native.fingerprint

    @property
    def snapshot_path(self) -> Path:
        """The manifest file of the active snapshot."""
        return Path(self._native.snapshot_path)

    def history(self) -> pl.DataFrame:
        """Every snapshot on disk: version, created_unix_ms, rows, fingerprint, note."""
        return pl.DataFrame(self._native.history())

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

    def loader(
        self,
        batch_size: int = 64,
        *,
        seed: int,
        epoch: int = 0,
        threads: int | None = None,
        prefetch_bytes: int = 64 << 20,
        prefetch_batches: int = 4,
        drop_last: bool = False,
    ) -> Loader:
        """Batches of one epoch of ``len(self)`` weighted draws, read ahead natively.

        Each batch costs one native call: payloads are read from the mapped
        shards (checksums verified) by ``threads`` concurrent readers while
        Python works on the previous batch, with at most ``prefetch_bytes`` of
        decoded payloads (and ``prefetch_batches`` batches) buffered. The loader
        keeps the snapshot that was active when it was created.
        """
        return Loader(
            self,
            batch_size=batch_size,
            seed=seed,
            epoch=epoch,
            threads=threads,
            prefetch_bytes=prefetch_bytes,
            prefetch_batches=prefetch_batches,
            drop_last=drop_last,
        )

    def iter(self, seed: int, epoch: int = 0, *, batch_size: int = 256) -> Iterator[Sample]:
        """One epoch of ``len(self)`` weighted draws with replacement, sample by sample.

        Draw ``k`` of ``epoch`` depends only on ``(seed, epoch, k)`` and the
        snapshot, so the same arguments repeat exactly. Reads go through the
        same native loader as :meth:`loader`.
        """
        loader = self.loader(batch_size, seed=seed, epoch=epoch)
        return (sample for batch in loader for sample in batch)

    def to_torch(self, batch_size: int = 64, *, seed: int, epoch: int = 0, **options: Any):
        """A ``torch.utils.data.IterableDataset`` of batches; see :mod:`datasetrt.torch`."""
        from .torch import TorchDataset

        return TorchDataset(self, batch_size=batch_size, seed=seed, epoch=epoch, **options)


def check_epoch(epoch: object) -> int:
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise InvalidInputError(f"epoch must be a non-negative int, got {epoch!r}")
    return epoch


class Batch:
    """One batch from a loader: columnar access plus lazily built samples.

    ``data`` is the list of payloads; ``cache_id``/``sample_id``/``rows`` are
    lists of ints (``rows`` index the loader's snapshot); ``metadata`` is a
    polars DataFrame of the batch's rows, built on first access.
    """

    __slots__ = ("_frame", "_metadata", "cache_id", "data", "rows", "sample_id")

    def __init__(
        self,
        rows: list[int],
        cache_id: list[int],
        sample_id: list[int],
        data: list[bytes],
        frame: pl.DataFrame,
    ):
        self.rows = rows
        self.cache_id = cache_id
        self.sample_id = sample_id
        self.data = data
        self._frame = frame
        self._metadata: pl.DataFrame | None = None

    def __len__(self) -> int:
        return len(self.data)

    @property
    def metadata(self) -> pl.DataFrame:
        if self._metadata is None:
            self._metadata = self._frame[self.rows]
        return self._metadata

    def __iter__(self) -> Iterator[Sample]:
        frame, cids, sids, rows = self._frame, self.cache_id, self.sample_id, self.rows
        for i, data in enumerate(self.data):
            yield Sample(data, cids[i], sids[i], rows[i], frame)

    def __repr__(self) -> str:
        return f"<datasetrt.Batch of {len(self)} samples>"


class Loader:
    """Iterator over :class:`Batch` objects; see :meth:`Dataset.loader`."""

    def __init__(
        self,
        dataset: Dataset,
        *,
        batch_size: int,
        seed: int,
        epoch: int,
        threads: int | None,
        prefetch_bytes: int,
        prefetch_batches: int,
        drop_last: bool,
        rank: int = 0,
        world_size: int = 1,
        worker: int = 0,
        num_workers: int = 1,
        start_block: int = 0,
        snapshot: int | None = None,
    ):
        for name, value, low in (
            ("batch_size", batch_size, 1),
            ("prefetch_bytes", prefetch_bytes, 1),
            ("prefetch_batches", prefetch_batches, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidInputError(f"{name} must be a positive int, got {value!r}")
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise InvalidInputError(f"threads must be a positive int or None, got {threads!r}")
        if snapshot is None or snapshot == dataset.version:
            self._frame = dataset.get_metadata()
            snapshot = dataset.version
        else:
            self._frame = pl.DataFrame(dataset._native.metadata(snapshot))
        self.snapshot = snapshot
        self._native = dataset._native.loader(
            _check_seed(seed),
            check_epoch(epoch),
            batch_size,
            start_block=start_block,
            drop_last=drop_last,
            rank=rank,
            world_size=world_size,
            worker=worker,
            num_workers=num_workers,
            prefetch_bytes=prefetch_bytes,
            prefetch_batches=prefetch_batches,
            concurrency=threads,
            snapshot=snapshot,
        )

    def __iter__(self) -> Loader:
        return self

    def __next__(self) -> Batch:
        rows, cache_id, sample_id, data = next(self._native)
        return Batch(rows, cache_id, sample_id, data, self._frame)

    def explain(self) -> str:
        """The loader's physical plan (``SampleExec → PayloadTakeExec``)."""
        return self._native.explain()

    def metrics(self) -> str:
        """The plan with its metrics so far: rows, payload bytes, read time."""
        return self._native.metrics()
