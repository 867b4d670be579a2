"""PyTorch adapter: a ``torch.utils.data.IterableDataset`` of batches.

>>> tds = ds.to_torch(batch_size=64, seed=7)      # doctest: +SKIP
>>> loader = torch.utils.data.DataLoader(tds, batch_size=None, num_workers=4,
...                                      persistent_workers=True)  # doctest: +SKIP
>>> for epoch in range(10):                       # doctest: +SKIP
...     tds.set_epoch(epoch)
...     for batch in loader: ...

The dataset yields whole batches, so give the DataLoader ``batch_size=None``.
Worker ``w`` of ``n`` reads global batches ``w, w + n, w + 2n, ...`` of the
epoch; the DataLoader collects from its workers in turn, so it delivers the
same sequence as ``num_workers=0``. It pickles by recipe (cache paths, snapshot
number, options) and reopens the caches lazily in each worker; under ``fork``
the native runtime is rebuilt in the child. What the workers must follow
across iterations (epoch, resume position, snapshot) they read from a record
shared with the main process (:mod:`datasetrt._shared`), so one DataLoader
with persistent workers serves the whole run.

Under torchrun, create it after ``torch.distributed.init_process_group``:
``rank`` and ``world_size`` then come from the process group (else from the
``RANK``/``WORLD_SIZE`` variables torchrun sets). The ranks' batches are
disjoint parts of one global sequence, equal in number, and a state saved on
one number of ranks resumes on another (``tests/test_torchrun.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import polars as pl
import torch
from torch.utils.data import IterableDataset, get_worker_info

from . import _native
from ._shared import SharedRecord
from ._state import check_epoch, check_int
from .exceptions import InvalidInputError
from .loader import Batch, Loader

if TYPE_CHECKING:
    from .dataset import Dataset


def default_output(batch: Batch) -> dict[str, Any]:
    """``{"data": list[bytes], "cache_id": LongTensor, "sample_id": LongTensor,
    "draw": LongTensor, "epoch": int}``: ``draw`` holds the rows' global draw
    positions, the key of a score log (``ScoreLog.append_batch`` takes this
    dict), ``epoch`` the epoch they were drawn in. For typed records
    (:mod:`datasetrt.records`) ``data`` gives way to one tensor per field,
    rows first (``batch.torch(name)``; the DataLoader's ``pin_memory=True``
    pins them)."""
    if batch.typed:
        out: dict[str, Any] = {name: batch.torch(name) for name in batch.fields}
    else:
        out = {"data": batch.data}
    return {
        **out,
        "cache_id": torch.tensor(batch.cache_id, dtype=torch.int64),
        "sample_id": torch.tensor(batch.sample_id, dtype=torch.int64),
        "draw": torch.tensor(batch.draws, dtype=torch.int64),
        "epoch": batch.epoch,
    }


class TorchDataset(IterableDataset):
    """Batches of one epoch of draws, split across ranks and DataLoader workers.

    One DataLoader serves the whole run, ``persistent_workers=True``
    included: :meth:`set_epoch` and :meth:`load_state_dict` in the main
    process reach the workers, which read the iteration's plan (sequence,
    epoch, resume position, snapshot) from a record shared with the main
    process each time an iteration starts, never from the copy they were
    started with. Call them before ``iter(loader)`` (a ``for`` loop).

    Exact resume, one rule: a state is global (it continues the one global
    sequence, also with another ``num_workers`` or ``world_size``) unless it
    was taken inside a DataLoader worker.

    - ``state_dict(batches_seen)``: the state after this rank's loop consumed
      ``batches_seen`` batches of the iteration (the main process of a plain
      ``DataLoader`` does not see its workers' progress, the loop does).
    - ``state_dict()``: the state of the batches this process's copy
      delivered in its latest iteration. In the main process without
      workers that is global; inside a worker (where torchdata's
      ``StatefulDataLoader`` asks for it) it is that worker's, and resumes
      that worker of the same layout.
    - ``load_state_dict(state)`` takes either, or the whole
      ``state_dict()`` of a ``StatefulDataLoader``, which it turns into the
      global state of the batches that loader yielded.

    No skipped payload is read on resume: the plan starts at the state's
    position. States are small JSON-serialisable dicts.
    """

    def __init__(
        self,
        dataset: Dataset,
        spec: _native.LoaderSpec,
        *,
        transform: Callable[[Batch], Any] = default_output,
        follow: str | None = None,
    ):
        """``spec``: this rank's request, as :meth:`Dataset.loader_spec` makes
        it (use :meth:`Dataset.to_torch`); the adapter sets the snapshot, the
        worker and the resume position in it for each iteration."""
        if not isinstance(spec, _native.LoaderSpec):
            raise InvalidInputError(f"spec must be a LoaderSpec, not {type(spec).__name__}")
        if (spec.worker, spec.num_workers, spec.start_block) != (0, 1, 0):
            raise InvalidInputError(
                "the torch adapter splits the epoch among DataLoader workers itself: "
                "leave worker, num_workers and start_block at their defaults"
            )
        if follow not in (None, "head"):
            raise InvalidInputError(f'follow must be None or "head", not {follow!r}')
        self.follow = follow
        self.dataset = dataset
        self.transform = transform
        resume = spec.resume
        # the rank's request; `version` pins the snapshot (the spec's, else
        # the active one), `resume` the position
        version = dataset.version if spec.version is None else spec.version
        self.spec: _native.LoaderSpec = spec.replace(version=version, resume=None)
        # a state torchdata loaded into this worker's copy, for its next iteration
        self._reader_resume: dict[str, Any] | None = None
        # (plan, batches delivered, inside a worker) of this copy's latest iteration
        self._progress: list[Any] | None = None
        # epoch -> the snapshot it drew from, as this process started them
        self._history: dict[int, int] = {}
        if follow == "head":
            self._draw_from_head()
        self._history[self.epoch] = self.version
        self._shared = SharedRecord(self.spec.to_dict())
        if resume is not None:
            self.load_state_dict(resume)

    def __getattr__(self, name: str) -> Any:
        """The spec's options by name (``tds.epoch``, ``tds.seed``, ``tds.rank``...)."""
        spec = self.__dict__.get("spec")  # absent while unpickling
        if spec is not None and name in spec.to_dict():
            return getattr(spec, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __getstate__(self) -> dict[str, Any]:
        # a copy (a spawned worker's) starts with no iteration of its own
        return {**self.__dict__, "_progress": None, "_reader_resume": None}

    # -- the plan shared with the workers ----------------------------------------
    def _publish(self) -> None:
        if self._shared.owned:
            self._shared.write(self.spec.to_dict())

    def _adopt_shared_plan(self) -> None:
        """In a copy (a DataLoader worker): take the owner's current plan."""
        if not self._shared.owned:
            self.spec = _native.LoaderSpec(**self._shared.read())
            if self.dataset.version != self.version:
                # this copy's dataset is private to it: read the plan's
                # snapshot as the active one (opened once, not per loader)
                self.dataset.pin(self.version)

    def _draw_from_head(self) -> None:
        """Draw from the dataset's head now, and build its sampler here, once
        for the host: the workers map the stored alias table."""
        self.spec = self.spec.replace(version=self.dataset.head)
        self.dataset._native.prepare_draws(self.spec.sampling, self.version)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch the next iteration draws (call before each epoch).

        With ``follow="head"`` the epoch draws from the dataset's head as it
        is now: an update committed by this script, another process or the
        CLI since the last epoch takes effect here.
        """
        self.spec = self.spec.replace(epoch=check_epoch(epoch), resume=None)
        if self.follow == "head":
            self._draw_from_head()
        self._history[self.epoch] = self.version
        self._publish()

    def history(self) -> pl.DataFrame:
        """Which epoch drew from which snapshot (``epoch``, ``snapshot``), as
        this process started them; the loader states name the snapshot too."""
        rows = sorted(self._history.items())
        return pl.DataFrame(
            {"epoch": [e for e, _ in rows], "snapshot": [v for _, v in rows]},
            schema={"epoch": pl.Int64, "snapshot": pl.Int64},
        )

    def _spec(
        self, worker: int = 0, workers: int = 1, resume: dict[str, Any] | None = None
    ) -> _native.LoaderSpec:
        """One reader's request (this rank's draws over all of its workers,
        by default): the engine checks it and owns the arithmetic of blocks,
        padding and resume positions."""
        spec = self.spec.replace(worker=worker, num_workers=workers)
        return spec if resume is None else spec.replace(resume=resume)

    def _plan(self, resume: dict[str, Any] | None = None, worker: int = 0, workers: int = 1) -> Any:
        """This rank's draws (over all of its workers, by default) in the next iteration."""
        return self.dataset.plan(self._spec(worker, workers, resume))

    def __len__(self) -> int:
        """Batches this rank delivers in the next iteration (over all of its
        workers): the whole epoch, or what is left of it after
        :meth:`load_state_dict`."""
        self._adopt_shared_plan()
        return self._plan().batches

    def state_dict(self, batches_seen: int | None = None) -> dict[str, Any]:
        """The state after this rank consumed ``batches_seen`` batches of the
        iteration, or without it the state of the batches this process's copy
        delivered (see the class for the rule)."""
        if batches_seen is not None:
            self._adopt_shared_plan()
            return self._plan().state_after(check_int(batches_seen, "batches_seen"))
        if self._progress is None:
            raise InvalidInputError(
                "state_dict() without batches_seen is the state of the batches this process "
                "delivered, and it has not iterated this dataset: in the main process of a "
                "DataLoader with workers pass batches_seen (the batches your loop consumed), "
                "or use torchdata's StatefulDataLoader"
            )
        plan, delivered, in_worker = self._progress
        if in_worker:
            return plan.reader_state_after(delivered)
        return plan.state_after(delivered)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` on the next iteration (checked now)."""
        state = whole_loader_state(state)
        info = get_worker_info()
        if info is not None:  # torchdata restores each worker's own state in it
            self._adopt_shared_plan()
            self._plan(state, info.id, info.num_workers)  # checked now
            self._reader_resume = state
            return
        if state.get("reader") is not None:
            where = state["reader"]
            raise InvalidInputError(
                f"this state was taken inside DataLoader worker {where.get('worker')} of "
                f"{where.get('num_workers')} and resumes only that worker; load the whole "
                f"StatefulDataLoader.state_dict() (or state_dict(batches_seen)) instead"
            )
        plan = self._plan(state)  # checked now
        self.spec = self.spec.replace(
            seed=plan.seed,
            epoch=plan.epoch,
            sampling=plan.sampling,
            epoch_len=plan.epoch_len,
            version=plan.version,
            resume=state,
        )
        self._history[self.epoch] = self.version
        self._publish()

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        self._adopt_shared_plan()
        resume, self._reader_resume = self._reader_resume, None
        # the loader starts now (when the DataLoader asks for the iterator),
        # so that state_dict() is right before the first batch too
        loader = Loader(self.dataset, self._spec(worker, workers, resume))
        progress = [loader.plan, 0, info is not None]
        self._progress = progress
        return self._batches(loader, progress)

    def _batches(self, loader: Loader, progress: list[Any]) -> Iterator[Any]:
        for batch in loader:
            progress[1] += 1  # before the yield: torchdata asks for the state after it
            yield self.transform(batch)


def whole_loader_state(state: Any) -> Any:
    """A loader state from what ``load_state_dict`` was given: a
    ``StatefulDataLoader.state_dict()`` becomes the global state of the
    batches that loader yielded; anything else is returned as it is.

    With workers, torchdata keeps the state each worker gave with its latest
    batch; the worker whose batch was yielded last holds the global position.
    """
    if not isinstance(state, dict):
        return state
    if "_snapshot" in state:  # torchdata's multi-process iterator
        snapshot = state["_snapshot"]
        if state.get("_steps_since_snapshot", 0):
            raise InvalidInputError(
                "this StatefulDataLoader state was saved between its snapshots; create the "
                "loader with snapshot_every_n_steps=1 (the default) so that the state is exact"
            )
        workers = snapshot.get("_worker_snapshots") or {}
        last = 0 if snapshot.get("_snapshot_step", 0) == 0 else snapshot["_last_yielded_worker_id"]
        inner = (workers.get(f"worker_{last}") or {}).get("dataset_state")
        if inner is None:
            raise InvalidInputError(
                "this StatefulDataLoader state holds no dataset state for worker "
                f"{last}: was it saved from a loader over this TorchDataset?"
            )
        return {k: v for k, v in inner.items() if k != "reader"}
    if "_num_yielded" in state and "dataset_state" in state:  # its single-process iterator
        inner = state["dataset_state"]
        if inner is None:
            raise InvalidInputError(
                "this StatefulDataLoader state holds no dataset state: was it saved from a "
                "loader over this TorchDataset?"
            )
        return inner
    return state
