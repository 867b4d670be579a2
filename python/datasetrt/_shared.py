"""State a process shares with its DataLoader workers: :class:`SharedRecord`.

A DataLoader with ``persistent_workers=True`` pickles (spawn, forkserver) or
copies (fork) its dataset once, when the workers start; what the main
process changes later (``set_epoch``, ``load_state_dict``) never reaches
those copies. So the dataset keeps what its workers must follow in a small
record on the host's shared-memory file system, written by the process that
made it and read by every copy at the start of each iteration.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import uuid
import weakref
from typing import Any

from .exceptions import InvalidInputError


def _directory() -> str:
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return tempfile.gettempdir()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _started(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, from /proc): with
    the pid, it names one process, even after the pid is reused. ``None``
    where /proc does not say (or the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        # the fields after the command name (in parentheses; it may hold any
        # byte), from field 3: the start time is field 22
        return int(stat[stat.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _sweep(directory: str) -> None:
    """Remove the records of makers that are gone (killed, say: a finalizer
    never ran). A reused pid keeps its file, a few hundred bytes, until that
    process ends too."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        parts = name.split("-")
        if len(parts) >= 3 and parts[0] == "datasetrt" and parts[1].isdigit():
            if not _alive(int(parts[1])):
                try:
                    os.unlink(os.path.join(directory, name))
                except OSError:
                    pass


def _remove(path: str, owner: int) -> None:
    # a forked worker holds the same object: only the owner removes the file
    if os.getpid() == owner:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


class SharedRecord:
    """A small JSON record: the creating process (the owner) writes it, copies
    in other processes of the host read it. It is removed when the owner's
    object is collected or the owner exits, and by the next record made on
    the host if the owner was killed.

    >>> r = SharedRecord({"epoch": 0})
    >>> r.write({"epoch": 3}); r.read()
    {'epoch': 3}
    >>> r.owned
    True
    """

    def __init__(self, value: dict[str, Any]):
        self.owner = os.getpid()
        self.started = _started(self.owner)
        directory = _directory()
        _sweep(directory)
        self.path = os.path.join(directory, f"datasetrt-{self.owner}-{uuid.uuid4().hex}.json")
        self.write(value)
        weakref.finalize(self, _remove, self.path, self.owner)

    @property
    def owned(self) -> bool:
        """Whether this process made the record (and so writes it)."""
        return os.getpid() == self.owner

    def write(self, value: dict[str, Any]) -> None:
        """Replace the record atomically (a reader sees the old or the new one)."""
        tmp = f"{self.path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w") as f:
            json.dump(value, f)
        os.replace(tmp, self.path)

    def read(self) -> dict[str, Any]:
        gone = InvalidInputError(
            f"the state shared with the process that made this object ({self.path}, pid "
            f"{self.owner}) is gone: the object was moved to another host or outlived its "
            f"maker; it will not silently replay an old plan. Make it where it is used."
        )
        # a maker killed with SIGKILL leaves its record (no finalizer ran)
        # until a later record sweeps it: a copy must not read it then, nor
        # a record of a later process that got the same pid
        if not self.owned and (
            not _alive(self.owner)
            or (self.started is not None and _started(self.owner) != self.started)
        ):
            raise gone
        try:
            with open(self.path) as f:
                return json.load(f)
        except FileNotFoundError:
            raise gone from None

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        value = self.read() if self.owned else None
        return _attach, (self.path, self.owner, value, self.started)


def _attach(
    path: str, owner: int, value: dict[str, Any] | None, started: int | None = None
) -> SharedRecord:
    """A copy: in the owner's process (a ``copy.deepcopy``) a record of its
    own with the same value; elsewhere (a worker) the owner's record."""
    if os.getpid() == owner and value is not None:
        return SharedRecord(value)
    record = SharedRecord.__new__(SharedRecord)
    record.path, record.owner, record.started = path, owner, started
    return record
