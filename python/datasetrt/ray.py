"""Ray Data adapter: read a dataset's draws as a ``ray.data.Dataset``, and
write caches from one (:func:`write_parts`, one cache per Ray block, which
:func:`datasetrt.build_ray` opens).

>>> rds = ds.to_ray(batch_size=256, seed=7)                 # doctest: +SKIP
>>> for batch in rds.iter_batches(batch_size=64, batch_format="pyarrow"):  # doctest: +SKIP
...     ...

Reading: the epoch's global draw sequence (the one ``ds.loader(...)`` yields
on one machine) is cut into contiguous ranges of whole loader batches; each
Ray ``ReadTask`` reads its range through the native loader (mapped shards,
checksums verified) and returns Arrow tables with the identities, the
population's metadata columns and ``data``. The Ray dataset preserves block
order, so ``iter_batches()`` yields the draws in the order of
``ds.loader(...)``. Read tasks open the dataset by recipe (paths, snapshot),
so they read the snapshot that was active when ``to_ray`` was called.

Ray is optional: this module imports it, ``import datasetrt`` does not.
"""

from __future__ import annotations

import itertools
import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import pyarrow as pa
import ray
from ray.data import Datasource, ReadTask
from ray.data.block import BlockMetadata

from . import _native
from ._build import RESERVED, metadata_frame
from ._state import check_int, check_text
from .exceptions import InvalidInputError

if TYPE_CHECKING:
    from .dataset import Dataset

#: Target size of one Ray block (decoded payloads plus metadata) a read task returns.
BLOCK_BYTES = 64 << 20


