"""HTML views for notebooks: Dataset, Loader, Batch and Sample.

Every string that comes from data (names, values, notes, paths, plans) goes
through :func:`esc`, and every view is bounded: at most :data:`MAX_ROWS`
rows, :data:`MAX_COLUMNS` columns, :data:`MAX_CACHES` caches and
:data:`MAX_CLASSES` classes (or mixture groups) are drawn, followed by how
many were left out.
"""

from __future__ import annotations

import html
import io
import os
import pickle
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import polars as pl

from . import records

if TYPE_CHECKING:
    from .dataset import Dataset
    from .loader import Batch, Loader, Sample

MAX_ROWS = 20
MAX_COLUMNS = 40
MAX_CACHES = 10
MAX_CLASSES = 20
MAX_CELL = 80  # characters of one cell
PREVIEW_BYTES = 64  # hex preview of a payload
PICKLE_PREVIEW_BYTES = 1 << 20  # unpickle a preview only of payloads up to this size

#: Column names taken as the class of a row for the Dataset view, in this order.
LABEL_COLUMNS = ("label", "labels", "class", "target", "category", "y")

STYLE = (
    "<style>.drt td,.drt th{padding:2px 8px;text-align:left;font-size:12px}"
    ".drt .bar{display:inline-block;height:9px;vertical-align:middle}"
    ".drt .more{color:#777;font-style:italic}</style>"
)


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def cell(value: Any) -> str:
    """One value as escaped text, cut to :data:`MAX_CELL` characters."""
    if value is None:
        text = "null"
    elif isinstance(value, float):
        text = f"{value:.6g}"
    elif isinstance(value, (bytes, bytearray, memoryview)):
        text = f"{len(value)} bytes"
    else:
        text = str(value)
    if len(text) > MAX_CELL:
        text = text[: MAX_CELL - 1] + "…"
    return esc(text)


def human_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def more(left_out: int, what: str) -> str:
    return f'<div class="more">… {left_out:,} more {esc(what)}</div>' if left_out > 0 else ""


def table(header: Sequence[Any], rows: Iterable[Sequence[Any]], raw: Sequence[int] = ()) -> str:
    """An HTML table; cells are escaped except the columns listed in ``raw``
    (HTML this module made)."""
    out = ["<table><thead><tr>"]
    out += [f"<th>{esc(h)}</th>" for h in header]
    out.append("</tr></thead><tbody>")
    for row in rows:
        out.append("<tr>")
        out += [f"<td>{v if i in raw else cell(v)}</td>" for i, v in enumerate(row)]
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def frame_table(frame: pl.DataFrame, extra: dict[str, list[Any]] | None = None) -> str:
    """The first rows and columns of ``frame`` (plus ``extra`` columns), bounded."""
    columns = frame.columns[:MAX_COLUMNS]
    head = frame.head(MAX_ROWS).select(columns)
    header = [f"{c}: {frame.schema[c]}" for c in columns]
    rows = [list(r) for r in head.iter_rows()]
    for name, values in (extra or {}).items():
        header.append(name)
        for r, v in zip(rows, values, strict=False):
            r.append(v)
    return (
        table(header, rows)
        + more(frame.height - head.height, "rows")
        + more(frame.width - len(columns), "columns")
    )


def bar(share: float, color: str) -> str:
    width = max(0.0, min(1.0, share)) * 120
    return f'<span class="bar" style="width:{width:.1f}px;background:{color}"></span> {share:.1%}'


def page(title: str, body: str) -> str:
    return f'{STYLE}<div class="drt"><b>{esc(title)}</b>{body}</div>'


def _cache_bytes(path: Any) -> int | None:
    try:
        return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())
    except (OSError, TypeError):
        return None


def label_column(columns: Sequence[str]) -> str | None:
    lowered = {c.lower(): c for c in columns}
    return next((lowered[n] for n in LABEL_COLUMNS if n in lowered), None)


