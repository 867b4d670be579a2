"""Workers of distributed SQL.

A :class:`Worker` serves in this process (on the engine's threads) until
it is stopped; a dataset opened with ``workers=[w.url, ...]`` runs its SQL
scans of ``metadata``, and the stages above them, on those workers, and
commits (``select``, ``apply_sql``) here. A worker opens the snapshot a
query names by its path, so every worker must see the dataset's snapshot
directory at the same path (the same host, or a shared file system).
``datasetrt worker --port N`` runs one from the command line.

>>> import datasetrt as drt
>>> with drt.Worker() as w:  # doctest: +SKIP
...     ds = drt.open(root, workers=[w.url])
...     ds.sql("SELECT label, count(*) FROM metadata GROUP BY label")
"""

from __future__ import annotations

import time
from typing import Any

from . import _native
from ._state import check_int

__all__ = ["Worker"]


class Worker:
    """Serve distributed SQL on ``host:port`` (port 0: one the system picks).

    ``url`` is what a coordinator's ``workers=`` takes. ``stop()`` (or the
    end of a ``with`` block) stops serving; queries it was running fail on
    their coordinators with an error.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        port = check_int(port, "port", 0, 65535)
        self._native = _native.Worker(str(host), port)

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
