"""DatasetRT quickstart: cache scikit-learn's digits once, then change the
training population with SQL and Polars without rewriting a payload byte.

    python examples/quickstart.py [--root DIR]

The data set ships inside scikit-learn (no download). The first run builds two
caches; later runs reuse them (cache reuse follows the source name).
"""

from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path

import numpy as np
import polars as pl
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression

import datasetrt as drt


class Digits:
    """The 1,797 8x8 digit images, stored as typed arrays (the expensive
    'preprocessed' payload): no pickle on either side."""

    def __init__(self, shift: int = 0):
        self.shift = shift
        self.name = "sklearn-digits-v2" if shift == 0 else f"sklearn-digits-shift{shift}-v2"
        self.digits = load_digits()

    def __len__(self) -> int:
        return len(self.digits.target)

    def __iter__(self):
        for i, (img, label) in enumerate(zip(self.digits.images, self.digits.target, strict=True)):
            image = np.roll(img, self.shift, axis=1).astype(np.float32) / 16.0
            yield drt.CacheInput(
                data={"image": image, "label": int(label)},
                metadata={
                    "label": int(label),
                    "split": "train" if i % 5 else "val",
                    # a stand-in quality score: how much ink the image has
                    "quality": float(np.clip(image.mean() * 4, 0, 1)),
                    "augmented": self.shift != 0,
                },
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", default="cache/quickstart", help="where the caches live")
    args = parser.parse_args()
    root = Path(args.root)

    t0 = time.perf_counter()
    ds = drt.build(root, [Digits(), Digits(shift=1)])
    print(f"{ds!r} ready in {time.perf_counter() - t0:.2f}s")
    for c in ds.caches:
        print(f"  cache {c['name']}: cache_id {c['cache_id']}, {c['records']} samples")

    print("\nclass counts through SQL:")
    print(ds.sql("SELECT label, count(*) AS n FROM metadata GROUP BY label ORDER BY label"))

    ds.checkout(0)  # snapshot 0 is every stored sample; a rerun starts from it again
    meta = ds.get_metadata()
    print("\nsplit sizes through Polars:")
    print(meta.group_by("split", "augmented").agg(pl.len().alias("samples")).sort("split"))

    # 1) population: training rows with enough ink
    sel = meta.filter((pl.col("split") == "train") & (pl.col("quality") >= 0.5))
    # 2) make it imbalanced on purpose: keep only a third of the odd digits
    sel = sel.filter((pl.col("label") % 2 == 0) | (pl.col("sample_id") % 3 == 0))
    v = ds.update_metadata(sel)
    print(f"\nsnapshot {v}: {len(ds)} training rows; per label:")
    counts = ds.sql("SELECT label, count(*) AS n FROM metadata GROUP BY label ORDER BY label")
    print("  " + ", ".join(f"{label}: {n}" for label, n in counts.iter_rows()))

    # 3) class balance by inverse frequency
    v = ds.update_metadata(sel.with_columns((1.0 / pl.len().over("label")).alias("weight")))
    print(f"snapshot {v}: inverse-frequency weights")

    t0 = time.perf_counter()
    images, labels = [], []
    loader = None
    for epoch in range(3):  # the native loader: one call per batch, read-ahead on Rust threads
        loader = ds.loader(batch_size=256, seed=7, epoch=epoch)
        for batch in loader:
            images.append(batch.tensor("image").reshape(len(batch), -1))  # one native copy
            labels.extend(batch.tensor("label").tolist())
    elapsed = time.perf_counter() - t0
    drawn = collections.Counter(labels)
    print(f"\nthe loader's plan:\n{loader.explain()}")
    print(f"read {len(labels)} weighted draws in {elapsed:.2f}s; drawn per label:")
    print("  " + ", ".join(f"{k}: {drawn[k]}" for k in sorted(drawn)))

    clf = LogisticRegression(max_iter=2000).fit(np.concatenate(images), labels)

    # the validation split, read by identity (any stored sample can be read)
    val = meta.filter((pl.col("split") == "val") & ~pl.col("augmented"))
    xs, ys = [], []
    for cache_id, sample_id in val.select("cache_id", "sample_id").iter_rows():
        fields = ds.get_item(cache_id, sample_id).fields()
        xs.append(fields["image"].ravel())
        ys.append(int(fields["label"]))
    accuracy = float((clf.predict(np.stack(xs)) == np.array(ys)).mean())
    print(
        f"\nlogistic regression on the balanced draws: validation accuracy {accuracy:.3f} "
        f"on {len(ys)} held-out digits"
    )
    print(f"the payload files were never rewritten; snapshots live in {ds.snapshot_path.parent}")


if __name__ == "__main__":
    main()
