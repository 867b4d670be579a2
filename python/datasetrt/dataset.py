"""The user-facing :class:`Dataset`: caches, metadata snapshots, SQL and reading."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from . import _html, _native
from ._arrow import arrow_stream, chunks
from ._html import HtmlRepr
from ._progress import Progress
from ._state import (
    MAX_DRAWS,
    U64,
    check_epoch,
    check_int,
    check_seed,
    check_text,
    check_version,
    distributed_defaults,
    printable,
)
from .exceptions import CacheNotFoundError, InvalidInputError
from .loader import Loader, Sample, _Frame

PathLike = str | os.PathLike[str]


def _storage_options(options: Mapping[str, str] | None) -> list[tuple[str, str]] | None:
    """``storage_options`` as the engine takes them: (key, value) strings."""
    if options is None:
        return None
    if not isinstance(options, Mapping):
        raise InvalidInputError(
            f"storage_options must be a dict of strings, not {type(options).__name__}"
        )
    out = []
    for key, value in options.items():
        if not isinstance(key, str):
            raise InvalidInputError(f"storage_options key {key!r} is not a string")
        check_text(key, "a storage_options key")
        if isinstance(value, bool):
            value = "true" if value else "false"
        out.append((key, check_text(str(value), f"storage_options[{key!r}]")))
    return out


def _shares_of_table(table: Any) -> dict[Any, Any]:
    """A mixture's shares from a table with columns ``value`` and ``share``."""
    frame = table if isinstance(table, pl.DataFrame) else pl.DataFrame(table)
    missing = [c for c in ("value", "share") if c not in frame.columns]
    if missing:
        raise InvalidInputError(
            f"a table of shares needs columns value and share; it lacks {missing} "
            f"(it has {frame.columns})"
        )
    if frame["value"].null_count():
        raise InvalidInputError("a table of shares has a null value")
    values = frame["value"].to_list()
    if len(set(values)) != len(values):
        raise InvalidInputError("a table of shares names a value twice")
    return dict(zip(values, frame["share"].to_list(), strict=True))