def mixture_view(ds: Dataset) -> tuple[list[tuple[str, str]], str]:
    """Lines for the snapshot table and the table of the active snapshot's
    mixture: target and delivered share per group (none without a mixture)."""
    from .population import DELIVERED_DRAWS, population

    mix = ds.mixture()
    if mix is None:
        return [("rows (draws per epoch)", f"{len(ds):,}")], ""
    column = mix["column"][0]
    rep = population(ds, column)
    draws = round(rep["draws_per_epoch"].sum())
    counted = min(draws, DELIVERED_DRAWS)
    top = rep.sort(
        ["target_share", "rows"], descending=True, nulls_last=True, maintain_order=True
    ).head(MAX_CLASSES)
    rows = [
        (
            r[column],
            "—" if r["target_share"] is None else bar(r["target_share"], "#5a8"),
            bar(r["delivered_share"], "#e83"),
            f"{r['rows']:,}",
        )
        for r in top.iter_rows(named=True)
    ]
    lines = [("rows", f"{len(ds):,}"), ("draws per epoch", f"{draws:,}")]
    body = (
        f"<div>mixture by <code>{esc(column)}</code>: target share of the draws, and the "
        f"share delivered in the first {counted:,} draws of epoch 0 (seed 0)</div>"
        + table(("group", "target share", "delivered share", "rows"), rows, raw=(1, 2))
        + more(rep.height - top.height, "groups")
    )
    return lines, body


def dataset(ds: Dataset, by: str | None = None) -> str:
    from .population import population

    caches = ds.caches
    shown = caches[:MAX_CACHES]
    cache_rows = [
        (
            c["name"],
            c["cache_id"],
            f"{c['records']:,}",
            human_bytes(_cache_bytes(c["path"])),
            c["codec"],
        )
        for c in shown
    ]
    version = ds.version
    history = ds.history().filter(pl.col("version") == version)
    note = history["note"][0] if history.height else None
    tags = sorted(t for t, n in ds.tags().items() if n == version)
    meta = ds.get_metadata()
    sizes, mixture = mixture_view(ds)
    snapshot = [
        *sizes,
        ("snapshot", version if version == ds.head else f"{version} (head: {ds.head})"),
        ("tags", ", ".join(tags) or "—"),
        ("fingerprint", ds.fingerprint),
        ("note", note or "—"),
    ]
    columns = meta.columns[:MAX_COLUMNS]
    body = [
        f"<div>{len(caches):,} cache{'s' if len(caches) != 1 else ''}, "
        f"{sum(c['records'] for c in caches):,} stored records</div>",
        table(("", ""), snapshot),
        table(("cache", "cache_id", "records", "bytes", "codec"), cache_rows),
        more(len(caches) - len(shown), "caches"),
        "<div>columns: "
        + ", ".join(f"<code>{esc(c)}</code>: {esc(meta.schema[c])}" for c in columns)
        + "</div>",
        more(meta.width - len(columns), "columns"),
        mixture,
    ]
    key = by if by is not None else label_column(meta.columns)
    if key is not None and key in meta.columns:
        rep = population(ds, key)
        whole = population(ds, []).row(0, named=True)
        top = rep.sort("rows", descending=True).head(MAX_CLASSES)
        rows = [
            (r[key], f"{r['rows']:,}", bar(r["row_share"], "#9ab"), bar(r["draw_share"], "#e83"))
            for r in top.iter_rows(named=True)
        ]
        ratio = whole["max_weight_ratio"]
        body += [
            f"<div>by <code>{esc(key)}</code>: effective sample size "
            f"{whole['ess']:,.1f} of {whole['rows']:,} rows"
            + ("" if ratio is None else f"; largest/smallest weight {ratio:,.3g}")
            + "</div>",
            table((key, "rows", "share of rows", "share of draws"), rows, raw=(2, 3)),
            more(rep.height - top.height, "classes"),
        ]
    return page("datasetrt.Dataset", "".join(body))


