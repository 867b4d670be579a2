"""Typed records against memcpy and against pickle, in the same run.

A batch of 64 fixed-shape ``uint8[3, 64, 64]`` records (768 KiB) is turned
into one torch tensor three ways, alternating, many times each:

- ``memcpy``: the same bytes, already contiguous, copied by one ``memcpy``
  (``ctypes.memmove``) into a new tensor (``torch.empty``): the floor for
  any path that hands over a writable batch tensor from one thread;
- ``copy_``: the same with torch's ``copy_``, which splits a copy this size
  over the cores (shown for reference: two threads, not one memcpy);
- ``typed``: ``batch.torch("image")`` on a loader batch of a typed cache (the
  header of every row checked, then its field copied natively into a new
  tensor);
- ``memcpy, out`` and ``typed, out``: the same two into one tensor reused
  from batch to batch (``batch.torch("image", out=staging)``): the copy's
  bandwidth alone, without the allocator (a fresh 768 KiB tensor is mapped
  memory whose first touch faults its pages, or not, by the allocator's
  history: the fresh pair's figures move with it);
- ``gather``: the engine's copy alone (``_native.Batch.gather_into`` into
  the reused tensor, without the reader or the checks): the ceiling of the
  typed path, rows copied one by one from wherever their payloads lie;
- ``pickle``: the same records pickled (the way examples stored them
  before), ``pickle.loads`` + ``torch.from_numpy`` per record and
  ``torch.stack``.

The targets (issue 38 §1): typed at least 0.9x memcpy's bandwidth and at
least 5x pickle's. Run by hand: ``python tests/bench/bench_typed.py``
(``make bench`` runs it, against the release extension). The batches come
from the loader before the clock starts: this measures the hand-over, not
the read.
"""

from __future__ import annotations

import argparse
import ctypes
import pickle
import resource
import statistics
import tempfile
import time

import numpy as np

import datasetrt as drt


def best_of(fn, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=2000)
    parser.add_argument("--codec", default="zstd")
    parser.add_argument(
        "--shape", default="3,64,64", help="each record's uint8 shape (3,224,224: an ImageNet crop)"
    )
    args = parser.parse_args()
    shape = tuple(int(d) for d in args.shape.split(","))
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, shape, dtype=np.uint8) for _ in range(args.batch * 4)]

    class Typed:
        name = "typed"

        def __iter__(self):
            for i, im in enumerate(images):
                yield {"image": im, "label": i}, None

    class Pickled:
        name = "pickled"

        def __iter__(self):
            for i, im in enumerate(images):
                yield pickle.dumps({"image": im, "label": i}), None

    with tempfile.TemporaryDirectory() as tmp:
        typed = drt.build(tmp, [Typed()], progress=False, codec=args.codec)
        pickled = drt.build(tmp + "/p", [Pickled()], progress=False, codec=args.codec)
        tbatch = next(iter(typed.loader(args.batch, seed=0)))
        pbatch = next(iter(pickled.loader(args.batch, seed=0)))
        payloads = pbatch.data
        source = torch.from_numpy(np.stack([images[s] for s in tbatch.sample_id]))
        assert torch.equal(tbatch.torch("image"), source)
        nbytes = source.numel()

        def memcpy() -> None:
            out = torch.empty_like(source)
            ctypes.memmove(out.data_ptr(), source.data_ptr(), nbytes)

        def torch_copy() -> None:
            torch.empty_like(source).copy_(source)

        def typed_path() -> None:
            tbatch._records = None  # as for a new batch: its header parsed again
            tbatch.torch("image")

        staging = torch.empty_like(source)

        def memcpy_out() -> None:
            ctypes.memmove(staging.data_ptr(), source.data_ptr(), nbytes)

        def typed_out() -> None:
            tbatch._records = None
            tbatch.torch("image", out=staging)

        # the engine's gather alone (no reader, no checks of `out=`): the
        # ceiling of the typed path, rows copied one by one from where
        # their payloads lie, against one memcpy of bytes already together
        native, header = tbatch._native, tbatch._typed().layout().header
        _, _, offset, row_bytes = tbatch._typed().field("image")

        def gather_alone() -> None:
            native.gather_into(header, offset, row_bytes, staging.data_ptr(), nbytes, False)

        def pickle_path() -> None:
            torch.stack([torch.from_numpy(pickle.loads(p)["image"]) for p in payloads])

        rounds: dict[str, list[float]] = {
            k: []
            for k in ("memcpy", "copy_", "typed", "memcpy, out", "typed, out", "gather", "pickle")
        }
        paths = {
            "memcpy": memcpy,
            "copy_": torch_copy,
            "memcpy, out": memcpy_out,
            "typed, out": typed_out,
            "typed": typed_path,
            "gather": gather_alone,
            "pickle": pickle_path,
        }
        # page faults per batch: memory the allocator hands out untouched
        faults = dict.fromkeys(rounds, 0)
        for _ in range(5):  # alternate, so drift hits all alike
            for k, fn in paths.items():
                repeat = args.repeat if k != "pickle" else max(1, args.repeat // 10)
                before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                rounds[k] += best_of(fn, repeat)
                faults[k] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    med = {k: statistics.median(v) for k, v in rounds.items()}
    low = {k: min(v) for k, v in rounds.items()}
    print(
        f"batch of {args.batch} x uint8{list(shape)} = {nbytes / 2**10:.0f} KiB, codec {args.codec}"
    )
    for k in rounds:
        print(
            f"  {k:11s} median {med[k] * 1e6:8.1f} us  best {low[k] * 1e6:8.1f} us  "
            f"{nbytes / med[k] / 2**30:6.2f} GiB/s  {faults[k] / len(rounds[k]):7.1f} faults"
        )
    print(f"typed / memcpy bandwidth: {med['memcpy'] / med['typed']:.2f}x (target >= 0.9)")
    out = med["memcpy, out"] / med["typed, out"]
    print(f"the same into a reused tensor: {out:.2f}x (target >= 0.9)")
    gather = med["memcpy, out"] / med["gather"]
    print(f"the gather alone, its ceiling: {gather:.2f}x")
    print(f"typed / pickle speed:     {med['pickle'] / med['typed']:.1f}x (target >= 5)")


if __name__ == "__main__":
    main()
