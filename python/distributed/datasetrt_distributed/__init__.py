"""The engine of :mod:`datasetrt` with SQL on workers (datafusion-distributed).

Not used directly: :class:`datasetrt.Worker` serves with it, and a dataset
opened with ``workers=[...]`` runs its SQL through it. It is its own module
so that ``datasetrt._native``, which DataLoader workers fork with, keeps a
tokio without ``parking_lot``: a process forked from one that ran
distributed SQL cannot run it again (an ``InvalidInputError`` says so).
"""

from ._native import Dataset, Worker, __version__

__all__ = ["Dataset", "Worker", "__version__"]