class DrawsDatasource(Datasource):
    """The draws of one epoch of a :class:`~datasetrt.Dataset` as a Ray datasource.

    Use :meth:`datasetrt.Dataset.to_ray`; ``spec`` is a request of
    :meth:`datasetrt.Dataset.loader_spec` for one process (rank 0 of 1),
    without ``resume`` or ``run``.
    """

    def __init__(self, dataset: Dataset, spec: _native.LoaderSpec):
        super().__init__()
        if not isinstance(spec, _native.LoaderSpec):
            raise InvalidInputError(f"spec must be a LoaderSpec, not {type(spec).__name__}")
        spread = {k: getattr(spec, k) for k in ("rank", "world_size", "worker", "num_workers")}
        if spread != {"rank": 0, "world_size": 1, "worker": 0, "num_workers": 1}:
            raise InvalidInputError(
                "a Ray dataset reads the whole epoch as one process (rank 0 of 1, worker 0 "
                f"of 1) and Ray splits it among its tasks; this spec has {spread}"
            )
        for name in ("resume", "run"):
            if getattr(spec, name) is not None:
                raise InvalidInputError(f"a Ray dataset reads whole epochs: it takes no {name}")
        if spec.start_block != 0:
            raise InvalidInputError("a Ray dataset reads whole epochs: leave start_block at 0")
        self.dataset = dataset
        self.version = dataset.version if spec.version is None else spec.version
        # one request, checked once here (not in a task); it travels with the
        # read tasks, each of which plans and reads its own range of blocks
        self.spec = spec.replace(version=self.version)
        plan = self.plan()
        self.epoch_len, self.blocks = plan.epoch_len, plan.blocks
        frame = dataset.get_metadata(self.version)
        self.schema = _arrow(frame.head(0), []).schema

    def plan(self, start_block: int = 0) -> Any:
        """The engine's plan of this epoch for one reader (made where it is
        used: native objects other than the spec do not travel with the tasks)."""
        return self.dataset.plan(self.spec.replace(start_block=start_block))

    def get_name(self) -> str:
        return "DatasetRT"

    def estimate_inmemory_data_size(self) -> int | None:
        return None  # payload sizes are not known without reading the index

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: int | None = None,
        data_context: Any = None,
    ) -> list[ReadTask]:
        plan = self.plan()
        tasks = max(1, min(parallelism, self.blocks))
        bounds = [self.blocks * i // tasks for i in range(tasks + 1)]
        out = []
        for first, end in itertools.pairwise(bounds):
            if first == end:
                continue
            rows = plan.block_range(end - 1)[1] - plan.block_range(first)[0]
            meta = BlockMetadata(num_rows=rows, size_bytes=None, input_files=None, exec_stats=None)
            out.append(
                ReadTask(
                    _ReadRange(self, first, end),
                    meta,
                    schema=self.schema,
                    per_task_row_limit=per_task_row_limit,
                )
            )
        return out


class _ReadRange:
    """A read task's function: loader blocks ``first .. end`` of the epoch, as
    Arrow tables of about :data:`BLOCK_BYTES` (pickled with the dataset's recipe)."""

    def __init__(self, source: DrawsDatasource, first: int, end: int):
        self.source = source
        self.first = first
        self.end = end

    def __call__(self) -> Iterator[pa.Table]:
        src = self.source
        dataset = src.dataset
        frame = dataset.get_metadata(src.version)
        count = self.end - self.first
        spec = src.spec.replace(start_block=self.first, prefetch_batches=max(1, min(4, count)))
        loader = dataset.start(spec)
        rows: list[int] = []
        datas: list[bytes] = []
        size = 0
        try:
            for _ in range(count):
                batch = next(loader)
                rows += batch.rows()
                data = batch.data()
                datas += data
                size += sum(map(len, data))
                if size >= BLOCK_BYTES:
                    yield _arrow(frame[rows], datas)
                    rows, datas, size = [], [], 0
        finally:
            del loader  # stops the read-ahead of blocks past this range
        if rows:
            yield _arrow(frame[rows], datas)


def _arrow(frame: pl.DataFrame, data: list[bytes]) -> pa.Table:
    table = frame.to_arrow(compat_level=pl.CompatLevel.oldest())
    return table.append_column("data", pa.array(data, type=pa.large_binary()))


def read_draws(
    dataset: Dataset, spec: _native.LoaderSpec, *, override_num_blocks: int | None = None
) -> ray.data.Dataset:
    """See :meth:`datasetrt.Dataset.to_ray`."""
    source = DrawsDatasource(dataset, spec)
    if override_num_blocks is not None:
        check_int(override_num_blocks, "override_num_blocks", 1)
    rds = ray.data.read_datasource(source, override_num_blocks=override_num_blocks)
    # Ray may finish read tasks out of order; the draws are a sequence.
    rds.context.execution_options.preserve_order = True
    return rds


# -- building caches from a Ray dataset ----------------------------------------


def _write_part(
    table: pa.Table,
    root: str,
    name: str,
    data_column: str,
    metadata_columns: list[str],
    spec: _native.WriterSpec,
) -> dict[str, Any]:
    """Publish one block as cache ``root/name`` (runs in a Ray task)."""
    from ._arrow import arrow_stream

    column = table.column(data_column)
    if not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
        if not pa.types.is_binary_view(column.type) and not pa.types.is_fixed_size_binary(
            column.type
        ):
            raise InvalidInputError(
                f"{name}: data column {data_column!r} has type {column.type}; it must hold "
                f"bytes (serialize the samples first, e.g. with pickle.dumps)"
            )
    if column.null_count:
        raise InvalidInputError(f"{name}: data column {data_column!r} holds nulls")
    frame = pl.DataFrame(table.select(metadata_columns)) if metadata_columns else pl.DataFrame()
    meta = metadata_frame(frame, name)
    writer = _native.CacheWriter(root, name, spec)
    try:
        writer.add_arrow(column)  # no Python object per record
        attributes, nulls = arrow_stream(meta, "build_ray()")
        return writer.finish(attributes, nulls=nulls)
    except BaseException:
        writer.abort()
        raise


def _part_names(name: str, parts: int) -> list[str]:
    return [f"{name}-{i:05d}-of-{parts:05d}" for i in range(parts)]


def _published_parts(root: Path, name: str) -> dict[int, list[str]]:
    """Published parts of ``name`` under ``root``, by the part count they were built with."""
    found: dict[int, list[str]] = {}
    prefix = f"{name}-"
    if not root.is_dir():
        return found
    for entry in root.iterdir():
        rest = entry.name[len(prefix) :] if entry.name.startswith(prefix) else ""
        index, of, parts = rest.partition("-of-")
        if of and index.isdigit() and parts.isdigit() and len(index) == len(parts) == 5:
            if _native.is_cache_dir(entry):
                found.setdefault(int(parts), []).append(entry.name)
    return found


def write_parts(
    root: str | os.PathLike[str],
    ray_dataset: ray.data.Dataset,
    *,
    name: str,
    data_column: str = "data",
    metadata_columns: Sequence[str] = (),
    spec: _native.WriterSpec | None = None,
) -> list[Path]:
    """Cache a Ray dataset under ``root``, one cache per non-empty Ray block,
    written by parallel Ray tasks; returns the cache directories, in name order.

    The work of :func:`datasetrt.build_ray` (documented there), which opens
    what this returns: this module never imports the package's ``Dataset``,
    so ``datasetrt`` and ``datasetrt.dataset`` import it in functions without
    an import cycle. If the parts of ``name`` are already published under
    ``root`` they are returned without running the Ray dataset. ``spec``
    says how each part is written (default: one compressor thread per
    task, as Ray counts a task as one CPU).
    """
    if spec is None:
        spec = _native.WriterSpec(threads=1)
    if not isinstance(name, str):
        raise InvalidInputError(f"name must be a str, got {name!r}")
    _native.check_source_name(f"{check_text(name, 'name')}-00000-of-00000")
    check_text(data_column, "data_column")
    metadata_columns = _metadata_columns(metadata_columns, data_column)
    root = Path(root)

    published = _published_parts(root, name)
    for parts, names in published.items():
        if len(names) == parts:
            return [root / n for n in sorted(names)]
    if published:
        leftovers = sorted(n for names in published.values() for n in names)
        raise InvalidInputError(
            f"{root}: only some parts of {name!r} are published ({', '.join(leftovers)}): "
            f"an earlier build_ray was stopped while moving them in; remove them or use "
            f"another name"
        )

    missing = {*metadata_columns, data_column} - set(ray_dataset.columns())
    if missing:
        raise InvalidInputError(
            f"the Ray dataset has no column {sorted(missing)[0]!r} (it has {ray_dataset.columns()})"
        )
    # Whole columns only: one Arrow table per Ray block, in block order.
    refs = ray_dataset.select_columns([data_column, *metadata_columns]).to_arrow_refs()
    sizes = ray.get([_num_rows.remote(ref) for ref in refs])
    blocks = [ref for ref, n in zip(refs, sizes, strict=True) if n]
    if not blocks:
        raise InvalidInputError(f"the Ray dataset for {name!r} has no rows")
    names = _part_names(name, len(blocks))
    root.mkdir(parents=True, exist_ok=True)
    staging = root / f".ray-{name}-{uuid.uuid4().hex[:12]}"
    staging.mkdir()
    try:
        write = ray.remote(_write_part)
        ray.get(
            [
                write.remote(
                    ref,
                    os.fspath(staging),
                    part,
                    data_column,
                    metadata_columns,
                    spec,
                )
                for ref, part in zip(blocks, names, strict=True)
            ]
        )
        for part in names:  # every part is written: move them in
            os.rename(staging / part, root / part)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [root / n for n in sorted(names)]


def _metadata_columns(metadata_columns: Sequence[str], data_column: str) -> list[str]:
    """``write_parts``' metadata columns, each checked: valid text, not
    reserved nor the data column, a name SQL can use."""
    metadata_columns = list(metadata_columns)
    for column in metadata_columns:
        check_text(column, "a metadata column")
        if column in RESERVED or column == data_column:
            raise InvalidInputError(
                f"metadata column {column!r} is reserved (cache_id, sample_id and weight are "
                f"set by DatasetRT) or is the data column"
            )
        _native.check_column_name(column)
    return metadata_columns


@ray.remote
def _num_rows(table: pa.Table) -> int:
    return table.num_rows
