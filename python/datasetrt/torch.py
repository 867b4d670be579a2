"""PyTorch adapter: a ``torch.utils.data.IterableDataset`` of batches.

>>> ds.to_torch(batch_size=64, seed=7)            # doctest: +SKIP
>>> loader = torch.utils.data.DataLoader(tds, batch_size=None, num_workers=4)  # doctest: +SKIP

The dataset yields whole batches, so give the DataLoader ``batch_size=None``.
Worker ``w`` of ``n`` reads global batches ``w, w + n, w + 2n, ...`` of the
epoch; the DataLoader collects from its workers in turn, so it delivers the
same sequence as ``num_workers=0``. It pickles by recipe (cache paths, snapshot
number, options) and reopens the caches lazily in each worker; under ``fork``
the native runtime is rebuilt in the child.

Under torchrun, create it after ``torch.distributed.init_process_group``:
``rank`` and ``world_size`` then come from the process group (else from the
``RANK``/``WORLD_SIZE`` variables torchrun sets). The ranks' batches are
disjoint parts of one global sequence, equal in number, and a state saved on
one number of ranks resumes on another (``tests/test_torchrun.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from ._state import MAX_DRAWS, check_epoch, check_int, check_seed, distributed_defaults
from .loader import Batch, Loader

if TYPE_CHECKING:
    from .dataset import Dataset


def default_output(batch: Batch) -> dict[str, Any]:
    """``{"data": list[bytes], "cache_id": LongTensor, "sample_id": LongTensor}``."""
    return {
        "data": batch.data,
        "cache_id": torch.tensor(batch.cache_id, dtype=torch.int64),
        "sample_id": torch.tensor(batch.sample_id, dtype=torch.int64),
    }


class TorchDataset(IterableDataset):
    """Batches of one epoch of draws, split across ranks and DataLoader workers.

    Exact resume: ``state_dict(batches_seen)`` records how far this rank's
    training loop got (the loop knows how many batches it consumed; the
    dataset object in the main process does not see the workers' progress),
    and ``load_state_dict(state)`` makes the next iteration continue the same
    global sequence, also with another ``num_workers`` or ``world_size``.
    The state is a small JSON-serialisable dict, as with torchdata's
    ``StatefulDataLoader`` conventions.
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
        threads: int | None = 1,
        prefetch_bytes: int = 32 << 20,
        prefetch_batches: int = 4,
        transform: Callable[[Batch], Any] = default_output,
    ):
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

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch the next iteration draws (call before each epoch)."""
        self.epoch = epoch
        self._resume = None

    def _loader(self, worker: int = 0, workers: int = 1) -> Loader:
        return Loader(
            self.dataset,
            batch_size=self.batch_size,
            seed=self.seed,
            epoch=self.epoch,
            sampling=self.sampling,
            epoch_len=self.epoch_len,
            rank=self.rank,
            world_size=self.world_size,
            threads=self.threads,
            prefetch_bytes=self.prefetch_bytes,
            prefetch_batches=self.prefetch_batches,
            drop_last=self.drop_last,
            worker=worker,
            num_workers=workers,
            resume=self._resume,
            version=self.version,
        )

    def _plan(self) -> Any:
        """This rank's draws (over all of its workers) in the next iteration:
        the engine's plan, which owns the arithmetic of blocks, padding and
        resume positions."""
        return self.dataset._native.draw_plan(
            check_seed(self.seed),
            check_epoch(self.epoch),
            check_int(self.batch_size, "batch_size", 1, MAX_DRAWS),
            sampling=self.sampling,
            epoch_len=self.epoch_len,
            version=self.version,
            drop_last=self.drop_last,
            rank=self.rank,
            world_size=self.world_size,
            resume=self._resume,
        )

    def __len__(self) -> int:
        """Batches this rank delivers in the next iteration (over all of its
        workers): the whole epoch, or what is left of it after
        :meth:`load_state_dict`."""
        return self._plan().batches

    def state_dict(self, batches_seen: int) -> dict[str, Any]:
        """The state after this rank consumed ``batches_seen`` batches of the epoch
        (counted from the start of the epoch, or from the state last loaded)."""
        return self._plan().state_after(check_int(batches_seen, "batches_seen"))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` on the next iteration (checked now)."""
        before, self._resume = self._resume, state
        try:
            plan = self._plan()
        except BaseException:
            self._resume = before
            raise
        self.seed, self.epoch, self.sampling = plan.seed, plan.epoch, plan.sampling
        self.epoch_len, self.version = plan.epoch_len, plan.version

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for batch in self._loader(worker, workers):
            yield self.transform(batch)
