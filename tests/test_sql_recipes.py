"""Every recipe in sql/ runs here, and its result is checked."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

import datasetrt as drt
from conftest import Source

SQL = Path(__file__).resolve().parents[1] / "sql"
TESTED = {
    "balance_classes",
    "quality_filter",
    "dev_subset",
    "hard_examples",
    "cap_per_class",
    "split_by_hash",
}


def test_every_recipe_file_is_tested_here():
    assert {p.stem for p in SQL.glob("*.sql")} == TESTED


@pytest.fixture
def ds(tmp_path):
    # labels 0..4 with 40, 80, 120, 160, 200 rows
    src = Source(
        "recipes-v1",
        600,
        meta=lambda i: {
            "label": next(k for k, edge in enumerate((40, 120, 240, 400, 600)) if i < edge),
            "quality": (i * 37 % 100) / 100.0,
        },
    )
    return drt.build(tmp_path, [src], progress=False)


def test_balance_classes(ds):
    ds.apply_sql("balance_classes")
    per_label = ds.sql(
        "SELECT label, sum(weight) AS w, count(*) AS n FROM metadata GROUP BY label ORDER BY label"
    )
    assert per_label["w"].to_list() == pytest.approx([1.0] * 5)
    assert per_label["n"].to_list() == [40, 80, 120, 160, 200]
    assert ds.history()["note"][-1] == "apply_sql balance_classes {}"


def test_quality_filter(ds):
    ds.apply_sql("quality_filter", min_quality=0.8)
    meta = ds.get_metadata()
    assert meta.height == 120 and (meta["quality"] >= 0.8).all()


def test_dev_subset_is_seeded_and_repeatable(ds, tmp_path):
    ds.apply_sql("dev_subset", seed=7, fraction=0.25)
    first = ds.get_metadata().select("cache_id", "sample_id").sort("sample_id")
    assert 110 < first.height < 190
    ds.checkout(0)
    ds.apply_sql(SQL / "dev_subset.sql", seed=7, fraction=0.25)  # by path, the same rows
    assert ds.get_metadata().select("cache_id", "sample_id").sort("sample_id").equals(first)
    ds.checkout(0)
    ds.apply_sql("dev_subset", seed=8, fraction=0.25)
    assert not ds.get_metadata().select("cache_id", "sample_id").sort("sample_id").equals(first)


def test_hard_examples_weight_by_registered_losses(ds):
    meta = ds.get_metadata()
    losses = meta.select("cache_id", "sample_id").with_columns(
        (pl.col("sample_id") % 5).cast(pl.Float64).alias("loss")
    )
    ds.register("losses", losses)
    ds.apply_sql("hard_examples", power=2)
    got = ds.get_metadata()
    assert got.height == 480  # rows with loss 0 are dropped
    assert (got["weight"] == ((got["sample_id"] % 5) ** 2).cast(pl.Float64)).all()


def test_cap_per_class(ds):
    ds.apply_sql("cap_per_class", cap=50, seed=3)
    counts = ds.sql("SELECT label, count(*) AS n FROM metadata GROUP BY label ORDER BY label")
    assert counts["n"].to_list() == [40, 50, 50, 50, 50]
    chosen = set(ds.get_metadata()["sample_id"].to_list())
    ds.checkout(0)
    ds.apply_sql("cap_per_class", cap=50, seed=3)
    assert set(ds.get_metadata()["sample_id"].to_list()) == chosen


def test_split_by_hash_partitions_the_population(ds):
    ds.apply_sql("split_by_hash", seed=1, val_fraction=0.2, split="val")
    val = set(ds.get_metadata()["sample_id"].to_list())
    ds.checkout(0)
    ds.apply_sql("split_by_hash", seed=1, val_fraction=0.2, split="train")
    train = set(ds.get_metadata()["sample_id"].to_list())
    assert not val & train and len(val | train) == 600
    assert 80 < len(val) < 160


def test_parameters_are_checked(ds):
    version = ds.version
    with pytest.raises(drt.InvalidInputError, match="missing SQL parameter"):
        ds.apply_sql("quality_filter")
    with pytest.raises(drt.InvalidInputError, match="unexpected SQL parameter"):
        ds.apply_sql("quality_filter", min_quality=0.5, typo=1)
    with pytest.raises(drt.InvalidInputError, match="parameter 'min_quality'"):
        ds.apply_sql("quality_filter", min_quality=[1])
    with pytest.raises(drt.InvalidInputError, match="no SQL recipe 'nope'"):
        ds.apply_sql("nope")
    assert ds.version == version


def test_string_parameters_cannot_inject_sql(ds):
    with pytest.raises(drt.InvalidInputError):
        # quoted as a literal: no row has this split, so the population would be empty
        ds.apply_sql("split_by_hash", seed=1, val_fraction=2.0, split="val' OR '1'='1")
