"""Every recipe in sql/ runs here, and its result is checked."""

from __future__ import annotations

import math
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
    "loss_ema_weights",
    "focal_weights",
    "cap_weight_per_class",
    "group_losses",
    "reducible_loss_weights",
    "loss_ema_weights_shaped",
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


def register_scores(ds) -> pl.DataFrame:
    """A score log as `scores`: rows 0..499 scored in epochs 0-2 (some twice in
    an epoch, rows 0..99 not in epoch 1), rows 500..599 never."""
    meta = ds.get_metadata()
    rows = []
    for epoch in range(3):
        for k in range(550):
            row = (k * 13 + epoch) % 500
            if epoch == 1 and row < 100:
                continue
            value = float((row * (epoch + 3)) % 17) / 4 + 0.25
            rows.append((epoch, k, meta["cache_id"][row], meta["sample_id"][row], value))
    frame = pl.DataFrame(
        rows, schema=["epoch", "position", "cache_id", "sample_id", "value"], orient="row"
    ).with_columns(run=pl.lit("r1"), rank=pl.lit(0, pl.UInt32))
    ds.register("scores", frame)
    return frame


def weights_by_sample(ds) -> dict[int, float]:
    meta = ds.get_metadata()
    assert meta.height == 600  # every row kept
    return dict(zip(meta["sample_id"], meta["weight"], strict=True))


def test_loss_ema_weights(ds):
    scores = register_scores(ds)
    ds.apply_sql("loss_ema_weights", alpha=0.4)
    ema = {}
    for (sid,), group in scores.group_by("sample_id"):
        average = None
        for loss in group.group_by("epoch").agg(pl.col("value").mean()).sort("epoch")["value"]:
            average = loss if average is None else 0.4 * loss + 0.6 * average
        ema[sid] = average
    fallback = sum(ema.values()) / len(ema)
    got = weights_by_sample(ds)
    assert got == pytest.approx({s: ema.get(s, fallback) for s in got}, rel=1e-12)
    assert len(ema) == 500 and got[599] == pytest.approx(fallback)
    # alpha = 1: the latest epoch's mean loss only
    ds.checkout(0)
    ds.apply_sql("loss_ema_weights", alpha=1.0)
    latest = scores.filter(pl.col("epoch") == 2).group_by("sample_id").agg(pl.col("value").mean())
    got = weights_by_sample(ds)
    assert all(got[s] == pytest.approx(v) for s, v in latest.iter_rows())


def test_focal_weights(ds):
    scores = register_scores(ds)
    ds.apply_sql("focal_weights", gamma=2.5)
    mean = dict(scores.group_by("sample_id").agg(pl.col("value").mean()).iter_rows())
    fallback = sum(mean.values()) / len(mean)
    got = weights_by_sample(ds)
    assert got == pytest.approx({s: mean.get(s, fallback) ** 2.5 for s in got}, rel=1e-12)


def test_group_losses(ds):
    """A query, not an edit: each label's mean logged loss since a point of the run."""
    from datasetrt.mixing import group_losses

    scores = register_scores(ds)
    labels = dict(ds.get_metadata().select("sample_id", "label").iter_rows())
    since = scores.filter(
        (pl.col("epoch") > 1) | ((pl.col("epoch") == 1) & (pl.col("position") >= 40))
    )
    want = (
        since.with_columns(pl.col("sample_id").replace_strict(labels).cast(pl.String).alias("g"))
        .group_by("g")
        .agg(pl.col("value").mean(), pl.len())
        .sort("g")
    )
    got = group_losses(ds, "label", run="r1", since=(1, 40))
    assert got["value"].to_list() == want["g"].to_list()
    assert got["loss"].to_list() == pytest.approx(want["value"].to_list(), rel=1e-12)
    assert got["n"].to_list() == want["len"].to_list()
    assert ds.version == 0  # nothing committed


