"""What a training run will see: the population per class, as data and as plots.

:meth:`Dataset.population`, :meth:`Dataset.plot_population` and
:meth:`Dataset.plot_mixture` call these. The numbers come from the snapshot's
rows, weights and mixture (polars); how many draws an epoch has, and which
rows the first draws of an epoch are, come from the engine, so a report always
matches the loader. matplotlib is needed only for the plots
(``pip install 'datasetrt[plot]'``).
"""

from __future__ import annotations

import functools
import io
from typing import TYPE_CHECKING, Any

import polars as pl

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
    "top_share",
)

#: ``top_share`` is the share of the draws on the heaviest this share of rows.
TOP_ROWS = 0.01

#: The columns a report by a snapshot's mixture column adds.
MIXTURE_COLUMNS = ("target_share", "delivered_share")

#: Classes drawn in a plot; the rest are summed into one bar.
PLOT_CLASSES = 30

#: At most this many draws of an epoch are counted for ``delivered_share``.
DELIVERED_DRAWS = 1_000_000

#: A snapshot's mixture: its column and the share of each value (as text).
Mixture = tuple[str, dict[str, float]]


def metadata(dataset: Dataset, version: int | str | None) -> tuple[int, pl.DataFrame]:
    """The rows of snapshot ``version`` (a number, a tag, or None: the active one)."""
    number = dataset.version if version is None else dataset.resolve(version)
    return number, dataset.get_metadata(number)


def mixture_of(dataset: Dataset, number: int) -> Mixture | None:
    """The mixture of snapshot ``number``, or None when it draws by weights alone."""
    found = dataset.mixture(number)
    if found is None:
        return None
    return found["column"][0], dict(zip(found["value"], found["share"], strict=True))


def _by(frame: pl.DataFrame, by: str | list[str] | None) -> list[str]:
    keys = [] if by is None else [by] if isinstance(by, str) else list(by)
    missing = [k for k in keys if k not in frame.columns]
    if missing:
        raise InvalidInputError(
            f"population(by=...): no column {missing[0]!r}; columns: {frame.columns}"
        )
    return keys


# Per-row columns of a report; the names are not a user's.
_DRAWN, _EFFECTIVE, _HITS = "__drt_drawn__", "__drt_effective__", "__drt_hits__"
_TOP, _WHERE = "__drt_top__", "__drt_where__"


def _per_row(sampling: str, mixture: Mixture | None) -> list[pl.Expr]:
    """A row's part of the draws (any scale) and its effective weight.

    Without a mixture: its weight (replacement, balanced), one (a permutation
    draws every row once) or one for a positive weight (weighted without
    replacement). With one, the row's group (its value of the mixture's
    column, as text) has the group's share, split among the group's rows
    in the same way; a row whose value has no share is never drawn.
    """
    w = pl.col("weight").cast(pl.Float64)
    if sampling == "permutation":
        drawn = w.is_not_null().cast(pl.Float64)
    elif sampling == "weighted_without_replacement":
        drawn = (w > 0).cast(pl.Float64)
    else:
        drawn = w
    if mixture is None:
        return [drawn.alias(_DRAWN), w.alias(_EFFECTIVE)]
    column, shares = mixture
    group = pl.col(column).cast(pl.String)
    share = group.replace_strict(shares, default=0.0, return_dtype=pl.Float64).fill_null(0.0)

    def split(part: pl.Expr) -> pl.Expr:
        total = part.sum().over(group)
        return pl.when((share > 0) & (total > 0)).then(share * part / total).otherwise(0.0)

    return [split(drawn).alias(_DRAWN), split(w).alias(_EFFECTIVE)]