def loader(ld: Loader) -> str:
    settings = [(k, v) for k, v in ld.state_dict().items() if k not in ("format", "version")]
    plan = f"<pre>{esc(ld.explain())}</pre>"
    return page("datasetrt.Loader", table(("setting", "value"), settings) + plan)


def batch(b: Batch) -> str:
    sizes = [f"{len(d):,}" for d in b.data[:MAX_ROWS]]
    body = f"<div>{len(b):,} samples</div>" + frame_table(b.metadata, {"payload bytes": sizes})
    return page("datasetrt.Batch", body)


class _Restricted(pickle.Unpickler):
    """Unpickles builtins and numpy arrays only: a preview never runs code
    from the payload."""

    ALLOWED = frozenset(
        [
            ("builtins", "set"),
            ("builtins", "frozenset"),
            ("builtins", "complex"),
            ("builtins", "bytearray"),
            ("builtins", "slice"),
            ("collections", "OrderedDict"),
            ("codecs", "encode"),
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy.core.multiarray", "scalar"),
            ("numpy._core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "scalar"),
            ("numpy._core.numeric", "_frombuffer"),
            ("numpy.core.numeric", "_frombuffer"),
        ]
    )

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED or module.split(".")[0] not in (
            "builtins",
            "collections",
            "codecs",
            *(("numpy",) if "numpy" in sys.modules else ()),
        ):
            raise pickle.UnpicklingError(f"{module}.{name} is not previewed")
        return super().find_class(module, name)


def pickle_preview(data: bytes) -> str | None:
    """``repr`` of the unpickled payload, when it is a small pickle of plain data."""
    if len(data) > PICKLE_PREVIEW_BYTES or not data.startswith(b"\x80"):
        return None
    try:
        return repr(_Restricted(io.BytesIO(data)).load())
    except Exception:  # not a pickle, or one of other types: no preview
        return None


def typed_preview(s: Sample) -> str:
    """Each field of a typed record: its dtype, shape and first values."""
    try:
        fields = s.fields()
    except Exception as exc:  # a damaged header: the repr still shows the rest
        return f"unreadable: {exc}"
    parts = []
    for name, array in fields.items():
        values = ", ".join(map(str, array.ravel()[:6])) + (" …" if array.size > 6 else "")
        parts.append(f"{name}: {array.dtype}{list(array.shape)} [{values}]")
    return "; ".join(parts)


def sample(s: Sample) -> str:
    data = s.data
    hexed = data[:PREVIEW_BYTES].hex(" ") + (" …" if len(data) > PREVIEW_BYTES else "")
    rows = [
        ("cache_id", cell(s.cache_id)),
        ("sample_id", cell(s.sample_id)),
        ("payload", f"{len(data):,} bytes"),
        ("hex", f"<code>{esc(hexed)}</code>"),
    ]
    preview = pickle_preview(data)
    if preview is not None:
        cut = preview[:400] + ("…" if len(preview) > 400 else "")
        rows.append(("pickle", f"<code>{esc(cut)}</code>"))
    elif records.is_typed(data):
        rows.append(("fields", f"<code>{esc(typed_preview(s))}</code>"))
    body = table(("", ""), rows, raw=(1,))
    metadata = s.metadata
    if metadata is None:
        body += "<div>not in the population it was read from</div>"
    else:
        items = list(metadata.items())
        body += table(("column", "value"), items[:MAX_COLUMNS]) + more(
            len(items) - MAX_COLUMNS, "columns"
        )
    return page("datasetrt.Sample", body)


class HtmlRepr:
    """``_repr_html_`` and ``_repr_mimebundle_`` from a class's ``to_html()``."""

    __slots__ = ()

    def to_html(self) -> str:
        raise NotImplementedError

    def _repr_html_(self) -> str:
        return self.to_html()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": repr(self), "text/html": self.to_html()}
