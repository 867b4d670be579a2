"""Every sampling mode: pure functions of (seed, epoch, k) and the snapshot."""

from __future__ import annotations

import collections
import math

import polars as pl
import pytest

import datasetrt as drt
from conftest import Source

MODES = ["replacement", "permutation", "weighted_without_replacement", "balanced"]


@pytest.fixture
def weighted(tmp_path):
    """60 rows; weights 0, 1, 2, 3 by sample_id % 4 (sum 90)."""
    ds = drt.build(tmp_path, [Source("w-v1", 60, payload=lambda i: b"%d" % i)], progress=False)
    meta = ds.get_metadata()
    ds.update_metadata(
        meta.with_columns((pl.col("sample_id") % 4).cast(pl.Float64).alias("weight"))
    )
    return ds


def draws(ds, mode, seed=1, epoch=0, **kw):
    return [
        s.sample_id for s in ds.loader(16, seed=seed, epoch=epoch, sampling=mode, **kw) for s in s
    ]


@pytest.mark.parametrize("mode", MODES)
def test_the_same_seed_and_epoch_repeat_and_epochs_differ(weighted, mode):
    first = draws(weighted, mode)
    assert first == draws(weighted, mode)
    assert first != draws(weighted, mode, epoch=1)
    assert first != draws(weighted, mode, seed=2)


def test_permutation_draws_every_row_exactly_once_per_epoch(weighted):
    for epoch in range(3):
        got = draws(weighted, "permutation", epoch=epoch)
        assert sorted(got) == list(range(60))  # weights do not matter, zero included


def test_weighted_without_replacement_never_repeats_and_never_draws_zero_weight(weighted):
    got = draws(weighted, "weighted_without_replacement")
    assert len(got) == len(set(got)) == 45  # the rows of positive weight
    assert all(s % 4 for s in got)


def test_weighted_without_replacement_puts_heavy_rows_first(weighted):
    # over many seeds, the first draw is row i with probability w_i / 90
    firsts = collections.Counter(
        draws(weighted, "weighted_without_replacement", seed=seed, epoch_len=1)[0] % 4
        for seed in range(3000)
    )
    n = sum(firsts.values())
    for residue, weight in ((1, 15), (2, 30), (3, 45)):
        p = weight / 90
        assert abs(firsts[residue] - n * p) < 5 * math.sqrt(n * p * (1 - p)), firsts


@pytest.mark.parametrize("epoch_len", [45, 90, 1000, 1237])
def test_balanced_counts_are_floor_or_ceiling_of_the_expectation(weighted, epoch_len):
    for epoch in range(3):
        counts = collections.Counter(draws(weighted, "balanced", epoch=epoch, epoch_len=epoch_len))
        assert sum(counts.values()) == epoch_len
        for row in range(60):
            expected = epoch_len * (row % 4) / 90
            assert counts[row] in (math.floor(expected), math.ceil(expected)), (row, counts[row])


def test_balanced_classes_get_equal_counts_every_epoch(tmp_path):
    src = Source("classes-v1", 1000, meta=lambda i: {"label": 1 if i % 10 == 0 else 0})
    ds = drt.build(tmp_path, [src], progress=False)
    meta = ds.get_metadata()
    ds.update_metadata(meta.with_columns((1.0 / pl.len().over("label")).alias("weight")))
    for epoch in range(3):
        labels = collections.Counter(
            s.metadata["label"] for s in ds.iter(seed=3, epoch=epoch, sampling="balanced")
        )
        assert labels[0] == labels[1] == 500


def test_replacement_frequencies_follow_weights(weighted):
    counts = collections.Counter()
    for epoch in range(200):
        counts.update(s % 4 for s in draws(weighted, "replacement", epoch=epoch))
    n = sum(counts.values())
    assert counts[0] == 0
    # chi-square over residues 1..3 with expected shares 1/6, 2/6, 3/6; 2 dof, P(>20) < 5e-5
    chi2 = sum((counts[r] - n * r / 6) ** 2 / (n * r / 6) for r in (1, 2, 3))
    assert chi2 < 20, (chi2, counts)


