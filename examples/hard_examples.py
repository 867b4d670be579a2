"""Hard-example training with one DataLoader: per-sample losses from the
training loop become the next epoch's weights, without restarting anything.

    python examples/hard_examples.py [--root DIR] [--epochs 6] [--workers 2]

A small torch MLP learns scikit-learn's digits (shipped with the package; no
download) from a DatasetRT cache, twice with the same seed and number of
steps:

- **uniform**: every training sample weighted 1, all epochs;
- **hard**: a ``DataLoader`` with persistent workers over
  ``ds.to_torch(..., follow="head")``. Every rank and worker logs each
  sample's loss to a score log; between epochs ``loss_ema_weights`` turns
  the log into weights (a moving average of the loss over epochs) and
  ``cap_weight_per_class`` keeps any digit from taking more than a share of
  the draws. The next ``set_epoch`` draws from that snapshot.

It prints, per epoch, the draw shares of the digits and the effective
sample size, and at the end the validation accuracy overall and on the
digits the uniform run found hardest.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch
from quickstart import Digits
from torch.utils.data import DataLoader

import datasetrt as drt

BATCH = 64


def to_tensors(batch: drt.Batch) -> dict[str, torch.Tensor]:
    """In the worker: the batch's images, labels and identities as tensors."""
    return {
        "x": batch.torch("image").reshape(len(batch), -1),  # typed records: one native copy
        "y": batch.torch("label"),
        "cache_id": torch.tensor(batch.cache_id),
        "sample_id": torch.tensor(batch.sample_id),
        "draw": torch.tensor(batch.draws),
    }


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def shares(ds: drt.Dataset) -> str:
    pop = ds.population("label").sort("label")
    ess = ds.population()["ess"][0]
    parts = " ".join(f"{s:.2f}" for s in pop["draw_share"])
    return f"draw shares by digit [{parts}], effective sample size {ess:.0f} of {len(ds)}"


def train(ds, epochs, workers, *, hard: bool, log=None) -> torch.nn.Module:
    net = model()
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    tds = ds.to_torch(
        batch_size=BATCH, seed=7, transform=to_tensors, follow="head" if hard else None
    )
    kw = {"persistent_workers": True, "multiprocessing_context": "fork"} if workers else {}
    loader = DataLoader(tds, batch_size=None, num_workers=workers, **kw)
    for epoch in range(epochs):
        tds.set_epoch(epoch)  # reaches the persistent workers; with follow, the head too
        if hard:
            print(f"  epoch {epoch}: snapshot {tds.version}: {shares(ds)}")
        for batch in loader:
            losses = torch.nn.functional.cross_entropy(
                net(batch["x"]), batch["y"], reduction="none"
            )
            opt.zero_grad()
            losses.mean().backward()
            opt.step()
            if log is not None:
                log.append_batch(batch, losses.detach(), epoch=epoch)
        if hard and epoch + 1 < epochs:
            log.register("scores")  # everything the ranks and workers flushed so far
            ds.checkout("train")  # weights are derived from the training rows each time
            ds.apply_sql("loss_ema_weights", alpha=0.5)
            ds.apply_sql("cap_weight_per_class", cap=0.2)
    del loader
    return net


def accuracy(net, images, labels, digits) -> float:
    keep = np.isin(labels, digits)
    with torch.no_grad():
        predicted = net(torch.from_numpy(images[keep])).argmax(1).numpy()
    return float((predicted == labels[keep]).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", help="where the cache lives (default: a temporary directory)")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.root or tmp)
        source = Digits()
        ds = drt.build(root, [source], progress=False)
        ds.checkout(0)
        ds.select("SELECT * FROM metadata WHERE split = 'train'")
        if "train" in ds.tags():
            ds.checkout("train")
        else:
            ds.tag("train")
        val = [i for i in range(len(source)) if i % 5 == 0]  # the quickstart's 'val' split
        images = source.digits.images[val].reshape(len(val), 64).astype(np.float32) / 16.0
        labels = source.digits.target[val]

        print(f"{len(ds)} training rows; {args.epochs} epochs of {len(ds)} draws each")
        print("uniform weights:")
        uniform = train(ds, args.epochs, args.workers, hard=False)
        per_digit = [accuracy(uniform, images, labels, [d]) for d in range(10)]
        hardest = [int(d) for d in np.argsort(per_digit)[:3]]
        print("hard examples (score log -> loss_ema_weights -> cap_weight_per_class):")
        with ds.score_log("loss", run="hard") as log:
            hard = train(ds, args.epochs, args.workers, hard=True, log=log)
        everything = list(range(10))
        print(f"\nvalidation accuracy on {len(val)} held-out digits, same seed and steps:")
        print(
            f"  all digits:          uniform {accuracy(uniform, images, labels, everything):.3f}"
            f"  hard {accuracy(hard, images, labels, everything):.3f}"
        )
        print(
            f"  hardest {hardest}: uniform {accuracy(uniform, images, labels, hardest):.3f}"
            f"  hard {accuracy(hard, images, labels, hardest):.3f}"
        )
        print(f"\n{ds.history().height} snapshots; the payload files were never rewritten")


if __name__ == "__main__":
    main()
