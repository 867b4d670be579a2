"""Per-sample score logs: a value per drawn sample (loss, gradient norm,
correctness) recorded by every rank and worker of a training run, kept by the
dataset as a table for SQL and Polars.

>>> log = ds.score_log("loss", run="exp1")  # doctest: +SKIP
>>> for batch in ds.loader(64, seed=7, epoch=epoch):  # doctest: +SKIP
...     losses = train_step(batch)  # one value per sample
...     log.append_batch(batch, losses, epoch=epoch)
>>> log.flush()  # at a checkpoint, before saving the loader state  # doctest: +SKIP
>>> log.register("scores")  # doctest: +SKIP
>>> ds.apply_sql("loss_ema_weights", alpha=0.5)  # doctest: +SKIP

On disk a log is a folder of Arrow IPC files (uncompressed, written by the
engine: ``datasetrt::catalog::scores``) beside the dataset's metadata
snapshots::

    <snapshot dir>/_scores/<log name>/<run>/<written_ns>-<seq>-r<rank>-w<worker>-p<pid>-c<crc>.arrow

Each file (a *segment*) holds the rows one process wrote at once, with
columns ``epoch`` (UInt64), ``position`` (UInt64), ``cache_id``, ``sample_id``
(Int64), ``value`` (Float64) and ``rank`` (UInt32). Its name starts with
``written_ns``, the time of the write in nanoseconds (20 digits, so names sort
by it), and the writer's segment number. Processes never write the same file,
so any number of ranks and workers append without coordinating. (The time is
in the name, not in a column: the disk writes per row are the cost of
logging, 44 bytes a row.)

Guarantees:

- **Exactly once.** A row's key is ``(run, epoch, position)``: the run, the
  epoch and the global draw position of the sample (``Batch.draws``). Reading
  keeps, for each key, the row of the newest segment (the last file name:
  the largest ``written_ns``, then the writer's segment number, rank, worker
  and pid), and within one segment the row appended last, so a step replayed
  after a resume replaces its rows instead of counting twice. Another
  reader of the files (DuckDB, a glob in polars) gets the same table by
  keeping the row of the last file name per key. A process's segments get
  increasing ``written_ns`` even if its clock steps back; across processes
  the order is the wall clock, so a resumed run must start after the crashed
  one's last flush (it does, unless clocks disagree by more than the
  restart takes).
- **Crash-safe.** A segment is written to a temporary name, fsynced and
  renamed, and the folder fsynced: a reader sees a whole segment or none,
  and a killed process loses only the rows it had not flushed. Temporary
  files of dead processes on this machine are removed by the next process
  that flushes to the same run.
- **Checked input.** A rejected :meth:`ScoreLog.append` raises
  :class:`InvalidInputError` and buffers nothing.
- **Checked segments.** Each segment is sealed by its name: ``<crc>`` is
  the CRC-32C of the whole file (8 hex digits). A segment whose bytes do
  not match it (a flipped bit in a logged loss), or that is not a whole
  Arrow IPC file of the segment columns (cut short, say), makes
  :meth:`ScoreLog.frame` raise :class:`CorruptCacheError` naming it, never
  a value that becomes a weight; :meth:`Dataset.verify` reads every
  segment of every log. (Segments named without ``-c<crc>``, written
  before seals, are read with the structural checks alone.)
"""

from __future__ import annotations

import array
import math
import os
import sys
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from . import _native
from ._state import U64, check_epoch, check_int, check_text, distributed_defaults
from .exceptions import (
    DatasetRTError,
    InvalidInputError,
    StorageError,
)

if TYPE_CHECKING:
    from .dataset import Dataset

#: Folder of the score logs inside the dataset's snapshot directory.
SCORES_DIR = "_scores"

#: Rows buffered in memory before :meth:`ScoreLog.append` writes a segment by itself.
FLUSH_ROWS = 1 << 16

#: The columns of :meth:`ScoreLog.frame` (and of the registered SQL table).
SCHEMA = {
    "run": pl.String,
    "epoch": pl.UInt64,
    "position": pl.UInt64,
    "cache_id": pl.Int64,
    "sample_id": pl.Int64,
    "value": pl.Float64,
    "rank": pl.UInt32,
}
KEY = ["run", "epoch", "position"]

_I64 = 1 << 63
_TEMP_PREFIX = ".tmp-"


