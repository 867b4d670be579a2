"""Check the product as users install it: run by `make test` with the
interpreter of a fresh virtualenv holding the built wheel, from a directory
outside the checkout.

    python tests/installed/check_installed.py CHECKOUT

It fails on anything the package needs at run time that only a source
checkout has (the SQL recipes, type stubs, ``py.typed``), then runs the
quickstart against the installed package.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

import polars as pl

import datasetrt as drt

PARAMS = {
    "balance_classes": {},
    "cap_per_class": {"cap": 5, "seed": 1},
    "dev_subset": {"seed": 7, "fraction": 0.5},
    "hard_examples": {"power": 2},
    "loss_ema_weights": {"alpha": 0.5},
    "loss_ema_weights_shaped": {"shape": "rank", "floor": 0.1, "cap": 2.0, "anneal": 0.0},
    "reducible_loss_weights": {"shape": "rank", "floor": 0.1, "cap": 2.0, "anneal": 0.0},
    "focal_weights": {"gamma": 2},
    "cap_weight_per_class": {"cap": 0.3},
    "quality_filter": {"min_quality": 0.5},
    "split_by_hash": {"seed": 1, "val_fraction": 0.2, "split": "train"},
}
# Recipes that are queries, not population edits: run through their helper.
QUERIES = {"group_losses"}


class Squares:
    name = "squares-v1"

    def __iter__(self):
        for i in range(100):
            meta = {"label": i % 4, "quality": (i * 37 % 100) / 100.0, "il_loss": (i % 5) / 4}
            yield drt.CacheInput(pickle.dumps(i * i), meta)


def main() -> None:
    checkout = Path(sys.argv[1]).resolve()
    package = Path(drt.__file__).resolve().parent
    assert checkout not in package.parents, f"datasetrt was imported from the checkout: {package}"
    print(f"installed package: {package}")

    for name in ("_native.pyi", "py.typed"):
        assert (package / name).is_file(), f"{name} is missing from the installed package"
    shipped = {p.stem for p in (package / "sql").glob("*.sql")}
    in_checkout = {p.stem for p in (checkout / "sql").glob("*.sql")}
    assert shipped == in_checkout, f"shipped recipes {shipped} != sql/ {in_checkout}"
    known = set(PARAMS) | QUERIES
    assert shipped == known, f"recipes without parameters here: {shipped ^ known}"

    with tempfile.TemporaryDirectory() as tmp:
        ds = drt.build(tmp, [Squares()], progress=False)
        losses = ds.get_metadata().select(
            "cache_id", "sample_id", (pl.col("sample_id") % 3).cast(pl.Float64).alias("loss")
        )
        ds.register("losses", losses)
        # the score log as users get it: appended, flushed, the SQL table `scores`
        with ds.score_log("loss", run="check") as log:
            log.append(
                losses["cache_id"], losses["sample_id"], losses["loss"] + 1.0, epoch=0, position=0
            )
        log.register("scores")
        # the per-sample state the shaped recipes read (score_state)
        ds.register(
            "score_state",
            losses.select(
                "cache_id",
                "sample_id",
                pl.lit(1, pl.Int64).alias("count"),
                pl.lit(0, pl.UInt64).alias("first_epoch"),
                pl.lit(0, pl.UInt64).alias("last_epoch"),
                (pl.col("loss") + 1.0).alias("last_loss"),
                (pl.col("loss") + 1.0).alias("ema_loss"),
            ),
        )
        for recipe, params in sorted(PARAMS.items()):
            ds.checkout(0)
            version = ds.apply_sql(recipe, **params)
            assert 0 < len(ds) <= 100, (recipe, len(ds))
            print(f"apply_sql({recipe!r}) -> snapshot {version}, {len(ds)} rows")
        # group_losses: the online-mixing signal, per label over the log above
        ds.checkout(0)
        per_label = drt.mixing.group_losses(ds, "label", run="check")
        assert sorted(per_label["value"]) == ["0", "1", "2", "3"], per_label
        assert per_label["n"].sum() == 100, per_label
        print(f"group_losses -> {len(per_label)} groups")

    done = subprocess.run(
        [sys.executable, str(checkout / "examples" / "quickstart.py"), "--root", "quickstart"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    print(done.stdout.strip().splitlines()[-1])
    print("installed wheel: OK")


if __name__ == "__main__":
    main()
