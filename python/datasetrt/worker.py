"""Workers of distributed SQL.

A :class:`Worker` serves in this process (on the engine's threads) until
it is stopped; a dataset opened with ``workers=[w.url, ...]`` runs its SQL
scans of ``metadata``, and the stages above them, on those workers, and
commits (``select``, ``apply_sql``) here. A worker opens the snapshot a
query names by its path, so every worker must see the dataset's snapshot
directory at the same path (the same host, or a shared file system).
``datasetrt worker --port N`` runs one from the command line.

Both sides need the companion module ``datasetrt_distributed`` (this
engine built with datafusion-distributed; ``make develop`` installs it).
It is kept out of ``datasetrt._native`` because its tokio parks threads with
``parking_lot``, whose bookkeeping a ``fork()`` breaks: a DataLoader's
workers, forked from a process that ran distributed SQL, still read with
``datasetrt._native``; only distributed SQL itself is refused in them.

>>> import datasetrt as drt
>>> with drt.Worker() as w:  # doctest: +SKIP
...     ds = drt.open(root, workers=[w.url])
...     ds.sql("SELECT label, count(*) FROM metadata GROUP BY label")
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ._state import check_int, check_text
from .exceptions import InvalidInputError

if TYPE_CHECKING:
    from . import _native

__all__ = ["Worker"]


def distributed_module() -> ModuleType:
    """``datasetrt_distributed._native``, or an ``ImportError`` saying how to get it."""
    try:
        from datasetrt_distributed import _native
    except ImportError as e:
        raise ImportError(
            "distributed SQL needs the companion module datasetrt_distributed "
            "(python/distributed/ in the source tree: `make develop` installs it, "
            "or `pip install ./python/distributed`)"
        ) from e
    return _native


def worker_urls(workers: Sequence[str]) -> list[str]:
    """``workers`` as a list of URL strings (checked by the engine when used)."""
    if isinstance(workers, (str, bytes)):
        raise InvalidInputError("workers is a list of worker URLs, not one string")
    return [check_text(str(w), "a worker URL") for w in workers]


class Worker:
    """Serve distributed SQL on ``host:port`` (port 0: one the system picks).

    ``url`` is what a coordinator's ``workers=`` takes. ``stop()`` (or the
    end of a ``with`` block) stops serving; queries it was running fail on
    their coordinators with an error.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        port = check_int(port, "port", 0, 65535)
        host = check_text(str(host), "host")
        # the companion's class (stubbed in _native.pyi)
        self._native: _native.Worker = distributed_module().Worker(host, port)

    @property
    def url(self) -> str:
        """``http://<host>:<port>``."""
        return self._native.url

    @property
    def running(self) -> bool:
        return self._native.running

    def stop(self) -> None:
        self._native.stop()

    def serve_forever(self, poll: float = 0.2) -> None:
        """Block until the worker stops (Ctrl-C stops it)."""
        try:
            while self._native.running:
                time.sleep(poll)
        finally:
            self.stop()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "serving" if self.running else "stopped"
        return f"<datasetrt.Worker {self.url} {state}>"
