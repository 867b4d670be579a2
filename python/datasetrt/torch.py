"""PyTorch adapter: a ``torch.utils.data.IterableDataset`` of batches.

>>> ds.to_torch(batch_size=64, seed=7)            # doctest: +SKIP
>>> loader = torch.utils.data.DataLoader(tds, batch_size=None, num_workers=4)  # doctest: +SKIP

The dataset yields whole batches, so give the DataLoader ``batch_size=None``.
Worker ``w`` of ``n`` reads global batches ``w, w + n, w + 2n, ...`` of the
epoch; the DataLoader collects from its workers in turn, so it delivers the
same sequence as ``num_workers=0``. It pickles by recipe (cache paths, snapshot
number, options) and reopens the caches lazily in each worker; under ``fork``
the native runtime is rebuilt in the child.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from .dataset import Batch, Loader

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
    """Batches of one epoch of weighted draws, split across DataLoader workers."""

    def __init__(
        self,
        dataset: Dataset,
        *,
        batch_size: int,
        seed: int,
        epoch: int = 0,
        drop_last: bool = False,
        threads: int | None = 1,
        prefetch_bytes: int = 32 << 20,
        prefetch_batches: int = 2,
        transform: Callable[[Batch], Any] = default_output,
    ):
        self.dataset = dataset
        self.snapshot = dataset.version
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = epoch
        self.drop_last = drop_last
        self.threads = threads
        self.prefetch_bytes = prefetch_bytes
        self.prefetch_batches = prefetch_batches
        self.transform = transform

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch the next iteration draws (call before each epoch)."""
        self.epoch = epoch

    def __len__(self) -> int:
        """Batches per epoch over all workers."""
        n = len(self.dataset._native.metadata(self.snapshot))
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        loader = Loader(
            self.dataset,
            batch_size=self.batch_size,
            seed=self.seed,
            epoch=self.epoch,
            threads=self.threads,
            prefetch_bytes=self.prefetch_bytes,
            prefetch_batches=self.prefetch_batches,
            drop_last=self.drop_last,
            worker=worker,
            num_workers=workers,
            snapshot=self.snapshot,
        )
        for batch in loader:
            yield self.transform(batch)
