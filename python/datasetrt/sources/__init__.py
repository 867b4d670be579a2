"""Sources for :func:`datasetrt.build` over data where it already lives.

A *table source* is an object with a ``name`` and a ``tables()`` method that
yields polars DataFrames (or any object with ``__arrow_c_stream__``): the
column ``data_column`` (default ``"data"``) holds each sample's bytes, which
go to the engine's writer as Arrow, with no Python object per record; the
other columns become the sample's metadata (integers, floats, bool, str,
bytes). ``build`` takes one like any source: its name decides reuse,
so the same files under the same name give the same cache, built once.
A source whose ``read_ahead`` is ``True`` (every one here) is read on a
thread of its own, ahead of the writer: its generator must not change a
table it has yielded, nor depend on the thread it runs on.

Here: :class:`Parquet` (files), :class:`WebDataset` (tar shards),
:class:`MDS` (MosaicML Streaming shards), :class:`HuggingFace` (a
``datasets`` dataset's Arrow files), :class:`Lance` (a dataset at one
version).

One module per format: ``parquet.py`` (:class:`Parquet`),
``webdataset.py`` (:class:`WebDataset` and its tar readers), ``mds.py``
(:class:`MDS`), ``huggingface.py`` (:class:`HuggingFace`), ``lance.py``
(:class:`Lance`); ``_common.py`` holds what several of them share
(:data:`BATCH_BYTES`, ``PathLike``, globs, the error naming a file).

>>> src = drt.sources.Parquet("shards/*.parquet", name="img-v1")  # doctest: +SKIP
>>> ds = drt.build("cache", [src])                               # doctest: +SKIP
"""

from __future__ import annotations

from ._common import BATCH_BYTES, PathLike
from .huggingface import HuggingFace
from .lance import Lance
from .mds import MDS
from .parquet import Parquet
from .webdataset import WebDataset

__all__ = ["BATCH_BYTES", "MDS", "HuggingFace", "Lance", "Parquet", "PathLike", "WebDataset"]
