"""What a training run will see: the population per class, as data and as a plot.

:meth:`Dataset.population` and :meth:`Dataset.plot_population` call these.
The numbers come from the snapshot's rows and weights (polars); how many
draws an epoch has comes from the engine, so a report always matches the
loader. matplotlib is needed only for the plot (``pip install 'datasetrt[plot]'``).
"""

from __future__ import annotations

import functools
import io
from typing import TYPE_CHECKING, Any

import polars as pl

from . import _native
from .exceptions import InvalidInputError

if TYPE_CHECKING:
    from .dataset import Dataset

#: The columns of a population report, after the ``by`` columns.
COLUMNS = (
    "rows",
    "row_share",
    "weight_sum",
    "draw_share",
    "draws_per_epoch",
    "ess",
    "max_weight_ratio",
)

#: Classes drawn in a plot; the rest are summed into one bar.
PLOT_CLASSES = 30


def metadata(dataset: Dataset, version: int | str | None) -> tuple[int, pl.DataFrame]:
    """The rows of snapshot ``version`` (a number, a tag, or None: the active one)."""
    if version is None:
        return dataset.version, dataset.get_metadata()
    number = dataset._resolve(version)
    if number == dataset.version:
        return number, dataset.get_metadata()
    return number, pl.DataFrame(dataset._native.get_metadata(number))


def _by(frame: pl.DataFrame, by: str | list[str] | None) -> list[str]:
    keys = [] if by is None else [by] if isinstance(by, str) else list(by)
    missing = [k for k in keys if k not in frame.columns]
    if missing:
        raise InvalidInputError(
            f"population(by=...): no column {missing[0]!r}; columns: {frame.columns}"
        )
    return keys


def report(
    frame: pl.DataFrame, by: str | list[str] | None, draws: int, sampling: str
) -> pl.DataFrame:
    """The report of ``frame`` for an epoch of ``draws`` draws; see :func:`population`."""
    keys = _by(frame, by)
    w = pl.col("weight")
    positive = pl.when(w > 0).then(w)
    if sampling == "permutation":  # every row once: weights do not matter
        drawn = pl.len().cast(pl.Float64)
    elif sampling == "weighted_without_replacement":  # every row of positive weight once
        drawn = (w > 0).sum().cast(pl.Float64)
    else:  # replacement and balanced draw each row in proportion to its weight
        drawn = w.sum()
    aggs = [
        pl.len().cast(pl.Int64).alias("rows"),
        w.sum().alias("weight_sum"),
        drawn.alias("_drawn"),
        # Kish: (Σw)² / Σw², the number of equally weighted rows worth as much
        pl.when((w * w).sum() > 0).then(w.sum() ** 2 / (w * w).sum()).otherwise(0.0).alias("ess"),
        (positive.max() / positive.min()).alias("max_weight_ratio"),
    ]
    grouped = frame.group_by(keys, maintain_order=True).agg(aggs) if keys else frame.select(aggs)
    total_rows = max(frame.height, 1)
    total_drawn = grouped["_drawn"].sum() or 1.0
    out = grouped.with_columns(
        (pl.col("rows") / total_rows).alias("row_share"),
        (pl.col("_drawn") / total_drawn).alias("draw_share"),
        (pl.col("_drawn") / total_drawn * draws).alias("draws_per_epoch"),
    )
    if keys:
        out = out.sort(keys, nulls_last=True)
    return out.select(*keys, *COLUMNS)


def population(
    dataset: Dataset,
    by: str | list[str] | None = None,
    *,
    version: int | str | None = None,
    sampling: str = "replacement",
    epoch_len: int | None = None,
) -> pl.DataFrame:
    """See :meth:`datasetrt.Dataset.population`."""
    number, frame = metadata(dataset, version)
    if sampling == "weighted_without_replacement" and epoch_len is not None:
        raise InvalidInputError(
            "population(): the expected draws of part of a weighted-without-replacement "
            "epoch have no closed form; leave epoch_len out, or count ds.draws(...)"
        )
    spec = _native.LoaderSpec(seed=0, sampling=sampling, epoch_len=epoch_len, version=number)
    draws = dataset._native.plan(spec).epoch_len
    return report(frame, by, draws, sampling)