def report(
    frame: pl.DataFrame,
    by: str | list[str] | None,
    draws: int,
    sampling: str,
    mixture: Mixture | None = None,
    drawn_rows: pl.Series | None = None,
    where: str | pl.Expr | None = None,
) -> pl.DataFrame:
    """The report of ``frame`` for an epoch of ``draws`` draws; see :func:`population`.

    With ``mixture``, a report by its column (alone) adds ``target_share``
    and, given ``drawn_rows`` (rows of ``frame`` the loader drew),
    ``delivered_share``.
    """
    keys = _by(frame, by)
    w = pl.col("weight")
    e = pl.col(_EFFECTIVE)
    drawn = pl.col(_DRAWN)
    positive = pl.when(e > 0).then(e)
    aggs = [
        pl.len().cast(pl.Int64).alias("rows"),
        w.sum().cast(pl.Float64).alias("weight_sum"),
        pl.col(_DRAWN).sum().alias(_DRAWN),
        # Kish: (Σw)² / Σw², the number of equally weighted rows worth as much
        pl.when((e * e).sum() > 0).then(e.sum() ** 2 / (e * e).sum()).otherwise(0.0).alias("ess"),
        (positive.max() / positive.min()).alias("max_weight_ratio"),
        # the draws that land on the heaviest 1 % of the rows (at least one)
        (pl.when(pl.col(_TOP)).then(drawn).otherwise(0.0).sum() / drawn.sum()).alias("top_share"),
    ]
    if where is not None:
        matched = pl.when(pl.col(_WHERE).fill_null(False)).then(drawn).otherwise(0.0)
        aggs.append((matched.sum() / drawn.sum()).alias("where_share"))
    by_mixture = mixture is not None and keys == [mixture[0]]
    if mixture is not None and by_mixture:
        column, shares = mixture
        target = (
            pl.col(column)
            .cast(pl.String)
            .replace_strict(shares, default=None, return_dtype=pl.Float64)
        )
        aggs.append(target.first().alias("target_share"))
    rows = frame.with_columns(_per_row(sampling, mixture))
    over = (lambda x: x.over(keys)) if keys else (lambda x: x)
    heaviest = over(drawn.rank("ordinal", descending=True))
    rows = rows.with_columns((heaviest <= over((pl.len() * TOP_ROWS).ceil())).alias(_TOP))
    if where is not None:
        rows = rows.with_columns(_predicate(where).alias(_WHERE))
    grouped = rows.group_by(keys, maintain_order=True).agg(aggs) if keys else rows.select(aggs)
    total_rows = max(frame.height, 1)
    total_drawn = grouped[_DRAWN].sum() or 1.0
    out = grouped.with_columns(
        (pl.col("rows") / total_rows).alias("row_share"),
        (pl.col(_DRAWN) / total_drawn).alias("draw_share"),
        (pl.col(_DRAWN) / total_drawn * draws).alias("draws_per_epoch"),
    )
    extra: list[str] = []
    if by_mixture:
        extra.append("target_share")
        if drawn_rows is not None:
            hits = (
                frame.select(pl.col(keys).gather(drawn_rows))
                .group_by(keys)
                .agg(pl.len().alias(_HITS))
            )
            out = out.join(hits, on=keys, how="left").with_columns(
                (pl.col(_HITS).fill_null(0) / max(len(drawn_rows), 1)).alias("delivered_share")
            )
            extra.append("delivered_share")
    if where is not None:
        extra.append("where_share")
    if keys:
        out = out.sort(keys, nulls_last=True)
    return out.select(*keys, *COLUMNS, *extra)


def _predicate(where: str | pl.Expr) -> pl.Expr:
    """``where`` as a boolean polars expression (a string is SQL)."""
    if isinstance(where, pl.Expr):
        return where.cast(pl.Boolean)
    if not isinstance(where, str) or not where.strip():
        raise InvalidInputError(
            f"population(where=...) takes a SQL condition or a polars expression, not {where!r}"
        )
    try:
        return pl.sql_expr(where).cast(pl.Boolean)
    except Exception as exc:  # polars' SQL errors have no common base
        raise InvalidInputError(f"population(where={where!r}): {exc}") from exc