def capped(weights: dict[int, float], labels: dict[int, int], cap: float) -> dict[int, float]:
    """Water-filling by iteration: fix the labels over the cap at exactly the cap."""
    per_label: dict[int, float] = {}
    for s, w in weights.items():
        per_label[labels[s]] = per_label.get(labels[s], 0.0) + w
    cap = max(cap, 1 / len(per_label))
    fixed: set[int] = set()
    while True:
        total = sum(w for c, w in per_label.items() if c not in fixed) / (1 - len(fixed) * cap)
        over = {c for c, w in per_label.items() if c not in fixed and w > cap * total * (1 + 1e-9)}
        if not over:
            break
        fixed |= over
    return {
        s: w * cap * total / per_label[labels[s]] if labels[s] in fixed else w
        for s, w in weights.items()
    }


def test_cap_weight_per_class(ds):
    labels = dict(ds.get_metadata().select("sample_id", "label").iter_rows())
    # uniform weights: label shares 40, 80, 120, 160, 200 of 600; at 0.25 the two
    # largest are capped and the third lands exactly on the cap
    ds.apply_sql("cap_weight_per_class", cap=0.25)
    shares = ds.sql(
        "SELECT label, sum(weight) / (SELECT sum(weight) FROM metadata) AS share "
        "FROM metadata GROUP BY label ORDER BY label"
    )["share"].to_list()
    assert shares == pytest.approx([40 / 480, 80 / 480, 0.25, 0.25, 0.25])
    assert weights_by_sample(ds) == pytest.approx(capped(dict.fromkeys(labels, 1.0), labels, 0.25))
    # after focal weights, as the iteration computes it; rows keep their ratios in a label
    ds.checkout(0)
    register_scores(ds)
    focal_version = ds.apply_sql("focal_weights", gamma=3)
    focal = weights_by_sample(ds)
    for cap in (0.3, 0.21, 1.0, 0.05):
        ds.checkout(focal_version)
        ds.apply_sql("cap_weight_per_class", cap=cap)
        assert weights_by_sample(ds) == pytest.approx(capped(focal, labels, cap), rel=1e-9)
    # the last cap, 0.05, is below 1/5 and cannot be met: every label gets a fifth
    shares = ds.sql(
        "SELECT sum(weight) / (SELECT sum(weight) FROM metadata) AS share "
        "FROM metadata GROUP BY label"
    )["share"].to_list()
    assert shares == pytest.approx([0.2] * 5)


# -- shaped weights from the per-sample score state ---------------------------------
def il_loss(row: int) -> float | None:
    """The reference loss of row ``row`` of the fixture: null for every 50th + 7."""
    return None if row % 50 == 7 else ((row * 7) % 11) / 4


def register_state(ds, heavy: int = 5) -> dict[int, float]:
    """A `score_state` table for rows 0..499 (500..599 unscored): ema_loss by
    row, the first ``heavy`` rows far above the rest (so a cap binds); returns
    sample_id -> ema_loss."""
    meta = ds.get_metadata().unique("sample_id").sort("sample_id")
    ema = {row: 40.0 + row if row < heavy else ((row * 13) % 23) / 5 for row in range(500)}
    frame = pl.DataFrame(
        {
            "cache_id": meta["cache_id"][:500],
            "sample_id": meta["sample_id"][:500],
            "count": pl.Series([3] * 500, dtype=pl.UInt64),
            "first_epoch": pl.Series([0] * 500, dtype=pl.UInt64),
            "last_epoch": pl.Series([2] * 500, dtype=pl.UInt64),
            "last_loss": [ema[r] for r in range(500)],
            "ema_loss": [ema[r] for r in range(500)],
        }
    )
    ds.register("score_state", frame)
    return {meta["sample_id"][r]: v for r, v in ema.items()}


def with_il_loss(ds, duplicate: int = 0) -> None:
    """The fixture's population with column il_loss (some null), and its
    first ``duplicate`` rows once more."""
    meta = ds.get_metadata().sort("sample_id")
    meta = meta.with_columns(
        pl.Series("il_loss", [il_loss(r) for r in range(meta.height)], pl.Float64)
    )
    ds.update_metadata(pl.concat([meta, meta.head(duplicate)]))


