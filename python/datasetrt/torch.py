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
from ._state import check_epoch, check_int, distributed_defaults
from .exceptions import InvalidInputError
from .loader import Batch, Loader

if TYPE_CHECKING:
    from .dataset import Dataset


def default_output(batch: Batch) -> dict[str, Any]:
    """``{"data": list[bytes], "cache_id": LongTensor, "sample_id": LongTensor,
    "draw": LongTensor, "epoch": int}``: ``draw`` holds the rows' global draw
    positions, the key of a score log (``ScoreLog.append_batch`` takes this
    dict), ``epoch`` the epoch they were drawn in."""
    return {
        "data": batch.data,
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
        *,
        batch_size: int,
        seed: int,
        epoch: int = 0,
        sampling: str = "replacement",
        epoch_len: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        threads: int | None = None,
        prefetch_bytes: int | None = None,
        prefetch_batches: int | None = None,
        transform: Callable[[Batch], Any] = default_output,
        follow: str | None = None,
        run: str | None = None,
    ):
        if follow not in (None, "head"):
            raise InvalidInputError(f'follow must be None or "head", not {follow!r}')
        self.follow = follow
        # with a run the epoch follows the head within itself too (Dataset.loader)
        self.run = run
        self.dataset = dataset
        self.version = dataset.version
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = epoch
        self.sampling = sampling
        self.epoch_len = epoch_len
        self.rank, self.world_size = distributed_defaults(rank, world_size)
        self.drop_last = drop_last
        self.threads = threads
        self.prefetch_bytes = prefetch_bytes
        self.prefetch_batches = prefetch_batches
        self.transform = transform
        self._resume: dict[str, Any] | None = None
        # a state torchdata loaded into this worker's copy, for its next iteration
        self._reader_resume: dict[str, Any] | None = None
        # (plan, batches delivered, inside a worker) of this copy's latest iteration
        self._progress: list[Any] | None = None
        # epoch -> the snapshot it drew from, as this process started them
        self._history: dict[int, int] = {}
        if follow == "head":
            self._draw_from_head()
        self._history[self.epoch] = self.version
        self._shared = SharedRecord(self._plan_record())

    def __getstate__(self) -> dict[str, Any]:
        # a copy (a spawned worker's) starts with no iteration of its own
        return {**self.__dict__, "_progress": None, "_reader_resume": None}

    # -- the plan shared with the workers ----------------------------------------
    def _plan_record(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "sampling": self.sampling,
            "epoch_len": self.epoch_len,
            "version": self.version,
            "resume": self._resume,
        }

    def _publish(self) -> None:
        if self._shared.owned:
            self._shared.write(self._plan_record())

    def _adopt_shared_plan(self) -> None:
        """In a copy (a DataLoader worker): take the owner's current plan."""
        if not self._shared.owned:
            plan = self._shared.read()
            self.seed, self.epoch, self.sampling = plan["seed"], plan["epoch"], plan["sampling"]
            self.epoch_len, self.version, self._resume = (
                plan["epoch_len"],
                plan["version"],
                plan["resume"],
            )
            if self.dataset.version != self.version:
                # this copy's dataset is private to it: read the plan's
                # snapshot as the active one (opened once, not per loader)
                self.dataset.pin(self.version)

    def _draw_from_head(self) -> None:
        """Draw from the dataset's head now, and build its sampler here, once
        for the host: the workers map the stored alias table."""
        self.version = self.dataset.head
        if self.sampling == "replacement":
            self.dataset.draws(0, count=1, sampling=self.sampling, version=self.version)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch the next iteration draws (call before each epoch).

        With ``follow="head"`` the epoch draws from the dataset's head as it
        is now: an update committed by this script, another process or the
        CLI since the last epoch takes effect here.
        """
        self.epoch = check_epoch(epoch)
        self._resume = None
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
        return _native.LoaderSpec(
            batch_size=self.batch_size,
            seed=self.seed,
            epoch=self.epoch,
            sampling=self.sampling,
            epoch_len=self.epoch_len,
            version=self.version,
            rank=self.rank,
            world_size=self.world_size,
            drop_last=self.drop_last,
            worker=worker,
            num_workers=workers,
            resume=self._resume if resume is None else resume,
            threads=self.threads,
            prefetch_bytes=self.prefetch_bytes,
            prefetch_batches=self.prefetch_batches,
            run=self.run,
        )

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
        before, self._resume = self._resume, state
        try:
            plan = self._plan()
        except BaseException:
            self._resume = before
            raise
        self.seed, self.epoch, self.sampling = plan.seed, plan.epoch, plan.sampling
        self.epoch_len, self.version = plan.epoch_len, plan.version
        self._history[self.epoch] = self.version
        self._publish()

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        self._adopt_shared_plan()
        resume, self._reader_resume = self._reader_resume or self._resume, None
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