def check_log_name(name: object) -> str:
    """``name`` if it can name a score log (the engine's rule of source
    names: they become directory names too)."""
    if isinstance(name, str):
        check_text(name, "the score log name")
    try:
        if not isinstance(name, str):
            raise InvalidInputError("not a str")
        _native.check_source_name(name)
    except InvalidInputError:
        raise InvalidInputError(
            f"invalid score log name {name!r}: use 1-200 characters from [A-Za-z0-9._-], "
            f"not starting with '.', '_' or '-'"
        ) from None
    return name


def check_run(run: object) -> str:
    """``run`` if it can name a training run: the engine's one rule for the
    loader's ``run=`` and a score log's run (both name a directory)."""
    if not isinstance(run, str):
        raise InvalidInputError(f"a run's name is a str, not {type(run).__name__}")
    check_text(run, "the run name")
    _native.check_run(run)
    return run


def _is_run(name: str) -> bool:
    try:
        check_run(name)
    except InvalidInputError:
        return False
    return True


def log_root(dataset: Dataset) -> Path:
    """``<snapshot dir>/_scores`` of a local dataset."""
    remote = [p for p in dataset.paths if "://" in p]
    if remote:
        raise InvalidInputError(
            f"score logs need a local dataset for now; {remote[0]} is remote "
            f"(log to a local dataset, or write the values to a file and register() it)"
        )
    return dataset.snapshot_path.parent / SCORES_DIR


