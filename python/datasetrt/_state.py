"""Argument checks and distributed defaults: the rules the Python layer owns.

Integer arguments of the calls that do not go through a loader request are
checked here before they reach the native layer, so a bad value raises
:class:`InvalidInputError` (never a ``TypeError`` or an ``OverflowError``
from PyO3). A loader's options are checked once, by the engine, when they
become a ``_native.LoaderSpec``; loader states are written and checked by
the engine too (``DrawPlan.state_after``, ``LoaderSpec(resume=...)``).

>>> check_int(3, "count")
3
>>> check_int(True, "count")
Traceback (most recent call last):
...
datasetrt.exceptions.InvalidInputError: count must be an int, got True
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
