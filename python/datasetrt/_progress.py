"""One progress display for long work (build, verify, the command line).

A ``tqdm.auto`` bar (a widget in Jupyter when ``ipywidgets`` is installed,
else a text bar); without ``tqdm`` a line on stderr every few seconds. It is
silent when ``enabled`` is false or when nobody is watching: stderr is not a
terminal and the code does not run in a Jupyter kernel (so logs of batch jobs
and CI stay clean).
"""

from __future__ import annotations

import sys
import time
import warnings
from typing import Any, TextIO

#: Seconds between two lines of the text fallback.
TEXT_EVERY = 2.0


def watched(stream: TextIO | None = None) -> bool:
    """Whether someone sees progress written to ``stream`` (default stderr)."""
    stream = sys.stderr if stream is None else stream
    if "ipykernel" in sys.modules:  # a notebook: stderr is a pipe, but a person reads it
        return True
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or replaced by an object without isatty
        return False


def _tqdm() -> Any:
    """``tqdm.auto.tqdm``, or None when tqdm is not installed."""
    try:
        with warnings.catch_warnings():
            # Without ipywidgets tqdm.auto warns once and uses its text bar: that is the fallback.
            warnings.simplefilter("ignore")
            from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm


class Progress:
    """Progress of ``desc``: ``update(n)`` adds, ``set(done, total)`` jumps.

    >>> with Progress("counting", total=3, enabled=False) as p:
    ...     p.update(3)
    >>> p.done
    3
    """

    def __init__(
        self,
        desc: str,
        total: int | None = None,
        *,
        enabled: bool = True,
        unit: str = " items",
        stream: TextIO | None = None,
    ):
        self.desc = desc
        self.total = total
        self.unit = unit
        self.done = 0
        self.stream = sys.stderr if stream is None else stream
        self.enabled = bool(enabled) and watched(self.stream)
        self.bar = None
        self.last = time.monotonic()
        if self.enabled:
            tqdm = _tqdm()
            if tqdm is not None:
                self.bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream)

    def update(self, n: int) -> None:
        self.done += n
        self._show(n)

    def set(self, done: int, total: int | None = None) -> None:
        """Report absolute progress (what a native callback gives)."""
        step, self.done = done - self.done, done
        if total is not None and total != self.total:
            self.total = total
            if self.bar is not None:
                self.bar.total = total
        self._show(step)

    def _show(self, step: int) -> None:
        if self.bar is not None:
            self.bar.update(step)
        elif self.enabled and time.monotonic() - self.last > TEXT_EVERY:
            self.last = time.monotonic()
            of = "" if self.total is None else f" of {self.total}"
            print(f"{self.desc}: {self.done}{of}{self.unit}", file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