def shaped_weights(scores: list[float | None], shape, floor, cap, anneal, threshold=0.0):
    """The weight of each row, computed row by row: the shaping of
    reducible_loss_weights.sql and loss_ema_weights_shaped.sql, with the cap
    found by fixing the rows over it until none is (not as the SQL finds it)."""
    f, c, a = min(max(floor, 0.0), 1.0), max(cap, 1.0), min(max(anneal, 0.0), 1.0)
    k = (c - f) / (1 - f) if f < 1 else 1.0
    scored = [s for s in scores if s is not None]
    n = len(scored)
    if shape == "linear":
        raw = [max(s, 0.0) for s in scored]
    elif shape == "rank":  # percent_rank: the share of the other rows below
        raw = [sum(t < s for t in scored) / (n - 1) if n > 1 else 0.0 for s in scored]
    else:
        raw = [1.0 if s > threshold else 0.0 for s in scored]
    pos = sum(r > 0 for r in raw)
    if pos == 0 or f >= 1:
        q = [1.0] * n
    elif pos * k < n:  # the cap cannot hold the mean: the rest share it
        q = [k if r > 0 else (n - pos * k) / (n - pos) for r in raw]
    else:
        fixed: set[int] = set()
        while True:
            lam = (n - len(fixed) * k) / sum(r for i, r in enumerate(raw) if i not in fixed)
            over = {i for i, r in enumerate(raw) if i not in fixed and lam * r > k * (1 + 1e-9)}
            if not over:
                break
            fixed |= over
        q = [k if i in fixed else lam * r for i, r in enumerate(raw)]
    shaped = iter(a + (1 - a) * (f + (1 - f) * x) for x in q)
    return [1.0 if s is None else next(shaped) for s in scores]


def check_shaped(ds, want: dict[int, float], floor: float, cap: float, rows: int = 600) -> None:
    meta = ds.get_metadata()
    assert meta.height == rows
    got = {}
    for sid, w in zip(meta["sample_id"], meta["weight"], strict=True):
        assert got.setdefault(sid, w) == pytest.approx(w, rel=1e-12)  # duplicates alike
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    weights = meta["weight"].to_numpy()
    mean = weights.mean()
    assert mean == pytest.approx(1.0, rel=1e-9)
    assert weights.min() >= min(max(floor, 0), 1) * mean * (1 - 1e-9)
    assert weights.max() <= max(cap, 1) * mean * (1 + 1e-9)


@pytest.mark.parametrize(
    ("shape", "floor", "cap", "anneal"),
    [
        ("rank", 0.1, 2.0, 0.0),
        ("rank", 0.0, 1.5, 0.0),  # the cap binds on the top ranks
        ("linear", 0.1, 3.0, 0.0),  # the five heavy rows are capped
        ("linear", 0.0, 100.0, 0.0),  # no cap binds: weights proportional to the score
        ("linear", 0.2, 2.0, 0.5),
        ("threshold", 0.05, 2.0, 0.0),
        ("threshold", 0.05, 1.2, 0.0),  # too few rows over the threshold for the cap
        ("rank", 1.0, 2.0, 0.0),  # floor 1: uniform
        ("linear", 0.1, 1.0, 0.0),  # cap 1: uniform
        ("rank", 0.0, 2.0, 1.0),  # anneal 1: uniform
    ],
)
def test_reducible_loss_weights(ds, shape, floor, cap, anneal):
    with_il_loss(ds, duplicate=30)
    ema = register_state(ds)
    meta = ds.get_metadata()
    keys = list(meta["sample_id"])
    il = list(meta["il_loss"])
    scores = [
        None if sid not in ema or loss is None else ema[sid] - loss
        for sid, loss in zip(keys, il, strict=True)
    ]
    weights = shaped_weights(scores, shape, floor, cap, anneal)
    want = dict(zip(keys, weights, strict=True))
    ds.apply_sql("reducible_loss_weights", shape=shape, floor=floor, cap=cap, anneal=anneal)
    check_shaped(ds, want, floor, cap, rows=630)
    # rows with no score or no reference loss get the mean weight
    assert all(want[sid] == 1.0 for sid in keys if sid >= 500 or il_loss(sid) is None)
    if (shape, cap) == ("linear", 100.0):  # uncapped: proportional to the positive scores
        pos = {s: max(x, 0.0) for s, x in zip(keys, scores, strict=True) if x is not None}
        ratio = {want[s] / pos[s] for s in pos if pos[s] > 0}
        assert max(ratio) == pytest.approx(min(ratio), rel=1e-9)


