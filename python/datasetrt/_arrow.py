"""Tables from Python into the native layer over the Arrow C stream interface."""

from __future__ import annotations

from typing import Any

import polars as pl

from .exceptions import InvalidInputError


def arrow_stream(data: Any, what: str) -> tuple[Any, list[str]]:
    """``data`` as an object with ``__arrow_c_stream__`` (a LazyFrame is
    collected), and the names of its all-null (``Null``) columns.

    Polars exports a ``Null`` column in a form the Arrow C data interface
    does not allow, so such columns travel as all-null Booleans and the
    native side restores them (see ``python/src/arrow_in.rs``).

    >>> stream, nulls = arrow_stream(pl.DataFrame({"a": [1], "b": [None]}), "example")
    >>> nulls, stream.schema["b"]
    (['b'], Boolean)
    """
    if isinstance(data, pl.LazyFrame):
        data = data.collect()
    nulls: list[str] = []
    if isinstance(data, pl.DataFrame):
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