def _label(dataset: Dataset, number: int) -> str:
    tags = sorted(t for t, n in dataset.tags().items() if n == number)
    return f"snapshot {number}" + (f" ({', '.join(tags)})" if tags else "")


def _shares(rep: pl.DataFrame, key: str, column: str) -> dict[str, float]:
    return {str(k): float(v) for k, v in zip(rep[key], rep[column], strict=True)}


@functools.cache
def _figure_class() -> type:
    """matplotlib's Figure that also shows itself in IPython and Jupyter as a PNG
    (a figure made without pyplot is not displayed by the inline backend)."""
    from matplotlib.figure import Figure

    class PopulationFigure(Figure):
        def _repr_png_(self) -> bytes:
            buf = io.BytesIO()
            self.savefig(buf, format="png", bbox_inches="tight")
            return buf.getvalue()

    return PopulationFigure


def plot_population(
    dataset: Dataset,
    by: str = "label",
    *,
    compare: int | str | None = None,
    version: int | str | None = None,
    bins: int = 40,
) -> Any:
    """See :meth:`datasetrt.Dataset.plot_population`."""
    try:
        figure = _figure_class()
    except ImportError:
        raise ImportError(
            "plot_population() draws with matplotlib: pip install 'datasetrt[plot]'"
        ) from None
    if not isinstance(by, str):
        raise InvalidInputError(f"plot_population(by=...) takes one column name, not {by!r}")
    number, frame = metadata(dataset, version)
    rep = population(dataset, by, version=number)
    whole = population(dataset, version=number).row(0, named=True)
    name = _label(dataset, number)
    if compare is None:  # before and after the weights of one snapshot
        series = [
            (f"{name}: share of rows", _shares(rep, by, "row_share")),
            (f"{name}: share of draws", _shares(rep, by, "draw_share")),
        ]
        others: list[tuple[str, pl.DataFrame]] = []
    else:
        other, other_frame = metadata(dataset, compare)
        other_rep = population(dataset, by, version=other)
        series = [
            (f"{_label(dataset, other)}: share of draws", _shares(other_rep, by, "draw_share")),
            (f"{name}: share of draws", _shares(rep, by, "draw_share")),
        ]
        others = [(_label(dataset, other), other_frame)]

    classes: list[str] = []
    for _, shares in series:
        classes += [c for c in shares if c not in classes]
    if len(classes) > PLOT_CLASSES:  # the largest classes, then one bar for the rest
        biggest = sorted(classes, key=lambda c: -max(s.get(c, 0.0) for _, s in series))
        keep = set(biggest[: PLOT_CLASSES - 1])
        classes = [c for c in classes if c in keep]
        for i, (title, shares) in enumerate(series):
            rest = sum(v for c, v in shares.items() if c not in keep)
            series[i] = (title, {**{c: shares.get(c, 0.0) for c in classes}, "others": rest})
        classes.append("others")

    fig = figure(figsize=(11, 4), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=[3, 2])
    width = 0.8 / len(series)
    for i, (title, shares) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(classes))]
        left.bar(xs, [shares.get(c, 0.0) for c in classes], width, label=title)
    left.set_xticks(range(len(classes)), classes, rotation=0 if len(classes) <= 12 else 90)
    left.set_xlabel(by)
    left.set_ylabel("share")
    left.set_title(f"class shares by {by}")
    left.legend(fontsize="small")

    for title, data in [*others, (name, frame)]:
        # relative to the mean, so that snapshots weighted on different scales compare
        relative = (data["weight"] / data["weight"].mean()).to_numpy()
        right.hist(relative, bins=bins, histtype="step", linewidth=1.5, label=title)
    right.set_xlabel("weight / mean weight")
    right.set_ylabel("rows")
    right.set_yscale("log")
    ratio = whole["max_weight_ratio"]
    right.set_title(
        f"weights of {name}: ESS {whole['ess']:,.0f} of {whole['rows']:,} rows"
        + ("" if ratio is None else f", max/min {ratio:,.3g}"),
        fontsize="medium",
    )
    if others:
        right.legend(fontsize="small")
    return fig
