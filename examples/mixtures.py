"""Mixtures steered during a run, and what each checkpoint trained on.

    python examples/mixtures.py [--root DIR] [--steps 120]

scikit-learn's digits (shipped with the package; no download) stand in for
three data sources: ``source`` is ``web`` for digits 0-4, ``code`` for 5-7
and ``books`` for 8-9. The script

1. sets a mixture (web 0.6, code 0.3, books 0.1) and checks that every
   prefix of the draws meets the shares to within one draw;
2. trains a stand-in model for ``--steps`` steps with a loader that follows
   the head within the epoch (``run=``), logging a per-sample loss (higher
   on ``books``) to the score log, while ``MixtureController`` moves the
   shares towards the groups with higher loss every 20 steps: each change
   takes effect at a block boundary, the same for every reader;
3. saves a checkpoint's loader state halfway, then answers from it alone
   which samples it trained on (``exposures``), after a "decontamination"
   dropped ``books`` from the mixture and removed every ``books`` row from
   the population.

It prints what it checks; each check is exact, not a sample.
"""

from __future__ import annotations

import argparse
import collections
import tempfile
from pathlib import Path

import polars as pl
from quickstart import Digits

import datasetrt as drt

GROUPS = {"web": range(0, 5), "code": range(5, 8), "books": range(8, 10)}


def source_of(label: int) -> str:
    return next(g for g, labels in GROUPS.items() if label in labels)


def within_one(sources: list[str], shares: dict[str, float]) -> bool:
    counts: collections.Counter = collections.Counter()
    for k, s in enumerate(sources, start=1):
        counts[s] += 1
        if any(abs(counts[g] - share * k) >= 1 for g, share in shares.items()):
            return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", default=None, help="where the cache lives (default: a temp dir)")
    parser.add_argument("--steps", type=int, default=120)
    args = parser.parse_args()
    root = Path(args.root or tempfile.mkdtemp(prefix="datasetrt-mixtures-"))

    ds = drt.build(root, [Digits()], progress=False)
    meta = ds.get_metadata()
    ds.update_metadata(
        meta.with_columns(
            pl.col("label").map_elements(source_of, return_dtype=pl.String).alias("source")
        )
    )

    # 1. a mixture: shares met at every prefix
    shares = {"web": 0.6, "code": 0.3, "books": 0.1}
    ds.set_mixture("source", shares)
    batches = list(ds.loader(batch_size=32, seed=0, epoch_len=2_000))
    sources = [s for b in batches for s in b.metadata["source"]]
    print(
        f"mixture {shares}: 2,000 draws, every prefix within one draw: "
        f"{within_one(sources, shares)}"
    )
    print(ds.population("source").select("source", "target_share", "delivered_share"))

    # 2. steered during the run by the score log
    run = f"mixtures-{root.name}"
    log = ds.score_log("loss", run=run)
    ctl = drt.MixtureController(ds, "source", every=20, eta=0.5, log=log, signal="progress")
    loader = ds.loader(batch_size=32, seed=1, epoch_len=32 * args.steps, run=run)
    delivered: list[tuple[int, int]] = []
    snapshots: set[int] = set()
    checkpoint, half = None, []
    for step, batch in enumerate(loader, start=1):
        delivered += list(zip(batch.cache_id, batch.sample_id, strict=True))
        snapshots.update(batch.snapshots)
        # books is learnable (its loss falls); the others have stalled: learning
        # learning progress (signal="progress") moves draws to books
        books = 2.0 - step / args.steps
        loss = [books if s == "books" else 1.0 for s in batch.metadata["source"]]
        log.append_batch(batch, loss, epoch=0)
        if step == args.steps // 2:
            checkpoint = loader.state_dict()  # what a checkpoint keeps
            half = list(delivered)
        ctl.step(step)
    log.flush()
    print(
        f"steered: {len(snapshots) - 1} changes took effect during the epoch; books' share "
        f"{shares['books']:.2f} -> {ctl.shares['books']:.2f}"
    )
    replay = [
        (c, s)
        for b in ds.loader(batch_size=32, seed=1, epoch_len=32 * args.steps, run=run)
        for c, s in zip(b.cache_id, b.sample_id, strict=True)
    ]
    print(f"the run replayed from its schedule equals what it delivered: {replay == delivered}")

    # 3. provenance of the checkpoint, after the books were removed: the
    # mixture stops naming them first (a commit that leaves a group with a
    # positive share no rows is refused: its share could not be met)
    ds.set_mixture("source", {g: s for g, s in ctl.shares.items() if g != "books"})
    ds.select("SELECT * FROM metadata WHERE source <> 'books'")
    seen = {(c, s): n for c, s, n in ds.exposures(checkpoint).iter_rows()}
    print(
        f"exposures of the halfway checkpoint equal its draws: "
        f"{seen == dict(collections.Counter(half))}"
    )
    books = ds.sql(
        "SELECT sum(e.count) AS n FROM exposures e "
        "LEFT JOIN metadata m USING (cache_id, sample_id) WHERE m.weight IS NULL"
    )["n"][0]
    print(f"the checkpoint saw {books} draws of samples no longer in the population")


if __name__ == "__main__":
    main()
