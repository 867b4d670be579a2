"""Run under torchrun by tests/test_torchrun.py: one rank of a distributed read.

Every rank opens the dataset, iterates ``ds.to_torch(...)`` through a
``DataLoader`` with worker processes and all-gathers the identities it saw;
rank 0 writes them (and the loader state) as JSON to ``--out``.

- ``--stop K``: a second pass stops after K batches and saves
  ``tds.state_dict(K)`` (every rank computes it; they must agree), or with
  ``--stateful`` reads through torchdata's ``StatefulDataLoader`` and saves
  its ``state_dict()``;
- ``--resume STATE``: instead, continue from a saved state to the end of the epoch.

``rank`` and ``world_size`` are not passed to ``to_torch``: they come from
the initialised process group (RANK and WORLD_SIZE are removed from the
environment after ``init_process_group`` to make sure of it).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os

import torch.distributed as dist
from torch.utils.data import DataLoader

import datasetrt as drt


def identities(batch) -> list[list[int]]:
    return [
        [c, s] for c, s in zip(batch["cache_id"].tolist(), batch["sample_id"].tolist(), strict=True)
    ]


def read(tds, workers: int, method: str, stop: int | None, stateful: bool = False):
    """The batches read (up to ``stop``), and the StatefulDataLoader's state then."""
    kwargs = {"multiprocessing_context": method} if workers else {}
    cls = DataLoader
    if stateful:
        from torchdata.stateful_dataloader import StatefulDataLoader as cls
    loader = cls(tds, batch_size=None, num_workers=workers, **kwargs)
    batches = []
    it = iter(loader)
    try:
        for batch in it:
            batches.append(identities(batch))
            if stop is not None and len(batches) == stop:
                break
        state = loader.state_dict() if stateful else None
    finally:
        del it  # shut the workers down now, not at interpreter exit
    return batches, state


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument("--sampling", default="replacement")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--method", default="fork")
    p.add_argument("--stop", type=int)
    p.add_argument("--resume")
    p.add_argument("--stateful", action="store_true")
    args = p.parse_args()

    # fail in a minute, not gloo's default 30, when a peer is gone
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    expected = (dist.get_rank(), dist.get_world_size())
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        os.environ.pop(name, None)

    ds = drt.open(args.root)
    tds = ds.to_torch(
        batch_size=args.batch_size, seed=args.seed, epoch=args.epoch, sampling=args.sampling
    )
    assert (tds.rank, tds.world_size) == expected, ((tds.rank, tds.world_size), expected)

    out: dict = {"world_size": expected[1]}
    if args.resume:
        with open(args.resume) as f:
            tds.load_state_dict(json.load(f))
        out["len"] = len(tds)
        out["resumed"] = read(tds, args.workers, args.method, None)[0]
    else:
        out["len"] = len(tds)
        out["full"] = read(tds, args.workers, args.method, None)[0]
        if args.stop is not None:
            out["before_stop"], state = read(
                tds, args.workers, args.method, args.stop, args.stateful
            )
            out["state"] = state if args.stateful else tds.state_dict(batches_seen=args.stop)

    gathered: list = [None] * expected[1]
    dist.all_gather_object(gathered, out)
    if expected[0] == 0:
        with open(args.out, "w") as f:
            json.dump(gathered, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
