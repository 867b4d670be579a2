"""Argument checks and distributed defaults: the rules the Python layer owns.

Integer arguments of the calls that do not go through a loader request are
checked here before they reach the native layer, so a bad value raises
:class:`InvalidInputError` (never a ``TypeError`` or an ``OverflowError``
from PyO3). So is every string the engine takes as text (names, SQL, recipe
parameters, URLs: :func:`check_text`); a Python ``str`` may hold a lone
surrogate that no UTF-8 string can (PyO3 would raise ``UnicodeEncodeError``).
Paths are not text: they go to the engine as the file system's bytes
(``os.fsencode``), so a path that is not UTF-8 is a path like any other. A
loader's options are checked once, by the engine, when they become a
``_native.LoaderSpec``; loader states are written and checked by the engine
too (``DrawPlan.state_after``, ``LoaderSpec(resume=...)``).

>>> check_int(3, "count")
3
>>> check_int(True, "count")
Traceback (most recent call last):
...
datasetrt.exceptions.InvalidInputError: count must be an int, got True
>>> check_text("ab\\udcff", "tag")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
datasetrt.exceptions.InvalidInputError: tag is not valid text: ... position 2 is '\\udcff', ...
"""

from __future__ import annotations

import os
import sys

from .exceptions import InvalidInputError

U64 = 1 << 64

#: The most draws :meth:`Dataset.draws` returns at once (4 bytes each: 8 GiB);
#: read longer sequences in parts with ``start``, or through a loader.
MAX_DRAWS = 1 << 31


def check_int(value: object, name: str, low: int = 0, high: int = U64 - 1) -> int:
    """``value`` as an int in ``[low, high]``, else :class:`InvalidInputError`
    (never a TypeError or OverflowError from the native layer)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{name} must be an int, got {value!r}")
    if not low <= value <= high:
        raise InvalidInputError(f"{name} must be in [{low}, {high}], got {value}")
    return value


def check_text(value: object, name: str) -> str:
    """``value`` if it is a ``str`` that UTF-8 can encode (the engine's
    strings are UTF-8), else :class:`InvalidInputError` naming ``name`` and
    the position of the first character that it cannot encode (never a
    ``TypeError`` or ``UnicodeEncodeError`` from the native layer)."""
    if not isinstance(value, str):
        raise InvalidInputError(f"{name} must be a str, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(
            f"{name} is not valid text: the character at position {exc.start} is "
            f"{value[exc.start]!r}, a lone surrogate (as Python decodes a byte that is not "
            f"UTF-8), which UTF-8 cannot encode"
        ) from None
    return value


def printable(text: str) -> str:
    """``text`` as a string UTF-8 can encode, for messages and tables: the
    bytes of a path that are not UTF-8 (lone surrogates from ``os.fsdecode``)
    as ``\\xff``, any other lone surrogate as ``\\udcff``; valid text as is.

    >>> printable("caches/r\\udcff"), printable("ok")
    ('caches/r\\\\xff', 'ok')
    """
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InvalidInputError(
            f"seed must be an int (got {seed!r}); sampling is never silently random"
        )
    if not 0 <= seed < U64:
        raise InvalidInputError(f"seed must be in [0, 2**64), got {seed}")
    return seed


def check_epoch(epoch: object) -> int:
    return check_int(epoch, "epoch")


def check_version(version: object, name: str = "snapshot") -> int:
    return check_int(version, name, 0, (1 << 63) - 1)


def distributed_defaults(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Fill in rank and world size from torch.distributed or RANK/WORLD_SIZE."""
    if rank is None or world_size is None:
        found = None
        # torch.distributed can only be initialised if it was imported: never import it here
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            found = (dist.get_rank(), dist.get_world_size())
        if found is None and "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            try:
                found = (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
            except ValueError:
                raise InvalidInputError(
                    f"RANK={os.environ['RANK']!r} and WORLD_SIZE={os.environ['WORLD_SIZE']!r} "
                    f"must be integers"
                ) from None
        found = found or (0, 1)
        rank = found[0] if rank is None else rank
        world_size = found[1] if world_size is None else world_size
    check_int(rank, "rank", 0, (1 << 32) - 1)
    check_int(world_size, "world_size", 0, (1 << 32) - 1)
    if not 0 <= rank < world_size:
        raise InvalidInputError(f"rank {rank} is not in 0..world_size ({world_size})")
    return rank, world_size
