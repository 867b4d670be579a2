"""Reading batches: :class:`Loader` and the :class:`Batch` and :class:`Sample` it yields.

A loader wraps one native loader (the plan ``SampleExec → PayloadTakeExec``
with bounded read-ahead) and pairs each batch with the rows of the loader's
snapshot; see :meth:`datasetrt.Dataset.loader`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import polars as pl

from . import _html, _native, records
from ._html import HtmlRepr

if TYPE_CHECKING:
    from .dataset import Dataset


class _Frame:
    """Metadata rows read on first use (a whole snapshot's for
    :meth:`Dataset.sample`, a batch's for the samples of a batch)."""

    __slots__ = ("_frame", "_read")

    def __init__(self, read: Any = None, frame: pl.DataFrame | None = None):
        self._read = read
        self._frame = frame

    def __call__(self) -> pl.DataFrame:
        if self._frame is None:
            self._frame = self._read()
            self._read = None
        return self._frame

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _Frame, (None, self())


class Sample(HtmlRepr):
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
        frame: _Frame | None,
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
            self._metadata = self._frame().row(self._row, named=True)
        return self._metadata

    def fields(self) -> dict[str, Any]:
        """A typed record's fields (:mod:`datasetrt.records`): name -> a
        read-only numpy array over ``data``."""
        layout = records.parse(self.data, f"cache {self.cache_id} sample {self.sample_id}")
        return {name: records.field_array(self.data, f) for name, f in layout.fields.items()}

    def __repr__(self) -> str:
        return (
            f"Sample(cache_id={self.cache_id}, sample_id={self.sample_id}, {len(self.data)} bytes)"
        )

    def to_html(self) -> str:
        """Identity, payload size, a hex (and, for plain pickles, a value) preview, metadata."""
        return _html.sample(self)


def _unpickle_batch(batch: bytes, metadata: bytes, epoch: int | None) -> Batch:
    return Batch(_native.Batch.from_ipc(batch, metadata), epoch)


class Batch(HtmlRepr):
    """One batch from a loader, handed over as the Arrow record batch the
    engine produced (columns ``draw``, ``row``, ``cache_id``, ``sample_id``,
    ``snapshot``, ``data``), with Python views of it built on first access:

    - ``data``: the payloads as ``bytes`` (copies);
    - ``views``: the payloads as read-only memoryviews, over the mapped shard
      (no copy) for records stored raw in a local cache or a whole replica,
      over a copy otherwise;
    - ``cache_id``, ``sample_id``, ``rows``: lists of ints (``rows`` index
      the loader's snapshot, or under ``run=`` each row's ``snapshots``);
      ``metadata``: a polars DataFrame of the rows (each row of the
      snapshot it was drawn from), gathered by the engine and wrapped
      without polars' thread pool, so a forked DataLoader worker may read it;
    - ``draws``: the global draw positions of the rows in the epoch's
      sequence (what a score log keys its rows by); ``epoch``: that epoch;
    - ``to_arrow()`` / ``__arrow_c_array__``: the record batch itself, for
      ``pl.DataFrame(batch.to_arrow())`` or ``pyarrow.record_batch(batch)``;
      raw payloads stay views over the mapped shard there too;
    - typed records (a source yielding ``{"image": array, ...}``, see
      :mod:`datasetrt.records`): ``tensor(name)`` a numpy array of every
      row's field, ``torch(name)`` a torch tensor, ``arrays(name)`` one array
      per row, ``fields`` the fields of row 0.
    """

    __slots__ = (
        "_cache_id",
        "_data",
        "_draws",
        "_epoch",
        "_metadata",
        "_native",
        "_records",
        "_rows",
        "_sample_id",
    )

    def __init__(self, native: Any, epoch: int | None = None):
        self._native: _native.Batch = native
        self._epoch = epoch
        self._metadata: pl.DataFrame | None = None
        self._rows: list[int] | None = None
        self._cache_id: list[int] | None = None
        self._sample_id: list[int] | None = None
        self._data: list[bytes] | None = None
        self._draws: list[int] | None = None
        self._records: records.Reader | None = None

    def __len__(self) -> int:
        return len(self._native)

    def _typed(self) -> records.Reader:
        if self._records is None:
            # the reader holds the native batch, not this one: a Batch that
            # held itself through its reader would be a cycle, freed only by
            # the garbage collector (whose runs cost a loop ~10 % at 768 KiB)
            self._records = records.Reader(self._native)
        return self._records

    @property
    def fields(self) -> dict[str, tuple[Any, tuple[int, ...]]]:
        """Row 0's typed fields: name -> (numpy dtype, shape)."""
        return {n: (d, s) for n, (d, s, _, _) in self._typed().layout().fields.items()}

    def tensor(self, name: str, *, copy: bool = False, out: Any = None) -> Any:
        """Field `name` of every row as one numpy array, rows first.

        A read-only view of the mapped shard, with no copy, when the rows lie
        one after another in one shard stored raw (``codec="none"``, read in
        order) and `copy` is false; otherwise one copy, made natively
        without the GIL, into `out` (an array of the batch's shape and dtype,
        reused from batch to batch) or a new writable array. Rows whose shapes differ
        are :class:`InvalidInputError` (read them with :meth:`arrays`); a
        cache of bytes payloads is :class:`InvalidInputError` too; a damaged
        header :class:`CorruptCacheError`."""
        return self._typed().tensor(name, copy=copy, out=out)

    def torch(self, name: str, *, pin_memory: bool = False, out: Any = None) -> Any:
        """Field `name` of every row as one writable torch tensor, rows
        first: copied once into memory torch allocates (page-locked with
        `pin_memory`; without a CUDA device that warns and does not pin, as
        torch's DataLoader does), or into `out`, a contiguous CPU tensor of
        the batch's shape and dtype reused from batch to batch (a pinned
        staging buffer, say). Never a view of the shard:
        torch has no read-only tensors, and a write into a mapped shard would
        kill the process."""
        return self._typed().torch(name, pin_memory=pin_memory, out=out)

    def arrays(self, name: str) -> list[Any]:
        """Field `name` of each row as its own read-only numpy array, over
        the row's payload (fields of variable shape)."""
        return self._typed().arrays(name)

    @property
    def typed(self) -> bool:
        """Whether the rows are typed records (row 0 is; an empty batch is not)."""
        return len(self._native) > 0 and records.is_typed(self._native.payload_head(0, 8)[0])

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # the engine's record batch and the rows' metadata as Arrow IPC
        # (made natively: no polars in a worker); unpickled, a native batch
        # again, whose payloads are its own bytes (no shard travels)
        return _unpickle_batch, (*self._native.to_ipc(), self._epoch)

    @property
    def rows(self) -> list[int]:
        if self._rows is None:
            self._rows = self._native.rows()
        return self._rows

    @property
    def cache_id(self) -> list[int]:
        if self._cache_id is None:
            self._cache_id = self._native.cache_id()
        return self._cache_id

    @property
    def sample_id(self) -> list[int]:
        if self._sample_id is None:
            self._sample_id = self._native.sample_id()
        return self._sample_id

    @property
    def draws(self) -> list[int]:
        """The global draw positions of the rows: draw ``k`` of the epoch's one
        sequence (over all ranks and workers), the key a score log needs."""
        if self._draws is None:
            self._draws = self._native.draws()
        return self._draws

    @property
    def epoch(self) -> int:
        """The epoch whose draws these are (code in a DataLoader worker can log
        it without asking the loader)."""
        if self._epoch is None:
            raise AttributeError("this batch was made without its epoch")
        return self._epoch

    @property
    def data(self) -> list[bytes]:
        if self._data is None:
            self._data = self._native.data()
        return self._data

    @property
    def views(self) -> list[memoryview]:
        """The payloads without a copy where they are stored raw (see the class)."""
        return self._native.views()

    def to_arrow(self) -> Any:
        """The batch as an Arrow record batch (any Arrow library reads it)."""
        return self._native.to_arrow()

    def __arrow_c_array__(self, requested_schema: object | None = None) -> object:
        return self._native.to_arrow().__arrow_c_array__(requested_schema)

    @property
    def snapshots(self) -> list[int]:
        """The snapshot each row was drawn from: the loader's, unless it
        follows the head within the epoch (``Dataset.loader(run=...)``)."""
        return self._native.snapshots()

    @property
    def metadata(self) -> pl.DataFrame:
        """The rows' metadata, one row per sample in batch order."""
        if self._metadata is None:
            self._metadata = pl.DataFrame(self._native.metadata())
        return self._metadata

    def __iter__(self) -> Iterator[Sample]:
        frame = _Frame(functools.partial(Batch.metadata.fget, self))
        cids, sids = self.cache_id, self.sample_id
        for i, data in enumerate(self.data):
            yield Sample(data, cids[i], sids[i], i, frame)

    def __repr__(self) -> str:
        return f"<datasetrt.Batch of {len(self)} samples>"

    def to_html(self) -> str:
        """The batch's metadata rows and payload sizes (the first rows and columns)."""
        return _html.batch(self)


class Loader(HtmlRepr):
    """Iterator over :class:`Batch` objects; see :meth:`Dataset.loader`."""

    def __init__(self, dataset: Dataset, spec: _native.LoaderSpec):
        # one native call checks the request, plans the draws (a resume state
        # is checked against the dataset) and starts reading ahead
        self._native: _native.Loader = dataset.start(spec)
        self.spec = spec
        self.version = self.plan.version
        self._epoch: int = self.plan.epoch

    @property
    def plan(self) -> _native.DrawPlan:
        """The engine's plan of this loader's draws (blocks, batches, ``state_after(n)``)."""
        return self._native.plan

    def state_dict(self) -> dict[str, Any]:
        """A small JSON-serialisable state: resume with ``Dataset.loader(resume=state)``.

        ``position`` counts the draws of the global sequence consumed so far:
        this loader's batches times the readers running side by side (ranks in
        lockstep, as distributed training runs them).
        """
        return self._native.state_dict()

    def __iter__(self) -> Loader:
        return self

    def __next__(self) -> Batch:
        return Batch(next(self._native), self._epoch)

    def __repr__(self) -> str:
        p = self.plan
        return (
            f"<datasetrt.Loader snapshot {p.version}, {p.sampling}, seed {p.seed}, "
            f"epoch {p.epoch}, batch_size {p.batch_size}>"
        )

    def to_html(self) -> str:
        """The loader's settings (its resume state) and plan."""
        return _html.loader(self)

    def explain(self) -> str:
        """The loader's physical plan (``SampleExec → PayloadTakeExec``)."""
        return self._native.explain()

    def metrics(self) -> str:
        """The plan with its metrics so far: rows, payload bytes, read time."""
        return self._native.metrics()