@pytest.mark.parametrize(
    ("shape", "floor", "cap", "anneal"),
    [
        ("linear", 0.0, 100.0, 0.0),
        ("linear", 0.1, 2.0, 0.0),
        ("rank", 0.1, 2.0, 0.25),
        ("threshold", 0.1, 3.0, 0.0),
    ],
)
def test_loss_ema_weights_shaped(ds, shape, floor, cap, anneal):
    ema = register_state(ds)
    keys = list(ds.get_metadata()["sample_id"])
    scores = [ema.get(sid) for sid in keys]
    mean = sum(ema.values()) / len(ema)
    weights = shaped_weights(scores, shape, floor, cap, anneal, threshold=mean)
    want = dict(zip(keys, weights, strict=True))
    ds.apply_sql("loss_ema_weights_shaped", shape=shape, floor=floor, cap=cap, anneal=anneal)
    check_shaped(ds, want, floor, cap)
    if (shape, cap) == ("linear", 100.0):  # unshaped: loss_ema_weights' weights, scaled
        assert all(math.isclose(want[s] * mean, ema[s], rel_tol=1e-9) for s in ema)


@pytest.mark.parametrize(
    ("params", "culprit"),
    [
        ({"shape": "ranked"}, "shape"),
        ({"floor": -0.5}, "floor"),
        ({"floor": 1.5}, "floor"),
        ({"cap": 0.5}, "cap"),
        ({"anneal": 2.0}, "anneal"),
    ],
)
def test_shaped_recipes_refuse_bad_parameters_by_name(ds, params, culprit):
    """A guardrail out of range is the caller's error, never silently clamped."""
    with_il_loss(ds)
    register_state(ds)
    version = ds.version
    given = {"shape": "rank", "floor": 0.1, "cap": 2.0, "anneal": 0.0, **params}
    for recipe in ("reducible_loss_weights", "loss_ema_weights_shaped"):
        with pytest.raises(drt.InvalidInputError, match=culprit) as info:
            ds.apply_sql(recipe, **given)
        assert info.value.column == culprit
    assert ds.version == version


def test_reducible_loss_weights_refuse_a_nan_reference(ds):
    meta = ds.get_metadata().sort("sample_id")
    ds.update_metadata(
        meta.with_columns(il_loss=pl.Series([float("nan")] + [1.0] * (meta.height - 1)))
    )
    register_state(ds)
    with pytest.raises(drt.InvalidInputError, match="NaN"):
        ds.apply_sql("reducible_loss_weights", shape="rank", floor=0.1, cap=2.0, anneal=0.0)


def test_shaped_recipes_without_scores_are_uniform(ds):
    """An empty score state: nothing to weight by, every row the mean weight."""
    with_il_loss(ds)
    frame = pl.DataFrame(
        schema={
            "cache_id": pl.Int64,
            "sample_id": pl.Int64,
            "count": pl.UInt64,
            "first_epoch": pl.UInt64,
            "last_epoch": pl.UInt64,
            "last_loss": pl.Float64,
            "ema_loss": pl.Float64,
        }
    )
    ds.register("score_state", frame)
    for recipe in ("reducible_loss_weights", "loss_ema_weights_shaped"):
        ds.apply_sql(recipe, shape="rank", floor=0.1, cap=2.0, anneal=0.0)
        assert (ds.get_metadata()["weight"] == 1.0).all()