def test_unknown_modes_and_bad_lengths_are_refused(weighted):
    with pytest.raises(drt.InvalidInputError, match='unknown sampling "shuffle"'):
        weighted.loader(8, seed=1, sampling="shuffle")
    with pytest.raises(drt.InvalidInputError, match="epoch_len"):
        weighted.loader(8, seed=1, epoch_len=0)
    with pytest.raises(drt.InvalidInputError, match="seed"):
        weighted.loader(8)


def test_seeded_sql_subsets_repeat_across_opens(two_caches):
    ds, root, _ = two_caches
    query = (
        "SELECT cache_id, sample_id FROM metadata WHERE drt_uniform(7, cache_id, sample_id) < 0.25"
    )
    first = ds.sql(query).sort("cache_id", "sample_id")
    assert 150 < first.height < 250
    assert first.equals(drt.open(root).sql(query).sort("cache_id", "sample_id"))
    other = ds.sql(query.replace("(7,", "(8,")).sort("cache_id", "sample_id")
    assert not first.equals(other)
    values = ds.sql("SELECT drt_uniform(1, cache_id, sample_id) AS u FROM metadata")["u"]
    assert values.min() >= 0.0 and values.max() < 1.0


@pytest.mark.parametrize("mode", MODES)
def test_draws_are_the_sequence_the_loader_delivers(weighted, mode):
    rows = weighted.draws(1, epoch=4, sampling=mode).to_list()
    assert rows == [r for b in weighted.loader(16, seed=1, epoch=4, sampling=mode) for r in b.rows]
    assert weighted.draws(1, epoch=4, start=10, count=5, sampling=mode).to_list() == rows[10:15]


def test_balanced_epochs_are_balanced_for_a_column_interleaved_with_the_rows(tmp_path):
    """Labels interleaved with the rows (label = i % 5, weights 1..5 by label):
    a balanced epoch gave label 0 no draw in 21 of 30 epochs (the rounding
    followed row order), while `population` reports 66.7 draws per epoch."""
    src = Source("periodic-v1", 1500, meta=lambda i: {"label": i % 5})
    ds = drt.build(tmp_path, [src], progress=False)
    meta = ds.get_metadata()
    ds.update_metadata(meta.with_columns((pl.col("label") + 1).cast(pl.Float64).alias("weight")))
    for seed, epoch in [(s, e) for s in range(3) for e in range(10)]:
        labels = collections.Counter(
            i % 5 for i in draws(ds, "balanced", seed=seed, epoch=epoch, epoch_len=1000)
        )
        for label in range(5):
            expected = 1000 * (label + 1) / 15
            # far inside what independent draws would give (sd <= 13)
            assert abs(labels[label] - expected) <= 40, (seed, epoch, labels)


@pytest.mark.parametrize("weight", [2e-310, 1e-300, 1e300])
def test_equal_weights_draw_uniformly_at_any_scale(tmp_path, weight):
    """Equal subnormal weights (2e-310) drew 1 distinct row of 50 in a
    balanced epoch, and with replacement far from uniformly."""
    ds = drt.build(tmp_path, [Source("scale-v1", 50)], progress=False)
    ds.update_metadata(ds.get_metadata().with_columns(pl.lit(weight).alias("weight")))
    balanced = sorted(draws(ds, "balanced", epoch_len=50))
    assert balanced == list(range(50))
    counts = collections.Counter()
    for epoch in range(40):
        counts.update(draws(ds, "replacement", epoch=epoch, epoch_len=500))
    # 20,000 draws over 50 rows: chi-square on 49 degrees of freedom (p = 0.999 at 85.4)
    chi2 = sum((counts[r] - 400) ** 2 / 400 for r in range(50))
    assert chi2 < 85.4, (chi2, counts)
    firsts = {draws(ds, "weighted_without_replacement", seed=s)[0] for s in range(60)}
    assert len(firsts) > 25, firsts