def _memory_limit(limit: int | str | None) -> str | None:
    """A SQL memory limit as the engine reads it (bytes, or ``"4G"``...)."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, (int, str)):
        raise InvalidInputError(
            f"memory_limit must be bytes (an int) or a size like '4G', not {limit!r}"
        )
    return str(limit)


class Dataset:
    """One or more caches and their active metadata snapshot.

    Open one with :func:`datasetrt.open` or :func:`datasetrt.build`. The
    population (which samples, how often, with which weight) lives in numbered,
    immutable metadata snapshots; changing it never rewrites payload bytes.
    """

    def __init__(
        self,
        paths: Sequence[PathLike],
        snapshot_dir: PathLike | None = None,
        *,
        storage_options: Mapping[str, str] | None = None,
        cache_dir: PathLike | None = None,
        cache_bytes: int | None = None,
        workers: Sequence[str] = (),
        memory_limit: int | str | None = None,
    ):
        from .worker import worker_urls

        self._paths = [os.fspath(p) for p in paths]
        self._workers = worker_urls(workers)
        self._memory_limit = _memory_limit(memory_limit)
        self._snapshot_dir = None if snapshot_dir is None else os.fspath(snapshot_dir)
        self._remote: dict[str, Any] = {
            "storage_options": _storage_options(storage_options),
            "cache_dir": None if cache_dir is None else os.fspath(cache_dir),
            "cache_bytes": None
            if cache_bytes is None
            else check_int(cache_bytes, "cache_bytes", 1),
        }
        self._native = _native.Dataset(
            self._paths,
            self._snapshot_dir,
            self._remote["storage_options"],
            self._remote["cache_dir"],
            self._remote["cache_bytes"],
            memory_limit=self._memory_limit,
        )
        # with workers: the companion module's dataset that runs the SQL
        self._coordinator: Any = None
        if self._workers:
            self._sql_engine()  # a bad URL or a missing module is an error now
        self._frame: tuple[int, pl.DataFrame] | None = None

    # -- pickling by recipe: paths, options, snapshot number -------------------
    def __getstate__(self) -> dict[str, Any]:
        return {
            "paths": self._paths,
            "snapshot_dir": self._snapshot_dir,
            "remote": self._remote,
            "workers": self._workers,
            "memory_limit": self._memory_limit,
            "snapshot": self.version,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        remote = dict(state["remote"])
        remote["storage_options"] = dict(remote["storage_options"] or [])
        self.__init__(  # type: ignore[misc]
            state["paths"],
            state["snapshot_dir"],
            workers=state.get("workers", ()),
            memory_limit=state.get("memory_limit"),
            **remote,
        )
        if self.version != state["snapshot"]:
            self.pin(state["snapshot"])  # this process only: the head stays

    @property
    def paths(self) -> list[str]:
        """The cache roots this dataset was opened with (local paths or URLs)."""
        return list(self._paths)

    @property
    def is_remote(self) -> bool:
        """Whether a cache root is in a bucket (a URL), not on a local disk."""
        return any("://" in p for p in self._paths)

    # -- the population --------------------------------------------------------
    @property
    def version(self) -> int:
        """Number of the active metadata snapshot."""
        return self._native.version

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

    def fetch_stats(self, host: bool = False) -> dict[str, int]:
        """What reading remote caches has cost so far: this process, or with
        ``host=True`` every process on this host that shares the dataset's
        ``cache_dir`` (DataLoader workers, ranks, notebooks; those that ended
        included).

        ``requests`` and ``bytes`` downloaded, records read that the local
        replica already held (``hits``) or that were fetched only when read
        (``misses``: the read-ahead had not reached them), and
        ``evicted_bytes``. All zero for a dataset of local caches.
        """
        return dict(self._native.fetch_stats(host))

    @property
    def fingerprint(self) -> str:
        """Content fingerprint of the active population (log it with a training
        run): equal populations stored in equal partitions have equal ones."""
        return self._native.fingerprint

    @property
    def snapshot_path(self) -> Path:
        """The manifest file of the active snapshot."""
        return Path(self._native.snapshot_path)

    def history(self) -> pl.DataFrame:
        """Every snapshot on disk, from its manifest alone: version,
        created_unix_ms, rows, partitions (how many sets of column files hold
        the rows), fingerprint, note, parent (the head it was committed on;
        null for the first), and
        committed: false for a snapshot no head ever named (a writer was
        killed between creating it and moving the head; no update returned
        it, and the next commit removes it)."""
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

    def get_metadata(self, version: int | str | None = None) -> pl.DataFrame:
        """The active population (or snapshot ``version``'s: a number or a tag)
        as a polars DataFrame, zero-copy over the snapshot's files.

        Columns: ``cache_id``, ``sample_id``, the sources' metadata keys, any
        columns added by updates, and ``weight``. The active snapshot's frame
        is kept, so asking again costs nothing.
        """
        active = self.version
        number = active if version is None else self.resolve(version)
        if number != active:
            return pl.DataFrame(self._native.get_metadata(number))
        if self._frame is None or self._frame[0] != active:
            self._frame = (active, pl.DataFrame(self._native.get_metadata()))
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
        return self._native.update_metadata(
            chunks(stream), base=base, force=bool(force), nulls=nulls
        )

    def set_mixture(
        self,
        column: str | None,
        shares: Mapping[Any, float] | Any = None,
        *,
        base: int | None = None,
        force: bool = False,
    ) -> int:
        """Draw the population as a mixture: ``shares[v]`` of the draws from
        the rows whose ``column`` is ``v``; returns the new snapshot number.

        >>> ds.set_mixture("source", {"web": 0.6, "code": 0.3, "books": 0.1})  # doctest: +SKIP

        The mixture is part of the population: it is committed as a snapshot
        (the same rows, no column file rewritten) and kept by later updates
        that keep ``column``; table ``mixture`` shows it in SQL, and
        ``set_mixture(None)`` draws by the weights alone again.

        ``shares`` may also be a table with columns ``value`` and ``share``
        (a polars DataFrame, or any object with ``__arrow_c_stream__``): the
        result of SQL, say::

            ds.set_mixture("source", ds.sql(
                "SELECT source AS value, 1.0 / count(*) AS share FROM metadata GROUP BY source"))

        For every ``k``, each group's count among the first ``k`` draws of an
        epoch is within one of ``share * k``; within a group rows are drawn
        by their own weights in the loader's sampling mode (a permutation
        walks the group's rows, repeating it once its share outgrows it).
        Rows whose value has no share are not drawn. Values are matched as
        text (the column's values cast to strings); shares are any
        non-negative numbers (normalised) and kept exactly when they are
        multiples of 1/10,000, else to the nearest 1/65,536.
        """
        if base is not None:
            base = check_version(base, "base")
        if column is None:
            if shares:
                raise InvalidInputError("set_mixture(None) takes no shares")
            return self._native.set_mixture(None, [], base=base, force=bool(force))
        check_text(column, "the mixture's column")
        if not isinstance(shares, Mapping) and hasattr(shares, "__arrow_c_stream__"):
            shares = _shares_of_table(shares)
        if not isinstance(shares, Mapping) or not shares:
            raise InvalidInputError(
                f"set_mixture needs the shares as a dict of value -> share, not {shares!r}"
            )
        pairs = []
        for value, share in shares.items():
            if isinstance(value, bool) or not isinstance(value, (str, int)):
                raise InvalidInputError(
                    f"a mixture's group is a str or int value of {column!r}, not {value!r}"
                )
            if isinstance(share, bool) or not isinstance(share, (int, float)):
                raise InvalidInputError(f"the share of group {value!r} must be a number")
            pairs.append((check_text(str(value), "a mixture's group"), float(share)))
        return self._native.set_mixture(column, pairs, base=base, force=bool(force))

    def mixture(self, version: int | str | None = None) -> pl.DataFrame | None:
        """The mixture of the active snapshot (or ``version``): ``column``,
        ``value``, ``share`` per group; ``None`` when it draws by weights alone."""
        number = None if version is None else self.resolve(version)
        found = self._native.mixture(number)
        if found is None:
            return None
        column, shares = found
        return pl.DataFrame(
            {
                "column": [column] * len(shares),
                "value": [v for v, _ in shares],
                "share": [s for _, s in shares],
            },
            schema={"column": pl.String, "value": pl.String, "share": pl.Float64},
        )

    def exposures(
        self,
        state: Mapping[str, Any],
        *,
        first_epoch: int = 0,
        history: Any = None,
        world_size: int = 1,
        drop_last: bool = False,
        epoch_len: int | None = None,
    ) -> pl.DataFrame:
        """What a checkpoint trained on: every ``(cache_id, sample_id)`` drawn
        up to loader state ``state``, with its ``count``.

        Recomputed from the state and the snapshots (the draws are a pure
        function of them): nothing per sample is stored, and a sample removed
        by a later update (dedup, decontamination) is still answered for.
        Epochs ``first_epoch`` to the state's are counted, the earlier ones
        whole (cut or padded for ``world_size`` ranks and ``drop_last`` as
        the run's loader was, of ``epoch_len`` draws if the loader was given
        one, else each its snapshot's default), the state's up to its
        position. Each epoch
        draws from the state's snapshot unless ``history`` (a
        ``TorchDataset.history()`` frame, or a dict epoch -> snapshot) says
        otherwise, as for a loader that followed the head. The result is also
        SQL table ``exposures``::

            ds.exposures(ckpt["loader"])
            ds.sql("SELECT count(*) FROM exposures e JOIN metadata m "
                   "USING (cache_id, sample_id) WHERE m.source = 'web'")
        """
        if not isinstance(state, Mapping):
            raise InvalidInputError(
                f"exposures takes a loader state (state_dict()), not {type(state).__name__}"
            )
        first_epoch = check_epoch(first_epoch)
        world_size = check_int(world_size, "world_size", 1, (1 << 32) - 1)
        if epoch_len is not None:
            epoch_len = check_int(epoch_len, "epoch_len", 1, (1 << 63) - 1)
        snapshots: dict[int, int] = {}
        if isinstance(history, pl.DataFrame):
            history = dict(history.select("epoch", "snapshot").iter_rows())
        if history is not None:
            if not isinstance(history, Mapping):
                raise InvalidInputError(
                    "history must be TorchDataset.history() or a dict epoch -> snapshot"
                )
            for epoch, number in history.items():
                snapshots[check_epoch(epoch)] = check_version(number, "a history snapshot")
        table = pl.DataFrame(
            self._native.exposures(
                dict(state),
                first_epoch=first_epoch,
                snapshots=snapshots,
                world_size=world_size,
                drop_last=bool(drop_last),
                epoch_len=epoch_len,
            )
        )
        self.register("exposures", table)
        return table

    def register(self, name: str, data: Any) -> None:
        """Make ``data`` a SQL table called ``name`` (next to ``metadata`` and ``payloads``).

        ``data`` is a polars DataFrame or LazyFrame, any object with
        ``__arrow_c_stream__`` (pyarrow, DuckDB...), or a path to a Parquet or
        CSV file (read with polars; a path that is not UTF-8 too). For
        example, join model losses for hard-example mining::

            ds.register("losses", losses_df)
            ds.select("SELECT m.* EXCLUDE (weight), l.loss AS weight "
                      "FROM metadata m JOIN losses l USING (cache_id, sample_id)")
        """
        check_text(name, "the table name")
        if isinstance(data, (str, os.PathLike)):
            path = Path(data)
            shown = printable(str(path))
            if not path.exists():
                raise CacheNotFoundError(f"table file not found: {shown}")
            readers = {".parquet": pl.read_parquet, ".csv": pl.read_csv}
            if path.suffix.lower() not in readers:
                raise InvalidInputError(f"{shown}: register() reads .parquet and .csv files")
            # polars takes only UTF-8 paths: another is read here, as the bytes it names
            source = path if shown == str(path) else path.read_bytes()
            data = readers[path.suffix.lower()](source)
        stream, nulls = arrow_stream(data, "register()")
        self._native.register(name, stream, nulls=nulls)

    def score_log(self, name: str = "loss", run: str | None = None, *, flush_rows: int = 1 << 16):
        """A per-sample score log of this dataset, written as run ``run``.

        Ranks and workers of a training run record one value per drawn sample
        (loss, gradient norm, correctness) keyed by ``(run, epoch, draw
        position)``, without coordinating::

            log = ds.score_log("loss", run="exp1")
            log.append_batch(batch, losses, epoch=epoch)  # a Batch knows its draws
            log.flush()  # before saving a checkpoint
            log.register("scores")  # SQL table `scores`, for the sql/ recipes
            ds.apply_sql("loss_ema_weights", alpha=0.5)

        ``name`` follows the rule of source names: 1-200 characters from
        ``[A-Za-z0-9._-]``, not starting with ``.``, ``_`` or ``-``. ``run``
        (default ``"default"``) is the loader's ``run=`` rule, the same run:
        1-128 characters from ``[A-Za-z0-9._-]``, not starting with ``.``.
        Rows are buffered in the process and written as one Arrow IPC segment
        per flush (by itself every ``flush_rows`` rows)
        under ``<snapshot dir>/_scores/<name>/<run>/``. Reading keeps one row
        per key, the newest, so a step replayed after a resume replaces its
        rows; a killed process loses only the rows it had not flushed. A
        resumed run must use the same ``run``. See :mod:`datasetrt.scores`.

        Logs need a local dataset for now: for a remote (``s3://``) dataset
        this raises :class:`InvalidInputError`.
        """
        from .scores import ScoreLog

        return ScoreLog(self, name, run, flush_rows=flush_rows)

    def datafusion_table(self) -> Any:
        """The active population for the ``datafusion`` Python package (zero-copy, FFI)::

        ctx = datafusion.SessionContext()
        ctx.register_table("metadata", ds.datafusion_table())

        An extension built without the feature ``ffi`` (``make demo`` builds
        one) raises ``ImportError``.
        """
        if not hasattr(self._native, "datafusion_table"):
            raise ImportError(
                "this build of datasetrt has no DataFusion interop (the extension was built "
                "without its feature `ffi`, as `make demo` does): `make develop` builds it"
            )
        return self._native.datafusion_table()

    def _sql_engine(self) -> _native.Dataset:
        """The native dataset that runs this one's SQL: its own, or (opened
        with ``workers``) the companion module's, on the same snapshot."""
        if not self._workers:
            return self._native
        if self._coordinator is None:
            from .worker import distributed_module

            self._coordinator = distributed_module().Dataset(
                self._paths,
                self._snapshot_dir,
                self._remote["storage_options"],
                self._remote["cache_dir"],
                self._remote["cache_bytes"],
                None,
                self._workers,
                self._memory_limit,
            )
        if self._coordinator.version != self.version:
            self._coordinator.pin(self.version)
        return self._coordinator

    def _commit_sql(self, query: str, note: str | None, force: bool) -> int:
        engine: _native.Dataset = self._sql_engine()
        number = engine.select(query, note=note, force=bool(force))
        if engine is not self._native:  # committed by the coordinator: follow it
            self._native.pin(number)
        return number

    def sql(self, query: str) -> pl.DataFrame:
        """Run SQL over table ``metadata`` (the active population); returns polars.

        Opened with ``workers=[url, ...]`` (see :class:`datasetrt.Worker`),
        the scans of ``metadata`` and the stages above them run on those
        workers; payloads are still read here.
        """
        check_text(query, "the query")
        engine: _native.Dataset = self._sql_engine()
        return pl.DataFrame(engine.sql(query))

    def select(self, query: str, *, force: bool = False) -> int:
        """Make the result of ``query`` the population; returns the snapshot number.

        The query runs on the active snapshot. If another writer moved the
        head meanwhile, it runs again on the new head (up to three times)
        before :class:`ConflictError` is raised; ``force=True`` commits the
        first result whatever the head.

        A query without an ORDER BY of its own stores its rows sorted by
        ``cache_id``, ``sample_id`` and then its other columns (a join's rows
        come in an order that varies from run to run, and the order of the
        rows decides the draws): the same query over the same inputs stores
        the same snapshot. Give an ORDER BY to store another order.

        Opened with ``workers=[url, ...]``, each worker checks and stores
        the partitions of the rows it computes (in the snapshot directory,
        which it must be able to write) and this process commits them: the
        result's rows never pass through here.
        """
        return self._commit_sql(check_text(query, "the query"), None, force)

    def apply_sql(self, recipe: str | os.PathLike[str], **params: Any) -> int:
        """Run a SQL recipe (a name from ``sql/`` or a ``.sql`` path) with
        ``:name`` parameters and make its result the population.

        A recipe that weights by table ``scores`` (a registered score log)
        and fails because that table has no row for the population (it is
        empty, or names no sample of it) says so.

        >>> ds.apply_sql("dev_subset", seed=7, fraction=0.1)  # doctest: +SKIP
        """
        from . import recipes

        label, text = recipes.load(recipe)
        query = recipes.render(text, params)
        try:
            return self._commit_sql(query, f"apply_sql {printable(label)} {params}", False)
        except InvalidInputError as exc:
            unscored = recipes.unscored(self, label, text)
            if unscored is None:
                raise
            raise unscored from exc

    def pin(self, version: int | str) -> int:
        """Read snapshot ``version`` (a number or a tag) as the active one in
        this process only; returns its number.

        Unlike :meth:`checkout`, the head does not move: other processes, and
        this one after :meth:`refresh`, see the head as before. Copies of a
        dataset sent to workers are pinned this way to their parent's snapshot.
        """
        return self._native.pin(self.resolve(version))

    def checkout(self, version: int | str) -> int:
        """Make an earlier snapshot (a number or a tag) the population again.

        The head moves to it, so every process that opens or refreshes the
        dataset sees it (a rollback: no snapshot is deleted, and the next
        update is committed on top of it).
        """
        version = self.resolve(version)
        return self._native.checkout(check_version(version))

    def resolve(self, version: int | str, name: str = "snapshot") -> int:
        """The snapshot number ``version`` names: a number (checked) or a tag."""
        if isinstance(version, str):
            tags = self._native.tags()
            if version not in tags:
                raise InvalidInputError(f"no tag {version!r}; tags: {sorted(tags)}")
            return tags[version]
        return check_version(version, name)

    def tag(self, name: str, version: int | None = None) -> None:
        """Name a snapshot (default: the active one); tagged snapshots survive cleanup."""
        check_text(name, "a tag")
        self._native.tag(name, None if version is None else check_version(version))

    def tags(self) -> dict[str, int]:
        """Every tag and the snapshot number it names."""
        return dict(self._native.tags())

    def cleanup(self, keep: int = 10, *, dry_run: bool = False) -> list[int]:
        """Delete snapshots except the newest ``keep``, the tagged ones, those
        a run's schedule names (``loader(run=...)``: ``exposures`` answers for
        them until ``runs/<run>`` is removed), the head and the active one,
        and the column files no remaining snapshot
        uses. Returns the deleted snapshot numbers (with ``dry_run``: the ones
        it would delete now, deleting nothing). Commits of other processes
        wait while it runs (they share the dataset's commit lock)."""
        keep = check_int(keep, "keep", 0, 1 << 32)
        if not dry_run:
            self._frame = None
        return self._native.cleanup(keep, bool(dry_run))

    def diff(self, a: int | str, b: int | str) -> pl.DataFrame:
        """How population ``b`` differs from ``a``, per stored sample.

        One row per ``(cache_id, sample_id)`` that changed, with its number of
        rows and total weight in each snapshot and ``change``: ``"added"``
        (more rows in ``b``), ``"removed"`` (fewer), or ``"reweighted"`` (as
        many rows, another total weight).
        """
        a, b = self.resolve(a, "a"), self.resolve(b, "b")

        def per_sample(version: int) -> pl.DataFrame:
            frame = self.get_metadata(version)
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
        the tags, every snapshot with every column file it names, and every
        segment of the score logs (each must match the CRC-32C its name is
        sealed with and be a whole Arrow IPC file of a segment's columns).
        One row per problem: ``kind`` (the exception class it
        would raise), ``path`` and ``message``; an empty frame means
        everything is intact. Unlike a read, it does not stop at the first
        problem. A path that is not UTF-8 is shown with those bytes escaped
        (``\\xff``).
        """
        from .scores import verify_logs

        with Progress("verifying", enabled=progress) as bar:
            problems = self._native.verify(bar.set if bar.enabled else None)
        problems = [*problems, *verify_logs(self)]
        schema = {"kind": pl.String, "path": pl.String, "message": pl.String}
        rows = [
            {
                "kind": p["kind"],
                "path": None if p["path"] is None else printable(os.fspath(p["path"])),
                "message": printable(p["message"]),
            }
            for p in problems
        ]
        return pl.DataFrame(rows, schema=schema)

    # -- looking at the population ------------------------------------------------
    def to_html(self, by: str | None = None) -> str:
        """The notebook view: caches, rows, columns, the active snapshot, and the
        class shares before and after weights by ``by`` (default: a column
        named ``label``, ``class``, ``target``... when there is one)."""
        return _html.dataset(self, by)

    _repr_html_ = HtmlRepr._repr_html_
    _repr_mimebundle_ = HtmlRepr._repr_mimebundle_

    def population(
        self,
        by: str | list[str] | None = None,
        *,
        version: int | str | None = None,
        sampling: str = "replacement",
        epoch_len: int | None = None,
        seed: int = 0,
        where: str | pl.Expr | None = None,
    ) -> pl.DataFrame:
        """What a run will draw, per value of ``by`` (one row without ``by``,
        or with ``by=[]``).

        Columns: ``rows`` and ``row_share``; ``weight_sum`` and
        ``draw_share``, the expected share of the draws; ``draws_per_epoch``
        (for ``sampling`` and ``epoch_len`` as :meth:`loader` takes them);
        ``ess``, Kish's effective sample size ``(Σw)² / Σw²``;
        ``max_weight_ratio``, the largest weight over the smallest positive
        one; and ``top_share``, the share of the draws that land on the
        heaviest 1 % of the rows (at least one row): how far weights have
        collapsed. ``where`` (a SQL condition over the metadata columns, as
        polars' ``pl.sql_expr`` reads it, or a polars expression) adds
        ``where_share``, the share of the draws on the rows it holds for,
        e.g. ``where="il_loss > 2"`` or a known ``flipped`` column: print it
        each epoch of a reweighting loop. ``version`` (a number or a tag)
        reports on another snapshot.

        A snapshot with a mixture (:meth:`set_mixture`) is reported by its
        column when ``by`` is left out. ``draw_share`` is then each group's
        share of the mixture, split among the group's rows by their weights
        (by any column), and ``ess`` and ``max_weight_ratio`` are of those
        per-row shares. A report by the mixture's column adds
        ``target_share`` (null for a value without a share: never drawn) and
        ``delivered_share``, the group's share of the first
        ``min(epoch length, 1,000,000)`` draws of epoch 0 for ``seed``, as
        the loader delivers them (within one draw of the target's).

        >>> ds.population("label")  # doctest: +SKIP
        """
        from .population import population

        return population(
            self,
            by,
            version=version,
            sampling=sampling,
            epoch_len=epoch_len,
            seed=check_seed(seed),
            where=where,
        )

    def plot_population(
        self,
        by: str = "label",
        *,
        compare: int | str | None = None,
        version: int | str | None = None,
    ) -> Any:
        """A matplotlib figure: the class shares by ``by`` and the weight histogram.

        Without ``compare`` the shares of rows and of draws (before and after
        weights, and the mixture if the snapshot has one) of the active
        snapshot; with ``compare`` (a snapshot number or tag) the shares of
        draws of both, side by side. Needs matplotlib
        (``pip install 'datasetrt[plot]'``); a notebook shows the figure,
        elsewhere ``fig.savefig("population.png")``.
        """
        from .population import plot_population

        return plot_population(self, by, compare=compare, version=version)

    def plot_mixture(self, ax: Any = None) -> Any:
        """A matplotlib figure: the mixture's target shares over the run.

        x is the snapshot number (every committed snapshot on disk, oldest
        first), one step line per group with the share the snapshot's
        mixture sets (0 for a group a mixture of its column leaves out: not
        drawn). A snapshot without a mixture (or with one by another column)
        is a gap in the line: it draws by weights alone
        (:meth:`population` reports those shares). Draws into ``ax`` when
        given; returns the figure. Needs matplotlib
        (``pip install 'datasetrt[plot]'``).
        """
        from .population import plot_mixture

        return plot_mixture(self, ax)

    # -- reading -----------------------------------------------------------------
    def get_item(self, cache_id: int, sample_id: int) -> Sample:
        """Read one stored sample (checksum verified)."""
        cache_id = check_int(cache_id, "cache_id", -(1 << 63), (1 << 63) - 1)
        sample_id = check_int(sample_id, "sample_id", -(1 << 63), (1 << 63) - 1)
        version = self.version
        data, row = self._native.get_item(cache_id, sample_id)
        return Sample(data, cache_id, sample_id, row, _Frame(lambda: self.get_metadata(version)))

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
        prefetch_bytes: int | None = None,
        prefetch_batches: int | None = None,
        run: str | None = None,
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
        ``threads`` concurrent readers (default: the cores) while Python
        works on the previous batch, with at most ``prefetch_bytes`` of
        decoded payloads (default 64 MiB) and ``prefetch_batches`` batches
        (default 8) buffered. The loader keeps the snapshot that was active
        when it was created. The options become one ``_native.LoaderSpec``,
        which holds the defaults and checks every value once
        (``loader.spec``).

        ``run`` (a name: letters, digits, ``.``, ``_``, ``-``) makes the loader
        follow the head *within* the epoch: a change committed meanwhile (a
        new mixture, new weights) takes effect at the next block boundary
        no reader of the run has drawn past, the same for every rank and
        worker, and is written in the run's schedule beside the snapshots.
        The state names the run, so resume replays the schedule exactly and
        :meth:`exposures` recomputes what was drawn. Under a mixture each
        group continues its own sequence across a change of shares (no row
        of a group repeats or is skipped because the shares moved). Use one
        name per run: a name's schedule is replayed by every loader of it.
        """
        spec = self.loader_spec(
            batch_size,
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
            run=run,
        )
        return Loader(self, spec)

    def loader_spec(self, batch_size: int = 64, **options: Any) -> _native.LoaderSpec:
        """The request :meth:`loader` makes of its options (the same names and
        defaults, ``rank`` and ``world_size`` filled in as it says), checked
        once: what :meth:`to_torch` and :meth:`to_ray` hold and pass on.
        ``version`` (a number or a tag) reads that snapshot instead of the
        active one."""
        rank, world_size = distributed_defaults(
            options.pop("rank", None), options.pop("world_size", None)
        )
        if options.get("version") is not None:
            options["version"] = self.resolve(options["version"])
        return _native.LoaderSpec(
            batch_size=batch_size, rank=rank, world_size=world_size, **options
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
        version: int | str | None = None,
    ) -> pl.Series:
        """Rows (of :meth:`get_metadata`) of draws ``start .. start + count`` of an epoch.

        The global sequence the loaders deliver, without reading a payload:
        ``ds.get_metadata()[ds.draws(7)]`` is the epoch's population in draw order.
        ``version`` (a number or a tag) draws from that snapshot instead of
        the active one. The first call for a snapshot and mode builds and
        stores its draw tables, once for the host.
        """
        if epoch_len is not None:
            epoch_len = check_int(epoch_len, "epoch_len", 1)
        check_text(sampling, "sampling")
        number = None if version is None else self.resolve(version)
        if count is None:  # one epoch
            count = self.epoch_len(sampling=sampling, epoch_len=epoch_len, version=number)
        table = self._native.draws(
            check_seed(seed),
            check_epoch(epoch),
            check_int(start, "start", 0, U64 - 1 - MAX_DRAWS),
            check_int(count, "count", 0, MAX_DRAWS),
            sampling,
            epoch_len,
            version=number,
        )
        return pl.DataFrame(table)["row"]

    def epoch_len(
        self,
        *,
        sampling: str = "replacement",
        epoch_len: int | None = None,
        version: int | str | None = None,
    ) -> int:
        """How many draws one epoch has, as a loader with these options draws
        it from the active snapshot (or ``version``, a number or a tag); see
        :meth:`loader` for how ``epoch_len`` defaults."""
        if epoch_len is not None:
            epoch_len = check_int(epoch_len, "epoch_len", 1)
        check_text(sampling, "sampling")
        number = None if version is None else self.resolve(version)
        return self._native.epoch_len(sampling, epoch_len, number)

    # -- the engine's face for loaders and adapters ----------------------------
    def plan(self, spec: _native.LoaderSpec) -> _native.DrawPlan:
        """The engine's plan of the draws a ``LoaderSpec`` names: the epoch's
        length, its blocks and the loader state after each, with no payload
        read. The torch and Ray adapters use it to split an epoch."""
        return self._native.plan(spec)

    def start(self, spec: _native.LoaderSpec) -> _native.Loader:
        """The engine's loader for a ``LoaderSpec``: its batches in draw
        order (what :class:`datasetrt.Loader` and the Ray adapter wrap)."""
        return self._native.start(spec)

    def to_torch(
        self,
        batch_size: int = 64,
        *,
        seed: int,
        epoch: int = 0,
        transform: Any = None,
        follow: str | None = None,
        **options: Any,
    ):
        """A ``torch.utils.data.IterableDataset`` of batches; see :mod:`datasetrt.torch`.

        ``options`` are those of :meth:`loader`; ``transform`` turns a
        :class:`Batch` into what the DataLoader yields (default: a dict of
        tensors), and ``follow="head"`` draws each epoch from the head."""
        from .torch import TorchDataset, default_output

        # a resume state may be a StatefulDataLoader's: load_state_dict reads every kind
        resume = options.pop("resume", None)
        spec = self.loader_spec(batch_size, seed=seed, epoch=epoch, **options)
        tds = TorchDataset(self, spec, transform=transform or default_output, follow=follow)
        if resume is not None:
            tds.load_state_dict(resume)
        return tds

    def to_ray(
        self,
        batch_size: int = 64,
        *,
        seed: int,
        epoch: int = 0,
        override_num_blocks: int | None = None,
        **options: Any,
    ):
        """A ``ray.data.Dataset`` of one epoch's draws, in the order of
        :meth:`loader` on one process; see :mod:`datasetrt.ray`.

        ``options`` are those of :meth:`loader` for one process (rank 0 of
        1, no ``resume`` or ``run``); ``threads`` defaults to 1, as Ray
        counts a read task as one CPU."""
        from .ray import read_draws

        options.setdefault("threads", 1)
        options.setdefault("rank", 0)
        options.setdefault("world_size", 1)
        spec = self.loader_spec(batch_size, seed=seed, epoch=epoch, **options)
        return read_draws(self, spec, override_num_blocks=override_num_blocks)
