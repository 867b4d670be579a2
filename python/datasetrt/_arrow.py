"""Tables from Python into the native layer over the Arrow C stream interface."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import polars as pl

from .exceptions import InvalidInputError


def _names(dtype: Any, prefix: str) -> Iterator[str]:
    """The field names nested in a polars ``dtype`` (struct fields, list items)."""
    if isinstance(dtype, pl.Struct):
        for field in dtype.fields:
            yield f"{prefix}.{field.name}" if prefix else field.name
            yield from _names(field.dtype, f"{prefix}.{field.name}")
    elif isinstance(dtype, (pl.List, pl.Array)):
        yield from _names(dtype.inner, prefix)


def _check_names(schema: pl.Schema, what: str) -> None:
    """Refuse names with control characters before polars exports the frame.

    Polars' Arrow C export panics on a NUL byte in a name (an ``unwrap`` in a
    function that cannot unwind: the process aborts), so this check must run
    before anything asks a polars object for ``__arrow_c_stream__``. Other
    control characters are refused too, as ``build`` refuses them in keys.

    >>> _check_names(pl.DataFrame({"a\\x00b": [1]}).schema, "example")
    Traceback (most recent call last):
    ...
    datasetrt.exceptions.InvalidInputError: example: column name 'a\\x00b' has control characters
    """
    for name, dtype in schema.items():
        for full in [name, *(f"{name}.{n}" for n in _names(dtype, ""))]:
            if any(ord(c) < 32 or 127 <= ord(c) < 160 for c in full):  # Rust's is_control
                error = InvalidInputError(f"{what}: column name {full!r} has control characters")
                error.column = full
                raise error


def arrow_stream(data: Any, what: str) -> tuple[Any, list[str]]:
    """``data`` as an object with ``__arrow_c_stream__`` (a LazyFrame is
    collected), and the names of its all-null (``Null``) columns.

    Polars exports a ``Null`` column in a form the Arrow C data interface
    does not allow, so such columns travel as all-null Booleans and the
    native side restores them (see ``python/src/arrow_in.rs``). Names with
    control characters are refused here, before the export (see
    :func:`_check_names`); other objects' names are checked natively.

    >>> stream, nulls = arrow_stream(pl.DataFrame({"a": [1], "b": [None]}), "example")
    >>> nulls, stream.schema["b"]
    (['b'], Boolean)
    """
    if isinstance(data, pl.LazyFrame):
        data = data.collect()
    if isinstance(data, pl.Series):
        data = data.to_frame()
    nulls: list[str] = []
    if isinstance(data, pl.DataFrame):
        _check_names(data.schema, what)
        objects = [n for n, t in data.schema.items() if t == pl.Object]
        if objects:
            raise InvalidInputError(
                f"{what}: column {objects[0]!r} holds Python objects (polars Object), which "
                f"cannot be stored; convert it to a number, string or bytes column first"
            )
        nulls = [n for n, t in data.schema.items() if t == pl.Null]
        if nulls:
            data = data.with_columns(pl.col(nulls).cast(pl.Boolean))
    if not hasattr(data, "__arrow_c_stream__"):
        raise InvalidInputError(
            f"{what} takes a polars DataFrame or LazyFrame or an object with "
            f"__arrow_c_stream__, not {type(data).__name__}"
        )
    return data, nulls


def chunks(data: Any) -> list[Any]:
    """``data`` (from :func:`arrow_stream`) as pieces to export one by one.

    Polars exports a frame as one record batch, copying a chunked frame
    into one (4 GB at 10^8 rows of five columns) before the engine cuts it
    into partitions again. A frame with a chunked column (as
    :meth:`Dataset.get_metadata` gives them: one chunk per partition) goes
    as one slice per chunk of its most chunked column: a column whose chunks
    have those boundaries, or one chunk holding them all (a new column
    polars computed whole), is exported without a copy. Anything else goes
    whole.

    >>> a = pl.DataFrame({"x": [1, 2]})
    >>> parts = pl.concat([a, a, a], rechunk=False)
    >>> [p.height for p in chunks(parts)]
    [2, 2, 2]
    >>> whole = parts.with_columns(y=pl.len().over("x"))  # y: one chunk
    >>> [p.n_chunks("all") for p in chunks(whole)]
    [[1, 1], [1, 1], [1, 1]]
    >>> [p.height for p in chunks(pl.concat([a, a], rechunk=True))]
    [4]
    """
    if not isinstance(data, pl.DataFrame) or data.width == 0:
        return [data]
    lengths = max((s.chunk_lengths() for s in data.get_columns()), key=len)
    # Halve at chunk boundaries rather than slice once per chunk: a slice
    # costs time in the number of chunks of the frame it cuts, so one slice
    # per chunk was quadratic (minutes for a pl.concat of 70,000 small
    # frames); halving costs the number of chunks once per level.
    pieces, todo = [], [(data, lengths)]
    while todo:
        frame, parts = todo.pop()
        if len(parts) < 2:
            pieces.append(frame)
            continue
        mid = len(parts) // 2
        rows = sum(parts[:mid])
        todo.append((frame.slice(rows), parts[mid:]))
        todo.append((frame.slice(0, rows), parts[:mid]))
    return pieces
