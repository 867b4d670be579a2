"""The user-facing :class:`Dataset` and :class:`Sample`."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from . import _native
from .exceptions import CacheNotFoundError, DatasetRTError, InvalidInputError

PathLike = str | os.PathLike[str]

_U64 = 1 << 64

#: The most draws :meth:`Dataset.draws` returns at once (4 bytes each: 8 GiB);
#: read longer sequences in parts with ``start``, or through a loader.
MAX_DRAWS = 1 << 31


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


def arrow_stream(data: Any, what: str) -> tuple[Any, list[str]]:
    """``data`` as an object with ``__arrow_c_stream__`` (a LazyFrame is
    collected), and the names of its all-null (``Null``) columns.

    Polars exports a ``Null`` column in a form the Arrow C data interface
    does not allow, so such columns travel as all-null Booleans and the
    native side restores them (see ``python/src/arrow_in.rs``).
    """
    if isinstance(data, pl.LazyFrame):
        data = data.collect()
    nulls: list[str] = []
    if isinstance(data, pl.DataFrame):
        objects = [n for n, t in data.schema.items() if t == pl.Object]
        if objects:
            raise InvalidInputError(
                f"{what}: column {objects[0]!r} holds Python objects (polars Object), which "
                f"cannot be stored; convert it to a number, string or bytes column first"
            )
        nulls = [n for n, t in data.schema.items() if t == pl.Null]
        if nulls:
            data = data.with_columns(pl.col(nulls).cast(pl.Boolean))
    if not hasattr(data, "__arrow_c_stream__"):
        raise InvalidInputError(
            f"{what} takes a polars DataFrame or LazyFrame or an object with "
            f"__arrow_c_stream__, not {type(data).__name__}"
        )
    return data, nulls


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
            self._native.pin(state["snapshot"])  # this process only: the head stays

    # -- the population --------------------------------------------------------
    @property
    def version(self) -> int:
        """Number of the active metadata snapshot."""
        return self._native.snapshot

    @property
    def head(self) -> int:
        """The snapshot the dataset's head record names now.

        It differs from :attr:`version` when another process (or another
        ``Dataset`` object) committed since this one was opened or refreshed.
        """
        return self._native.head()

    def refresh(self) -> int:
        """Make the head's snapshot the active population here; returns its number."""
        return self._native.refresh()

    @property
    def fingerprint(self) -> str:
        """Content fingerprint of the active population (log it with a training run)."""
        return self._native.fingerprint

    @property
    def snapshot_path(self) -> Path:
        """The manifest file of the active snapshot."""
        return Path(self._native.snapshot_path)

    def history(self) -> pl.DataFrame:
        """Every snapshot on disk: version, created_unix_ms, rows, fingerprint,
        note, and parent (the head it was committed on; null for the first)."""
        return pl.DataFrame(self._native.history(), schema_overrides={"parent": pl.Int64})

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

    def update_metadata(self, data: Any, *, base: int | None = None, force: bool = False) -> int:
        """Make ``data`` the population and return the new snapshot number.

        ``data`` is a polars DataFrame or LazyFrame, or any object with
        ``__arrow_c_stream__`` (pyarrow, DuckDB...). It needs integer
        ``cache_id`` and ``sample_id`` columns naming stored samples; rows may
        repeat (duplicates are drawn more often). ``weight`` defaults to 1.0 and
        must be finite and non-negative with a positive sum. Other columns are
        kept as given. A rejected update raises and changes nothing.

        The update is taken as derived from ``base`` (default: the active
        snapshot, which :meth:`get_metadata` and :meth:`sql` read). If another
        writer moved the head since, it raises :class:`ConflictError` naming
        both snapshots instead of silently dropping that writer's change:
        :meth:`refresh`, redo the change and update again, or pass
        ``force=True`` to replace the head's population anyway.
        """
        if base is not None:
            base = check_version(base, "base")
        stream, nulls = arrow_stream(data, "update_metadata()")
        return self._native.update(stream, base=base, force=bool(force), nulls=nulls)

    def register(self, name: str, data: Any) -> None:
        """Make ``data`` a SQL table called ``name`` (next to ``metadata`` and ``payloads``).

        ``data`` is a polars DataFrame or LazyFrame, any object with
        ``__arrow_c_stream__`` (pyarrow, DuckDB...), or a path to a Parquet or
        CSV file (read with polars). For example, join model losses for
        hard-example mining::

            ds.register("losses", losses_df)
            ds.select("SELECT m.* EXCLUDE (weight), l.loss AS weight "
                      "FROM metadata m JOIN losses l USING (cache_id, sample_id)")
        """
        if isinstance(data, (str, os.PathLike)):
            path = Path(data)
            if not path.exists():
                raise CacheNotFoundError(f"table file not found: {path}")
            readers = {".parquet": pl.read_parquet, ".csv": pl.read_csv}
            if path.suffix.lower() not in readers:
                raise InvalidInputError(f"{path}: register() reads .parquet and .csv files")
            data = readers[path.suffix.lower()](path)
        stream, nulls = arrow_stream(data, "register()")
        self._native.register(name, stream, nulls=nulls)

    def datafusion_table(self) -> Any:
        """The active population for the ``datafusion`` Python package (zero-copy, FFI)::

        ctx = datafusion.SessionContext()
        ctx.register_table("metadata", ds.datafusion_table())
        """
        return self._native.datafusion_table()

    def sql(self, query: str) -> pl.DataFrame:
        """Run SQL over table ``metadata`` (the active population); returns polars."""
        return pl.DataFrame(self._native.sql(query))

    def select(self, query: str, *, force: bool = False) -> int:
        """Make the result of ``query`` the population; returns the snapshot number.

        The query runs on the active snapshot. If another writer moved the
        head meanwhile, it runs again on the new head (up to three times)
        before :class:`ConflictError` is raised; ``force=True`` commits the
        first result whatever the head.
        """
        return self._native.select(query, force=bool(force))

    def apply_sql(self, recipe: str | os.PathLike[str], **params: Any) -> int:
        """Run a SQL recipe (a name from ``sql/`` or a ``.sql`` path) with
        ``:name`` parameters and make its result the population.

        >>> ds.apply_sql("dev_subset", seed=7, fraction=0.1)  # doctest: +SKIP
        """
        from . import recipes

        label, text = recipes.load(recipe)
        query = recipes.render(text, params)
        return self._native.select(query, note=f"apply_sql {label} {params}", force=False)

    def checkout(self, version: int | str) -> int:
        """Make an earlier snapshot (a number or a tag) the population again.

        The head moves to it, so every process that opens or refreshes the
        dataset sees it (a rollback: no snapshot is deleted, and the next
        update is committed on top of it).
        """
        if isinstance(version, str):
            tags = self._native.tags()
            if version not in tags:
                raise InvalidInputError(f"no tag {version!r}; tags: {sorted(tags)}")
            version = tags[version]
        return self._native.checkout(check_version(version))

    def tag(self, name: str, version: int | None = None) -> None:
        """Name a snapshot (default: the active one); tagged snapshots survive cleanup."""
        if not isinstance(name, str):
            raise InvalidInputError(f"a tag is a str, not {type(name).__name__}")
        self._native.tag(name, None if version is None else check_version(version))

    def tags(self) -> dict[str, int]:
        """Every tag and the snapshot number it names."""
        return dict(self._native.tags())

    def cleanup(self, keep: int = 10) -> list[int]:
        """Delete snapshots except the newest ``keep``, the tagged ones, the
        head and the active one, and the column files no remaining snapshot
        uses. Returns the deleted snapshot numbers. Commits of other processes
        wait while it runs (they share the dataset's commit lock)."""
        keep = check_int(keep, "keep", 0, 1 << 32)
        self._frame = None
        return self._native.cleanup(keep)

    def diff(self, a: int | str, b: int | str) -> pl.DataFrame:
        """How population ``b`` differs from ``a``, per stored sample.

        One row per ``(cache_id, sample_id)`` that changed, with its number of
        rows and total weight in each snapshot and ``change``: ``"added"``
        (more rows in ``b``), ``"removed"`` (fewer), or ``"reweighted"`` (as
        many rows, another total weight).
        """
        tags = self._native.tags()
        a, b = (tags.get(v, v) if isinstance(v, str) else v for v in (a, b))
        a, b = check_version(a, "a"), check_version(b, "b")

        def per_sample(version: int) -> pl.DataFrame:
            frame = pl.DataFrame(self._native.metadata(version))
            return frame.group_by("cache_id", "sample_id").agg(
                pl.len().alias("rows"), pl.col("weight").sum().alias("weight")
            )

        joined = per_sample(a).join(
            per_sample(b), on=["cache_id", "sample_id"], how="full", coalesce=True, suffix="_b"
        )
        joined = joined.rename({"rows": "rows_a", "weight": "weight_a"}).with_columns(
            pl.col("rows_a", "rows_b").fill_null(0).cast(pl.Int64),
            pl.col("weight_a", "weight_b").fill_null(0.0),
        )
        change = (
            pl.when(pl.col("rows_b") > pl.col("rows_a"))
            .then(pl.lit("added"))
            .when(pl.col("rows_b") < pl.col("rows_a"))
            .then(pl.lit("removed"))
            .when(pl.col("weight_b") != pl.col("weight_a"))
            .then(pl.lit("reweighted"))
            .otherwise(None)
        )
        return (
            joined.with_columns(change.alias("change"))
            .filter(pl.col("change").is_not_null())
            .sort("cache_id", "sample_id")
            .select("cache_id", "sample_id", "rows_a", "rows_b", "weight_a", "weight_b", "change")
        )

    def verify(self, *, progress: bool = False) -> pl.DataFrame:
        """Check every stored file and record; return every problem found.

        Reads every record of every cache (checksums verified), the head,
        the tags, and every snapshot with every column file it names. One row
        per problem: ``kind`` (the exception class it would raise), ``path``
        and ``message``; an empty frame means everything is intact. Unlike a
        read, it does not stop at the first problem.
        """
        bar = None
        if progress:
            try:
                from tqdm.auto import tqdm

                bar = tqdm(desc="verifying", unit=" items")
            except ImportError:
                bar = None

        def report(done: int, total: int) -> None:
            if bar is not None:
                bar.total = total
                bar.n = done
                bar.refresh()

        try:
            problems = self._native.verify(report if bar is not None else None)
        finally:
            if bar is not None:
                bar.close()
        schema = {"kind": pl.String, "path": pl.String, "message": pl.String}
        rows = [
            {**p, "path": None if p["path"] is None else os.fspath(p["path"])} for p in problems
        ]
        return pl.DataFrame(rows, schema=schema)

    # -- reading -----------------------------------------------------------------
    def get_item(self, cache_id: int, sample_id: int) -> Sample:
        """Read one stored sample (checksum verified)."""
        cache_id = check_int(cache_id, "cache_id", -(1 << 63), (1 << 63) - 1)
        sample_id = check_int(sample_id, "sample_id", -(1 << 63), (1 << 63) - 1)
        data, row = self._native.get(cache_id, sample_id)
        return Sample(data, cache_id, sample_id, row, self.get_metadata())

    def loader(
        self,
        batch_size: int = 64,
        *,
        seed: int | None = None,
        epoch: int = 0,
        sampling: str = "replacement",
        epoch_len: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        resume: dict[str, Any] | None = None,
        threads: int | None = None,
        prefetch_bytes: int = 64 << 20,
        prefetch_batches: int = 4,
    ) -> Loader:
        """Batches of one epoch of draws, read ahead natively.

        ``sampling`` chooses how rows are drawn (draw ``k`` of ``epoch`` is a
        pure function of ``(seed, epoch, k)`` and the snapshot):

        - ``"replacement"`` (default): weighted, with replacement;
        - ``"permutation"``: every row exactly once per epoch, in a seeded order;
        - ``"weighted_without_replacement"``: a seeded weighted order, no repeats
          (rows of weight 0 never appear);
        - ``"balanced"``: each row appears the floor or ceiling of
          ``epoch_len * w / sum(w)`` times, shuffled.

        ``epoch_len`` defaults to the number of rows (of positive weight, for
        weighted without replacement). ``rank``/``world_size`` default to
        ``torch.distributed`` when it is initialised, else to the ``RANK`` and
        ``WORLD_SIZE`` environment variables, else to one process. Each rank
        gets every ``world_size``-th batch of the one global sequence; with
        several ranks every rank gets the same number of full batches: padded
        (the sequence continues) or, with ``drop_last``, cut.

        ``resume`` takes a :meth:`Loader.state_dict` and continues its exact
        global sequence (also with another ``world_size`` or number of workers);
        its seed, epoch, sampling, epoch length and snapshot win.

        Payloads are read from the mapped shards (checksums verified) by
        ``threads`` concurrent readers while Python works on the previous
        batch, with at most ``prefetch_bytes`` of decoded payloads (and
        ``prefetch_batches`` batches) buffered. The loader keeps the snapshot
        that was active when it was created.
        """
        rank, world_size = distributed_defaults(rank, world_size)
        return Loader(
            self,
            batch_size=batch_size,
            seed=seed,
            epoch=epoch,
            sampling=sampling,
            epoch_len=epoch_len,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
            resume=resume,
            threads=threads,
            prefetch_bytes=prefetch_bytes,
            prefetch_batches=prefetch_batches,
        )

    def iter(
        self,
        seed: int,
        epoch: int = 0,
        *,
        sampling: str = "replacement",
        batch_size: int = 256,
    ) -> Iterator[Sample]:
        """One epoch of draws, sample by sample (``len(self)`` draws by default).

        Draw ``k`` of ``epoch`` depends only on ``(seed, epoch, k)`` and the
        snapshot, so the same arguments repeat exactly. Reads go through the
        same native loader as :meth:`loader` (one process: rank 0 of 1).
        """
        loader = self.loader(
            batch_size, seed=seed, epoch=epoch, sampling=sampling, rank=0, world_size=1
        )
        return (sample for batch in loader for sample in batch)

    def draws(
        self,
        seed: int,
        epoch: int = 0,
        *,
        start: int = 0,
        count: int | None = None,
        sampling: str = "replacement",
        epoch_len: int | None = None,
    ) -> pl.Series:
        """Rows (of :meth:`get_metadata`) of draws ``start .. start + count`` of an epoch.

        The global sequence the loaders deliver, without reading a payload:
        ``ds.get_metadata()[ds.draws(7)]`` is the epoch's population in draw order.
        """
        if epoch_len is not None:
            epoch_len = check_int(epoch_len, "epoch_len", 1)
        if count is None:  # one epoch
            count = self._native.draw_counts(None, sampling, epoch_len, 1, 1, False)[0]
        table = self._native.draw_rows(
            _check_seed(seed),
            check_epoch(epoch),
            check_int(start, "start", 0, _U64 - 1 - MAX_DRAWS),
            check_int(count, "count", 0, MAX_DRAWS),
            sampling,
            epoch_len,
        )
        return pl.DataFrame(table)["row"]

    def to_torch(self, batch_size: int = 64, *, seed: int, epoch: int = 0, **options: Any):
        """A ``torch.utils.data.IterableDataset`` of batches; see :mod:`datasetrt.torch`."""
        from .torch import TorchDataset

        return TorchDataset(self, batch_size=batch_size, seed=seed, epoch=epoch, **options)