class ScoreLog:
    """One named log of per-sample values, written as one run; see :mod:`datasetrt.scores`.

    Get one with :meth:`Dataset.score_log`. Rows are buffered in this
    process; once ``flush_rows`` rows are buffered a background thread
    writes them as one segment (an append never waits for the disk).
    :meth:`flush` writes every row appended so far and returns when they are
    durable; so do :meth:`close` (and leaving a ``with`` block), the log's
    garbage collection and interpreter exit. A process that is killed loses
    the rows appended since its last flush: flush before saving a
    checkpoint, and a resume replays exactly the steps whose rows may be
    missing (their rows then replace any that did land).

    A log pickles as (dataset, name, run): a copy sent to another process
    starts with an empty buffer. After ``fork`` the child drops the rows the
    parent had buffered (the parent writes them). A process that ends with
    ``os._exit`` (a ``fork``-started multiprocessing child, such as a
    DataLoader worker) runs no exit hooks: flush or close its logs first.
    """

    def __init__(
        self,
        dataset: Dataset,
        name: str = "loss",
        run: str | None = None,
        *,
        flush_rows: int = FLUSH_ROWS,
    ):
        self.name = check_log_name(name)
        self.run = check_run("default" if run is None else run)
        self.flush_rows = check_int(flush_rows, "flush_rows", 1, 1 << 30)
        self.dataset = dataset
        self.path = log_root(dataset) / self.name
        self._writer = _Writer(self.path / self.run, self.flush_rows)
        # (run, alpha) -> the engine's incrementally refreshed state
        self._states: dict[tuple[str, float], Any] = {}
        self._finalizer = weakref.finalize(self, self._writer.flush)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_reopen, (self.dataset, self.name, self.run, self.flush_rows))

    def __repr__(self) -> str:
        return (
            f"<datasetrt.ScoreLog {self.name!r} run {self.run!r}, "
            f"{self._writer.rows} rows buffered>"
        )

    # -- writing -----------------------------------------------------------------
    def append(
        self,
        cache_id: Any,
        sample_id: Any,
        values: Any,
        *,
        epoch: int,
        position: int | Any,
    ) -> None:
        """Buffer one row per sample: ``(epoch, position) -> (cache_id, sample_id, value)``.

        ``cache_id``, ``sample_id`` and ``values`` are equally long lists,
        tuples, numpy arrays, polars Series or torch tensors (any device;
        torch is never imported here). Identities are integers; values are
        finite numbers (bools count as 0/1). ``position`` is the global draw
        position of the first row (the rows then have consecutive positions)
        or one position per row: the ``draw`` a loader batch carries
        (:attr:`Batch.draws`). A row replaces any earlier row of the same
        ``(run, epoch, position)``. Anything else raises
        :class:`InvalidInputError` and buffers nothing. Identities are not
        looked up: a row naming no sample of the dataset stays in the log,
        and joins with ``metadata`` leave it out.
        """
        epoch = check_epoch(epoch)
        cids = _ints(cache_id, "cache_id")
        sids = _ints(sample_id, "sample_id")
        vals = _floats(values, "values")
        n = len(cids)
        if len(sids) != n or len(vals) != n:
            raise InvalidInputError(
                f"cache_id, sample_id and values must be equally long, "
                f"got {n}, {len(sids)} and {len(vals)}"
            )
        if isinstance(position, int):  # a bool is refused here
            positions: int | array.array = check_int(position, "position", 0, U64 - max(n, 1))
        else:
            positions = _ints(position, "position", unsigned=True)
            if len(positions) != n:
                raise InvalidInputError(
                    f"position must be an int or one position per row "
                    f"({n} rows), got {len(positions)} positions"
                )
        if n:
            first, each = (positions, None) if isinstance(positions, int) else (0, positions)
            self._writer.append(
                epoch,
                first,
                None if each is None else each.tobytes(),
                cids.tobytes(),
                sids.tobytes(),
                vals.tobytes(),
            )

    def append_batch(
        self, batch: Any, values: Any, *, epoch: int, position: int | Any | None = None
    ) -> None:
        """:meth:`append` the rows of one batch: a :class:`datasetrt.Batch` (its
        identities and draw positions) or a dict with ``cache_id`` and
        ``sample_id`` (``datasetrt.torch.default_output``) and, if present,
        ``draw`` (``default_output`` carries it). ``position`` is needed
        when the batch does not carry its draws (a ``transform`` of your own
        that leaves ``draw`` out).
        """
        native = getattr(batch, "_native", None)
        if position is None and type(epoch) is int and type(native) is _native.Batch:
            # the common case: the engine's columns, and values as a list,
            # a numpy array or a tensor (on any device), passed as one buffer
            try:
                if type(values) is list:
                    return self._writer.append_batch(native, values, epoch)
                raw = _float64_bytes(values)
                if raw is not None:
                    return self._writer.append_batch_values(native, raw, epoch)
            except (TypeError, OverflowError, InvalidInputError):
                pass  # the checked path below says what is wrong
        if isinstance(batch, dict):
            cids, sids, draws = batch["cache_id"], batch["sample_id"], batch.get("draw")
        else:
            cids, sids, draws = batch.cache_id, batch.sample_id, getattr(batch, "draws", None)
        if position is None:
            if draws is None:
                raise InvalidInputError(
                    "this batch does not carry its draw positions: pass position="
                )
            position = draws
        self.append(cids, sids, values, epoch=epoch, position=position)

    def flush(self) -> int:
        """Write the rows buffered in this process as one segment (crash-safe);
        returns how many rows were written (0: nothing was buffered).

        When a segment cannot be written (disk full, permissions) it raises
        :class:`StorageError` and keeps the rows for the next flush. A
        background write that fails is reported by the next :meth:`append`
        (which then buffers nothing) or :meth:`flush`."""
        return self._writer.flush()

    def close(self) -> None:
        """Flush, and refuse further appends."""
        self._finalizer()
        self._writer.close()

    def __enter__(self) -> ScoreLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading -----------------------------------------------------------------
    def runs(self) -> list[str]:
        """The runs this log holds segments of, sorted."""
        if not self.path.is_dir():
            return []
        return sorted(p.name for p in self.path.iterdir() if p.is_dir() and _is_run(p.name))

    def frame(self, run: str | None = None) -> pl.DataFrame:
        """The log as a polars DataFrame, one row per ``(run, epoch, position)``.

        Columns: ``run``, ``epoch``, ``position``, ``cache_id``,
        ``sample_id``, ``value``, ``rank`` (the writer's), in the order the
        rows were flushed (runs by name). Each key keeps the row of the
        newest segment (see the module). It
        reads the segments every process has flushed up to now, of ``run``
        (a name) or of every run (``None``); this process's buffered rows are
        flushed first.
        """
        self.flush()
        runs = self.runs() if run is None else [check_run(run)]
        parts = [_newest(self.path / name, name) for name in runs]
        parts = [p for p in parts if p is not None]
        return pl.concat(parts) if parts else pl.DataFrame(schema=SCHEMA)

    def state(self, *, alpha: float = 0.5, run: str | None = None) -> pl.DataFrame:
        """One row per sample the run scored (``run``, default this log's):
        ``cache_id``, ``sample_id``, ``count`` (rows logged), ``first_epoch``,
        ``last_epoch``, ``last_loss`` (the mean of its rows in its newest
        epoch) and ``ema_loss`` (the moving average of its per-epoch means,
        newest epoch weighted ``alpha``: ``ema = loss`` at the first epoch,
        then ``alpha * loss + (1 - alpha) * ema``).

        Kept by the engine and refreshed incrementally: each call reads only
        the segments flushed since the last call (this process's buffered
        rows are flushed first), so a call per epoch costs the epoch's rows,
        not the log's. The answer is always that of the whole log read at
        once (a replayed step, a late segment of an older epoch: it folds
        the run again).
        """
        state: _native.ScoreState = self._state(alpha, run)
        return pl.DataFrame(state.refresh())

    def _state(self, alpha: float, run: str | None) -> _native.ScoreState:
        """The engine's state of ``run`` (kept per run and ``alpha``), after
        this process's buffered rows are flushed."""
        self.flush()
        run = self.run if run is None else check_run(run)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
            raise InvalidInputError(f"alpha must be a number in (0, 1], not {alpha!r}")
        key = (run, float(alpha))
        state = self._states.get(key)
        if state is None:
            state = _native.ScoreState(os.fspath(self.path / run), float(alpha))
            self._states[key] = state
        return state

    def reweight(
        self,
        *,
        reference: str | None = None,
        shape: str = "rank",
        floor: float = 0.1,
        cap: float = 2.0,
        anneal: float = 0.0,
        alpha: float = 0.5,
        run: str | None = None,
    ) -> int:
        """Make the run's losses the weights of the dataset's population
        (its active snapshot); returns the new snapshot number.

        Each row's score is its ``ema_loss`` (see :meth:`state`), minus its
        metadata column ``reference`` when one is named: with a reference
        loss from a model trained on clean held-out data (``il_loss``), the
        score is the *reducible* loss, which draws what the model can still
        learn instead of label noise (docs/training.md has the figures).
        The score is shaped so the weights cannot collapse onto a few rows:
        ``shape`` ``"rank"`` (the score's percent rank), ``"linear"`` (the
        score clipped at 0) or ``"threshold"`` (1 where the score is above 0,
        or above the mean loss without a reference), then scaled to mean 1
        with every weight between ``floor`` and ``cap`` times the mean
        weight, and mixed toward uniform by ``anneal`` (1: uniform). A row
        the run has not scored, or whose reference is null, weighs the mean.

        The same weights as ``ds.apply_sql("reducible_loss_weights", ...)``
        (with a reference named ``il_loss``) or ``"loss_ema_weights_shaped"``
        (without), which run the same rule in SQL (``drt_shape_weights``),
        computed natively: only the segments flushed since the last call are
        read, and no query is planned. Like :meth:`Dataset.update_metadata`,
        it raises :class:`ConflictError` if another writer moved the head
        since the active snapshot was read.
        """
        state: _native.ScoreState = self._state(alpha, run)
        if reference is not None:
            check_text(reference, "reference")
        floor, cap, anneal = (
            _number(value, name)
            for value, name in ((floor, "floor"), (cap, "cap"), (anneal, "anneal"))
        )
        note = f"reweight by {self.name}/{self.run if run is None else run}: shape={shape!r}, " + (
            f"reference={reference!r}, floor={floor}, cap={cap}, anneal={anneal}, alpha={alpha}"
        )
        return state.reweight(
            self.dataset._native, str(shape), floor, cap, anneal, reference=reference, note=note
        )

    def register_state(
        self, table: str = "score_state", *, alpha: float = 0.5, run: str | None = None
    ) -> pl.DataFrame:
        """Make :meth:`state` a SQL table of the dataset (default
        ``score_state``, what the shaped score recipes read); returns it."""
        frame = self.state(alpha=alpha, run=run)
        self.dataset.register(table, frame)
        return frame

    def register(self, table: str | None = None, *, run: str | None = None) -> pl.DataFrame:
        """Make :meth:`frame` (of ``run``, or of every run) a SQL table of the
        dataset, named ``table`` (default: the log's name); returns that frame.

        The table is a snapshot taken now: rows flushed later appear in SQL
        only when ``register`` is called again. The ``sql/`` recipes read a
        table named ``scores``: ``log.register("scores")``. A log name that is
        not a plain identifier is quoted in SQL (``FROM "grad-norm"``).
        """
        frame = self.frame(run)
        self.dataset.register(self.name if table is None else table, frame)
        return frame