def population(
    dataset: Dataset,
    by: str | list[str] | None = None,
    *,
    version: int | str | None = None,
    sampling: str = "replacement",
    epoch_len: int | None = None,
    seed: int = 0,
    where: str | pl.Expr | None = None,
) -> pl.DataFrame:
    """See :meth:`datasetrt.Dataset.population`."""
    number, frame = metadata(dataset, version)
    mixture = mixture_of(dataset, number)
    if by is None and mixture is not None:
        by = mixture[0]
    keys = _by(frame, by)
    if sampling == "weighted_without_replacement":
        if mixture is None and epoch_len is not None:
            raise InvalidInputError(
                "population(): the expected draws of part of a weighted-without-replacement "
                "epoch have no closed form; leave epoch_len out, or count ds.draws(...)"
            )
        if mixture is not None and keys not in ([], [mixture[0]]):
            raise InvalidInputError(
                "population(): the expected draws of a mixture's groups drawn weighted "
                f"without replacement have no closed form by other columns; report by "
                f"{mixture[0]!r}, or count ds.draws(...)"
            )
    draws = dataset.epoch_len(sampling=sampling, epoch_len=epoch_len, version=number)
    drawn_rows = None
    if mixture is not None and keys == [mixture[0]]:
        # the first draws of epoch 0, as the loader delivers them
        count = min(draws, DELIVERED_DRAWS)
        drawn_rows = dataset.draws(
            seed, 0, count=count, sampling=sampling, epoch_len=epoch_len, version=number
        )
    return report(frame, keys, draws, sampling, mixture, drawn_rows, where)


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


def _matplotlib(what: str) -> type:
    try:
        return _figure_class()
    except ImportError:
        raise ImportError(
            f"{what}() draws with matplotlib: pip install 'datasetrt[plot]'"
        ) from None


def plot_population(
    dataset: Dataset,
    by: str = "label",
    *,
    compare: int | str | None = None,
    version: int | str | None = None,
    bins: int = 40,
) -> Any:
    """See :meth:`datasetrt.Dataset.plot_population`."""
    figure = _matplotlib("plot_population")
    if not isinstance(by, str):
        raise InvalidInputError(f"plot_population(by=...) takes one column name, not {by!r}")
    number, frame = metadata(dataset, version)
    rep = population(dataset, by, version=number)
    whole = population(dataset, [], version=number).row(0, named=True)
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


def mixture_history(dataset: Dataset) -> tuple[list[int], list[Mixture | None]]:
    """Every committed snapshot on disk, oldest first, and its mixture."""
    history = dataset.history().filter(pl.col("committed")).sort("version")
    versions = history["version"].to_list()
    return versions, [mixture_of(dataset, v) for v in versions]


def plot_mixture(dataset: Dataset, ax: Any = None) -> Any:
    """See :meth:`datasetrt.Dataset.plot_mixture`."""
    if ax is None:
        figure = _matplotlib("plot_mixture")
        fig = figure(figsize=(9, 4), layout="constrained")
        ax = fig.subplots()
    else:
        fig = ax.get_figure()
    versions, mixtures = mixture_history(dataset)
    columns = list(dict.fromkeys(m[0] for m in mixtures if m is not None))
    groups = list(dict.fromkeys((m[0], v) for m in mixtures if m is not None for v in m[1]))
    nan = float("nan")
    for column, value in groups:
        # a group without a share in a mixture of its column is not drawn: 0;
        # a snapshot without a mixture of its column is a gap
        shares = [nan if m is None or m[0] != column else m[1].get(value, 0.0) for m in mixtures]
        label = value if len(columns) == 1 else f"{column}={value}"
        ax.plot(versions, shares, drawstyle="steps-post", marker="o", label=label)
    ax.set_xlabel(f"snapshot (active: {dataset.version})")
    ax.set_ylabel("target share of the draws")
    if len(versions) <= PLOT_CLASSES:
        ax.set_xticks(versions)
    ax.set_ylim(bottom=0.0, top=1.05)
    if columns:
        ax.set_title(f"mixture by {', '.join(columns)} over {len(versions)} snapshots")
    else:
        ax.set_title(f"no mixture in {len(versions)} snapshots: drawn by weights alone")
    if 0 < len(groups) <= PLOT_CLASSES:
        ax.legend(fontsize="small", title="group")
    return fig
