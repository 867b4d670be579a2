"""Weighted sampling with replacement: shares follow weights, within binomial bounds."""

from __future__ import annotations

import math

import polars as pl

import datasetrt as drt
from conftest import Source


def test_inverse_frequency_weights_equalise_a_9000_to_1000_population(tmp_path):
    src = Source(
        "imbalanced-v1",
        10_000,
        payload=lambda i: b"%d" % i,
        meta=lambda i: {"label": 1 if i % 10 == 0 else 0},
    )
    ds = drt.build(tmp_path, [src], progress=False)
    meta = ds.get_metadata()
    assert meta.group_by("label").len().sort("label")["len"].to_list() == [9000, 1000]
    ds.update_metadata(meta.with_columns((1.0 / pl.len().over("label")).alias("weight")))

    n = 0
    ones = 0
    for epoch in range(20):  # 200,000 draws
        for s in ds.iter(seed=11, epoch=epoch, batch_size=4096):
            n += 1
            ones += int(s.data) % 10 == 0
    share = ones / n
    sd = math.sqrt(0.25 / n)  # binomial standard deviation of the share at p = 0.5
    assert abs(share - 0.5) < 5 * sd, (share, sd)


def test_unweighted_draws_cover_rows_uniformly(tmp_path):
    ds = drt.build(
        tmp_path, [Source("uniform-v1", 50, payload=lambda i: b"%d" % i)], progress=False
    )
    counts = [0] * 50
    draws = 0
    for epoch in range(400):
        for s in ds.iter(seed=2, epoch=epoch):
            counts[s.sample_id] += 1
            draws += 1
    expected = draws / 50
    chi2 = sum((c - expected) ** 2 / expected for c in counts)
    # 49 degrees of freedom: P(chi2 > 100) is about 2e-5
    assert chi2 < 100, chi2