def _number(value: Any, name: str) -> float:
    """``value`` as a float, or :class:`InvalidInputError` naming ``name``
    (its range is the engine's to check)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _invalid(f"{name} must be a number, not {value!r}", name, value)
    return float(value)


def _newest(directory: Path, run: str) -> pl.DataFrame | None:
    """The rows of one run's segments, the newest of each (epoch, position):
    read and checked by the engine (``catalog::scores::read_run``)."""
    table = _native.read_score_run(os.fspath(directory))
    if table is None:
        return None
    rows = pl.DataFrame(table)
    return rows.with_columns(run=pl.lit(run, pl.String)).select(list(SCHEMA))


def verify_logs(dataset: Dataset) -> list[dict[str, str]]:
    """A problem (``kind``, ``path``, ``message``, as :meth:`Dataset.verify`
    reports them) for each segment of each run of each score log of
    ``dataset`` that the engine's reader refuses. None for a remote
    dataset (it keeps no logs)."""
    if dataset.is_remote:
        return []
    root = log_root(dataset)
    if not root.is_dir():
        return []
    problems = []
    for log in sorted(p for p in root.iterdir() if p.is_dir()):
        for run in sorted(p for p in log.iterdir() if p.is_dir()):
            for segment in _native.score_segments(os.fspath(run)):
                try:
                    _native.check_score_segment(segment)
                except DatasetRTError as exc:
                    problems.append(
                        {"kind": type(exc).__name__, "path": str(segment), "message": str(exc)}
                    )
    return problems


def _reopen(dataset: Dataset, name: str, run: str, flush_rows: int) -> ScoreLog:
    return ScoreLog(dataset, name, run, flush_rows=flush_rows)


# -- input conversion: exact types, no numpy needed ------------------------------
def _plain(values: Any) -> Any:
    """A torch tensor (on any device) as numpy or a list; anything else as is."""
    if hasattr(values, "detach") and hasattr(values, "cpu"):  # torch, never imported here
        values = values.detach().cpu()
        try:
            return values.numpy()
        except (RuntimeError, TypeError):  # bfloat16, or torch built without numpy
            return values.tolist()
    if isinstance(values, pl.Series):
        return values.to_list() if "numpy" not in sys.modules else values.to_numpy()
    return values


def _float64_bytes(values: Any) -> bytes | None:
    """A one-dimensional numpy array or torch tensor of numbers as the bytes
    of native float64s (a CPU tensor is read without a copy first); ``None``
    for anything else (the checked path converts and explains)."""
    values = _plain(values)
    dtype = getattr(values, "dtype", None)
    if dtype is None or getattr(values, "ndim", None) != 1 or dtype.kind not in "fiub":
        return None
    return values.astype("=f8", copy=False).tobytes()


def _ints(values: Any, column: str, *, unsigned: bool = False) -> array.array:
    """An array of int64 (``unsigned``: non-negative, uint64) of a 1-d input."""
    code = "Q" if unsigned else "q"
    if type(values) is list:  # the common case, first: a batch's lists
        try:
            return array.array(code, values)
        except (TypeError, OverflowError):
            pass  # explained below
    values = _plain(values)
    dtype = _numpy_dtype(values, column, "iu", "integers")
    if dtype is not None:
        if values.size and (
            (unsigned and dtype.kind == "i" and values.min() < 0)
            or (not unsigned and dtype.kind == "u" and values.max() >= _I64)
        ):
            bad = int(values.min() if unsigned else values.max())
            raise _invalid(f"{column} value {bad} is out of range", column, bad)
        return array.array(code, values.astype("<u8" if unsigned else "<i8").tobytes())
    if isinstance(values, (str, bytes, bytearray)) or not hasattr(values, "__len__"):
        raise InvalidInputError(
            f"{column} must be a list, array or tensor of integers, not {type(values).__name__}"
        )
    try:
        return array.array(code, values)
    except (TypeError, OverflowError) as exc:
        bad = next((v for v in values if not _fits(v, unsigned)), None)
        low, high = (0, U64 - 1) if unsigned else (-_I64, _I64 - 1)
        raise _invalid(
            f"{column} must hold integers in [{low}, {high}], got {bad!r}", column, bad
        ) from exc


def _numpy_dtype(values: Any, column: str, kinds: str, what: str) -> Any:
    """The dtype of a numpy array (checked: one-dimensional, of ``kinds``), or
    ``None`` for anything else."""
    dtype = getattr(values, "dtype", None)
    if dtype is None or not hasattr(values, "ndim"):
        return None
    if values.ndim != 1:
        raise _invalid(f"{column} must be one-dimensional, got shape {values.shape}", column, None)
    if values.size and dtype.kind not in kinds:
        raise _invalid(f"{column} must hold {what}, got dtype {dtype}", column, None)
    return dtype


def _invalid(message: str, column: str, value: Any, row: int | None = None) -> InvalidInputError:
    """An :class:`InvalidInputError` naming its culprit in attributes."""
    value = repr(value)
    err = InvalidInputError(
        message if len(value) <= 60 else message.replace(value, value[:57] + "...")
    )
    err.column, err.value, err.row = column, value, row
    return err


def _is_float(v: Any) -> bool:
    try:
        float(v)
    except (TypeError, ValueError, OverflowError):
        return False
    return not isinstance(v, (str, bytes))


def _fits(v: Any, unsigned: bool) -> bool:
    if isinstance(v, bool) or not isinstance(v, int):
        return False
    return 0 <= v < U64 if unsigned else -_I64 <= v < _I64


def _floats(values: Any, column: str) -> array.array:
    """An array of finite float64 of a 1-d input."""
    if type(values) is list:  # the common case, first: ``loss.tolist()``
        try:
            out = array.array("d", values)
            if math.isfinite(sum(values)):  # a finite sum proves every value finite
                return out
        except (TypeError, OverflowError):
            pass  # explained below
    values = _plain(values)
    if _numpy_dtype(values, column, "fiub", "numbers") is not None:
        out = array.array("d", values.astype("<f8").tobytes())
    else:
        if isinstance(values, (str, bytes, bytearray)) or not hasattr(values, "__len__"):
            raise InvalidInputError(
                f"{column} must be a list, array or tensor of numbers, not {type(values).__name__}"
            )
        try:
            out = array.array("d", values)
        except (TypeError, OverflowError) as exc:
            bad = next((v for v in values if not _is_float(v)), None)
            raise _invalid(f"{column} must hold numbers, got {bad!r}", column, bad) from exc
    # a non-finite value makes the sum non-finite (a finite one can overflow too)
    if not math.isfinite(sum(out)):
        for i, v in enumerate(out):
            if not math.isfinite(v):
                raise _invalid(f"{column}[{i}] = {v} is not finite", column, v, row=i)
    return out


# -- writing segments ------------------------------------------------------------
class _Writer:
    """This process's engine writer (``_native.ScoreWriter``) for one run of
    one log: made at the first append, and made again in a forked child
    (whose parent writes the rows it had buffered).

    Kept apart from :class:`ScoreLog` so that ``weakref.finalize`` can flush
    it when the log is collected or the interpreter exits.
    """

    def __init__(self, directory: Path, flush_rows: int):
        self.directory = directory
        self.flush_rows = flush_rows
        self.closed = False
        self._native: _native.ScoreWriter | None = None
        self.pid = 0  # the process self._native belongs to (0: none yet, -1: closed)

    def _start(self) -> None:
        """A writer of this process (segments are named for its rank and worker)."""
        if self.closed:
            raise InvalidInputError("this score log is closed")
        rank, _ = distributed_defaults(None, None)
        self._native = _native.ScoreWriter(str(self.directory), rank, _worker(), self.flush_rows)
        self.pid = os.getpid()

    def append_batch(self, batch: _native.Batch, values: list[Any], epoch: int) -> None:
        if self.pid != os.getpid():
            self._start()
        self._native.append_batch(batch, values, epoch)  # type: ignore[union-attr]

    def append_batch_values(self, batch: _native.Batch, values: bytes, epoch: int) -> None:
        if self.pid != os.getpid():
            self._start()
        self._native.append_batch_values(batch, values, epoch)  # type: ignore[union-attr]

    def append(self, epoch: int, first: int, *columns: bytes | None) -> None:
        if self.pid != os.getpid():
            self._start()
        self._native.append(epoch, first, *columns)  # type: ignore[union-attr]

    @property
    def rows(self) -> int:
        """Rows appended in this process and not yet written."""
        if self._native is None or self.pid != os.getpid():
            return 0
        return self._native.pending

    def flush(self) -> int:
        if self._native is None or self.pid != os.getpid():
            return 0
        try:
            return self._native.flush()
        except StorageError as exc:
            err = StorageError(f"cannot write score log segment in {self.directory}: {exc}")
            err.path = str(self.directory)
            raise err from exc

    def close(self) -> None:
        self.closed = True
        self.pid = -1  # the next append checks, and refuses


def _worker() -> str:
    """The DataLoader worker this process is (torch is never imported here)."""
    data = sys.modules.get("torch.utils.data")
    info = data.get_worker_info() if data is not None else None
    return "main" if info is None else str(info.id)