def check_int(value: object, name: str, low: int = 0, high: int = _U64 - 1) -> int:
    """``value`` as an int in ``[low, high]``, else :class:`InvalidInputError`
    (never a TypeError or OverflowError from the native layer)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{name} must be an int, got {value!r}")
    if not low <= value <= high:
        raise InvalidInputError(f"{name} must be in [{low}, {high}], got {value}")
    return value


def check_epoch(epoch: object) -> int:
    return check_int(epoch, "epoch")


def check_version(version: object, name: str = "snapshot") -> int:
    return check_int(version, name, 0, (1 << 63) - 1)


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


STATE_FORMAT = "datasetrt-loader-state"


def distributed_defaults(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Fill in rank and world size from torch.distributed or RANK/WORLD_SIZE."""
    if rank is None or world_size is None:
        found = None
        # torch.distributed can only be initialised if it was imported: never import it here
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            found = (dist.get_rank(), dist.get_world_size())
        if found is None and "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            try:
                found = (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
            except ValueError:
                raise InvalidInputError(
                    f"RANK={os.environ['RANK']!r} and WORLD_SIZE={os.environ['WORLD_SIZE']!r} "
                    f"must be integers"
                ) from None
        found = found or (0, 1)
        rank = found[0] if rank is None else rank
        world_size = found[1] if world_size is None else world_size
    check_int(rank, "rank", 0, (1 << 32) - 1)
    check_int(world_size, "world_size", 0, (1 << 32) - 1)
    if not 0 <= rank < world_size:
        raise InvalidInputError(f"rank {rank} is not in 0..world_size ({world_size})")
    return rank, world_size


def make_state(
    dataset: Dataset,
    *,
    seed: int,
    epoch: int,
    sampling: str,
    epoch_len: int,
    batch_size: int,
    snapshot: int,
    position: int,
) -> dict[str, Any]:
    """A loader state: plain, JSON-serialisable data."""
    return {
        "format": STATE_FORMAT,
        "version": 1,
        "seed": seed,
        "epoch": epoch,
        "sampling": sampling,
        "epoch_len": epoch_len,
        "batch_size": batch_size,
        "snapshot": snapshot,
        "fingerprint": dataset._native.fingerprint_of(snapshot),
        "position": position,
    }


def check_state(dataset: Dataset, state: Any, batch_size: int) -> dict[str, Any]:
    """Validate a loader state against the dataset; returns it."""
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise InvalidInputError(f"resume takes a Loader.state_dict(), not {state!r}")
    try:
        fingerprint = dataset._native.fingerprint_of(state["snapshot"])
    except DatasetRTError as exc:
        raise InvalidInputError(
            f"the state was saved at snapshot {state['snapshot']}, which this dataset does "
            f"not have ({exc})"
        ) from None
    if fingerprint != state["fingerprint"]:
        raise InvalidInputError(
            f"the state was saved at snapshot {state['snapshot']} with fingerprint "
            f"{state['fingerprint']}, but that snapshot now has fingerprint {fingerprint}"
        )
    if state["position"] % batch_size:
        raise InvalidInputError(
            f"position {state['position']} is not a multiple of batch_size {batch_size}; "
            f"resume with batch_size={state['batch_size']}"
        )
    return state


class Loader:
    """Iterator over :class:`Batch` objects; see :meth:`Dataset.loader`."""

    def __init__(
        self,
        dataset: Dataset,
        *,
        batch_size: int,
        seed: int | None,
        epoch: int,
        threads: int | None,
        prefetch_bytes: int,
        prefetch_batches: int,
        drop_last: bool,
        sampling: str = "replacement",
        epoch_len: int | None = None,
        rank: int = 0,
        world_size: int = 1,
        worker: int = 0,
        num_workers: int = 1,
        resume: dict[str, Any] | None = None,
        snapshot: int | None = None,
    ):
        for name, value, low in (
            ("batch_size", batch_size, 1),
            ("prefetch_bytes", prefetch_bytes, 1),
            ("prefetch_batches", prefetch_batches, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidInputError(f"{name} must be a positive int, got {value!r}")
        check_int(batch_size, "batch_size", 1, MAX_DRAWS)
        check_int(prefetch_bytes, "prefetch_bytes", 1, (1 << 63) - 1)
        check_int(prefetch_batches, "prefetch_batches", 1, 1 << 20)
        if threads is not None:
            check_int(threads, "threads", 1, 1024)
        if epoch_len is not None:
            check_int(epoch_len, "epoch_len", 1)
        start_block = 0
        if resume is not None:
            state = check_state(dataset, resume, batch_size)
            seed, epoch, sampling = state["seed"], state["epoch"], state["sampling"]
            epoch_len, snapshot = state["epoch_len"], state["snapshot"]
            start_block = state["position"] // batch_size
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
            sampling=sampling,
            epoch_len=epoch_len,
        )
        self._state = make_state(
            dataset,
            seed=seed,
            epoch=epoch,
            sampling=sampling,
            epoch_len=self._native.epoch_len,
            batch_size=batch_size,
            snapshot=snapshot,
            position=0,
        )
        self._start_block = start_block
        self._stride = world_size * num_workers
        self._delivered = 0

    def state_dict(self) -> dict[str, Any]:
        """A small JSON-serialisable state: resume with ``Dataset.loader(resume=state)``.

        ``position`` counts the draws of the global sequence consumed so far:
        this loader's batches times the readers running side by side (ranks in
        lockstep, as distributed training runs them).
        """
        blocks = self._start_block + self._delivered * self._stride
        position = min(blocks * self._state["batch_size"], self._native.total_draws)
        return {**self._state, "position": position}

    def __iter__(self) -> Loader:
        return self

    def __next__(self) -> Batch:
        rows, cache_id, sample_id, data = next(self._native)
        self._delivered += 1
        return Batch(rows, cache_id, sample_id, data, self._frame)

    def explain(self) -> str:
        """The loader's physical plan (``SampleExec → PayloadTakeExec``)."""
        return self._native.explain()

    def metrics(self) -> str:
        """The plan with its metrics so far: rows, payload bytes, read time."""
        return self._native.metrics()
