"""Mixtures seen in a notebook: `population()` reports target and delivered
shares per group, the HTML view shows them (escaped), and `plot_mixture()`
draws the target shares over the snapshots."""

from __future__ import annotations

import collections
import io
import math

import polars as pl
import pytest

import datasetrt as drt
from conftest import Source, source_of

MODES = ["replacement", "permutation", "weighted_without_replacement", "balanced"]
HOSTILE = "<script>alert(1)</script>"


def counted_sources(ds, rows) -> collections.Counter:
    return collections.Counter(ds.get_metadata()[rows]["source"].to_list())


@pytest.mark.parametrize("mode", MODES)
def test_population_reports_the_target_and_the_delivered_shares(mixed, mode):
    shares = {"web": 0.2, "code": 0.5, "books": 0.3}
    mixed.set_mixture("source", shares)
    rep = mixed.population(sampling=mode, epoch_len=400, seed=5)  # by the mixture's column
    assert rep["source"].to_list() == ["books", "code", "web"]
    by_group = {r["source"]: r for r in rep.iter_rows(named=True)}
    for group, share in shares.items():
        row = by_group[group]
        assert row["target_share"] == pytest.approx(share, abs=1 / 65_536)
        assert row["draw_share"] == pytest.approx(row["target_share"])  # not the weights'
        assert row["draws_per_epoch"] == pytest.approx(share * 400, abs=400 / 65_536)
        assert abs(row["delivered_share"] * 400 - share * 400) < 1  # within one draw
    # delivered: what the loader draws for that seed, counted by hand
    drawn = counted_sources(mixed, mixed.draws(5, sampling=mode, epoch_len=400))
    assert {g: r["delivered_share"] * 400 for g, r in by_group.items()} == pytest.approx(drawn)
    assert rep["draws_per_epoch"].sum() == pytest.approx(400)


def test_delivered_shares_are_the_loaders_and_a_group_without_a_share_is_null(mixed):
    mixed.set_mixture("source", {"web": 3, "code": 1})
    rep = mixed.population("source", seed=3)
    books = rep.filter(pl.col("source") == "books").row(0, named=True)
    assert books["target_share"] is None
    assert books["draw_share"] == 0.0 and books["delivered_share"] == 0.0
    loaded = [s.sample_id for b in mixed.loader(8, seed=3) for s in b]
    assert len(loaded) == 90  # the rows of the groups with a share
    got = collections.Counter(source_of(i) for i in loaded)
    delivered = dict(zip(rep["source"], rep["delivered_share"], strict=True))
    assert {g: delivered[g] * 90 for g in got} == pytest.approx(got)
    assert rep.columns[-2:] == ["target_share", "delivered_share"]


def test_a_long_epoch_counts_a_bounded_prefix_still_within_one_draw(mixed):
    mixed.set_mixture("source", {"web": 0.6, "code": 0.3, "books": 0.1})
    rep = mixed.population(epoch_len=5_000_000)
    assert rep["draws_per_epoch"].sum() == pytest.approx(5_000_000)
    for row in rep.iter_rows(named=True):  # the first 1,000,000 draws were counted
        assert abs(row["delivered_share"] - row["target_share"]) < 1 / 1_000_000 + 1e-12


def test_other_columns_and_the_whole_are_drawn_as_the_mixture_says(mixed):
    before = mixed.population("label")
    assert "target_share" not in before.columns  # no mixture: the report as it was
    assert mixed.population().height == 1
    mixed.set_mixture("source", {"web": 0.1, "code": 0.1, "books": 0.8})
    rep = mixed.population("label")
    assert "target_share" not in rep.columns
    # the long-run share of each label among the loader's draws
    rows = mixed.draws(seed=11, count=60_000)
    labels = collections.Counter(mixed.get_metadata()[rows]["label"].to_list())
    for label, share in zip(rep["label"], rep["draw_share"], strict=True):
        assert labels[label] / 60_000 == pytest.approx(share, abs=0.01)
    assert rep["draw_share"].to_list() != pytest.approx(before["draw_share"].to_list(), abs=0.01)
    whole = mixed.population([])
    assert whole.height == 1 and whole["draws_per_epoch"][0] == 100
    with pytest.raises(drt.InvalidInputError, match="report by 'source'"):
        mixed.population("label", sampling="weighted_without_replacement")


def test_the_html_view_shows_the_mixture_and_escapes_its_groups(tmp_path):
    src = Source(
        "hostile-v1",
        40,
        meta=lambda i: {"label": i % 2, "<b>&": HOSTILE if i % 4 == 0 else "web"},
    )
    ds = drt.build(tmp_path, [src], progress=False)
    assert "mixture by" not in ds.to_html()
    ds.set_mixture("<b>&", {HOSTILE: 0.25, "web": 0.75})
    html = ds._repr_html_()
    assert "<script>" not in html and "<b>&" not in html
    assert "mixture by <code>&lt;b&gt;&amp;</code>" in html
    table = html.split("mixture by", 1)[1]
    hostile = table.split("&lt;script&gt;alert(1)&lt;/script&gt;</td>", 1)[1].split("</tr>")[0]
    web = table.split("<td>web</td>", 1)[1].split("</tr>")[0]
    assert hostile.count("25.0%") == 2 and "<td>10</td>" in hostile  # target, delivered, rows
    assert web.count("75.0%") == 2 and "<td>30</td>" in web


def test_plot_mixture_draws_the_shares_set_over_the_snapshots(mixed):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    first = mixed.version  # 1: no mixture
    mixed.set_mixture("source", {"web": 0.6, "code": 0.3, "books": 0.1})  # 2
    mixed.select("SELECT * FROM metadata WHERE sample_id <> 1")  # 3: keeps it
    mixed.set_mixture(None)  # 4
    mixed.set_mixture("source", {"web": 0.5, "code": 0.5})  # 5: books left out
    nan = math.nan
    expected = {
        "web": [nan, nan, 0.6, 0.6, nan, 0.5],
        "code": [nan, nan, 0.3, 0.3, nan, 0.5],
        "books": [nan, nan, 0.1, 0.1, nan, 0.0],
    }
    fig = mixed.plot_mixture()
    (ax,) = fig.axes
    lines = {line.get_label(): line for line in ax.lines}
    assert set(lines) == set(expected)
    for group, shares in expected.items():
        assert list(lines[group].get_xdata()) == list(range(first - 1, first + 5))
        got = list(lines[group].get_ydata())
        assert [math.isnan(v) for v in got] == [math.isnan(v) for v in shares], group
        assert [v for v in got if not math.isnan(v)] == pytest.approx(
            [v for v in shares if not math.isnan(v)], abs=1 / 65_536
        )
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    assert buf.getvalue().startswith(b"\x89PNG")
    # into a given axes: its figure comes back
    from matplotlib.figure import Figure

    other = Figure()
    axes = other.subplots()
    assert mixed.plot_mixture(ax=axes) is other and len(axes.lines) == 3
