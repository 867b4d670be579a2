"""Typed records: a payload stored as named, typed arrays behind a small
header, read back as numpy arrays or torch tensors without ``pickle``.

A source yields ``CacheInput({"image": array, "label": 3}, metadata)``; the
build stores each record as this header and the fields' bytes (FORMAT.md,
"Typed records"), all little-endian::

    0..8     magic b"DRTTYPED"
    8..12    u32 version (1)
    12..16   u32 header length H (a multiple of 64; the first field starts there)
    16..18   u16 field count
    then per field, in the source's order:
             u8 name length, name (UTF-8); u8 dtype length, dtype (numpy's
             ``dtype.str``, e.g. "|u1", "<f4"); u8 ndim, ndim x u64 dims;
             u64 offset (from the record's start, a multiple of 64);
             u64 byte length
    zeros up to H, then each field's C-order bytes at its offset

Records of fixed shapes have byte-identical headers, so a batch's field is
read by checking that header once per row (a ``memcmp``) and copying the
field's bytes row after row into one array, natively and without the GIL;
when the rows lie one after another in one shard mapped in place (read in
order, stored with ``codec="none"``) the array is a read-only view of the
shard instead, with no copy at all. A record's bytes are checked against
their CRC-32C when read, like every record; a header that still does not
parse is a :class:`CorruptCacheError`.

The engine owns the format (``engine/src/store/records.rs``): it encodes a
record from its fields' bytes, parses headers and copies a field of every
row; this module checks a source's values against its fields and hands the
bytes to numpy and torch.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _native
from .exceptions import CorruptCacheError, InvalidInputError

MAGIC: bytes = _native.TYPED_MAGIC
ALIGN: int = _native.TYPED_ALIGN
# names a torch batch dict already uses for the rows' identities
RESERVED = frozenset({"data", "cache_id", "sample_id", "draw", "epoch"})


@dataclass(frozen=True)
class Field:
    """One typed field of a record: a numpy dtype (bool, integers, floats,
    complex) and a shape whose dims are ints, or ``None`` where records may
    differ (``Field("float32", (None, 80))``: any number of 80-wide frames).

    >>> Field("uint8", (3, 64, 64)).shape
    (3, 64, 64)
    """

    dtype: Any
    shape: tuple[int | None, ...] = ()

    def __post_init__(self) -> None:
        try:
            dtype = np.dtype(self.dtype)
        except TypeError as exc:
            raise InvalidInputError(
                f"Field dtype {self.dtype!r} is not a numpy dtype: {exc}"
            ) from None
        if not _plain(dtype):
            raise InvalidInputError(
                f"Field dtype {dtype} is not a plain number or bool (strings, objects and "
                f"structured dtypes are stored as metadata columns or bytes)"
            )
        shape = tuple(self.shape) if not isinstance(self.shape, int) else (self.shape,)
        for dim in shape:
            if dim is not None and (not isinstance(dim, int) or isinstance(dim, bool) or dim < 0):
                raise InvalidInputError(
                    f"Field shape {self.shape!r}: each dim is an int >= 0 or None"
                )
        if len(shape) > 255:
            raise InvalidInputError(f"Field shape has {len(shape)} dims; at most 255")
        # stored little-endian, so every reader (and torch) takes it as is
        object.__setattr__(self, "dtype", dtype.newbyteorder("<"))
        object.__setattr__(self, "shape", shape)

    @property
    def fixed(self) -> bool:
        """Whether every record's array has this one shape."""
        return None not in self.shape


def _plain(dtype: np.dtype) -> bool:
    """Whether a field may have `dtype`: a number or bool, not a structure."""
    return dtype.kind in "biufc" and dtype.fields is None and dtype.subdtype is None


def infer_fields(values: Mapping[str, Any], where: str) -> dict[str, Field]:
    """The fields of a source from its first typed record: each value's
    dtype and shape as found (a Python int is int64, a float float64)."""
    fields = {}
    for name, value in values.items():
        check_name(name, where)
        array = np.asarray(value)
        try:
            fields[name] = Field(array.dtype, array.shape)
        except InvalidInputError as exc:
            raise InvalidInputError(f"{where}: field {name!r}: {exc}") from None
    return fields


def check_fields(fields: Any, where: str) -> dict[str, Field]:
    """A source's declared ``fields``: a mapping of names to :class:`Field`
    (or ``(dtype, shape)`` pairs), checked."""
    if not isinstance(fields, Mapping) or not fields:
        raise InvalidInputError(f"{where}: fields must be a non-empty mapping of name -> Field")
    checked = {}
    for name, field in fields.items():
        check_name(name, where)
        if not isinstance(field, Field):
            try:
                field = Field(*field)
            except TypeError:
                raise InvalidInputError(
                    f"{where}: field {name!r} is {field!r}; expected a Field or (dtype, shape)"
                ) from None
        checked[name] = field
    return checked


def check_name(name: Any, where: str) -> None:
    if not isinstance(name, str) or not name:
        raise InvalidInputError(f"{where}: field name {name!r} is not a non-empty string")
    if name in RESERVED:
        raise InvalidInputError(
            f"{where}: field name {name!r} is reserved (a torch batch holds the rows' "
            f"{', '.join(sorted(RESERVED))} under those names)"
        )
    if len(name.encode("utf-8", "surrogatepass")) > 255:
        raise InvalidInputError(f"{where}: field name {name[:40]!r}... is over 255 bytes")
    try:
        name.encode()
    except UnicodeEncodeError:
        raise InvalidInputError(f"{where}: field name {name!r} is not valid text") from None


def encode(values: Any, fields: Mapping[str, Field], where: str) -> bytes:
    """One record's bytes: `values` (name -> array or number) checked
    against `fields` (every name, dtype and shape), encoded by the engine."""
    if not isinstance(values, Mapping):
        raise InvalidInputError(f"{where}: data is {type(values).__name__}; this source is typed")
    if values.keys() != fields.keys():
        missing, extra = (
            sorted(fields.keys() - values.keys()),
            sorted(values.keys() - fields.keys()),
        )
        raise InvalidInputError(
            f"{where}: fields {sorted(values)} do not match the source's {list(fields)}"
            f" (missing {missing}, unexpected {extra})"
        )
    parts = []
    for name, field in fields.items():
        array = _field_array(values[name], name, field, where)
        data = np.ascontiguousarray(array).tobytes()
        parts.append((name, field.dtype.str, list(array.shape), data))
    try:
        return _native.encode_record(parts)
    except InvalidInputError as exc:
        raise InvalidInputError(f"{where}: {exc}") from None


def _field_array(value: Any, name: str, field: Field, where: str) -> np.ndarray:
    """Field `name`'s value as an array of its declared dtype, checked
    against its declared shape."""
    if isinstance(value, (np.ndarray, np.generic)):
        if value.dtype.newbyteorder("<") != field.dtype:
            raise InvalidInputError(
                f"{where}: field {name!r} has dtype {value.dtype}, declared {field.dtype}"
            )
        array = np.asarray(value, dtype=field.dtype)
    else:
        try:
            array = np.asarray(value, dtype=field.dtype)
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidInputError(
                f"{where}: field {name!r}: {value!r:.60} is not {field.dtype}: {exc}"
            ) from None
    pairs = zip(field.shape, array.shape, strict=False)
    if len(array.shape) != len(field.shape) or any(
        want is not None and want != got for want, got in pairs
    ):
        raise InvalidInputError(
            f"{where}: field {name!r} has shape {array.shape}, declared {field.shape}"
        )
    return array


@dataclass(frozen=True)
class Layout:
    """Where a record's fields lie: name -> (dtype, shape, offset, length),
    and the header's bytes (identical in every record of the same shapes)."""

    fields: dict[str, tuple[Any, tuple[int, ...], int, int]]
    header: bytes

    @functools.cached_property
    def end(self) -> int:
        return max((o + n for _, _, o, n in self.fields.values()), default=len(self.header))


def is_typed(payload: Any) -> bool:
    """Whether `payload` (bytes or a memoryview) is a typed record."""
    return bytes(payload[:8]) == MAGIC


def parse(payload: Any, what: str, length: int | None = None) -> Layout:
    """The layout of one typed record (`what` names it in errors) from its
    bytes, or from its first bytes (its header at least) and its `length`."""
    view = memoryview(payload).cast("B")
    try:
        parsed = _native.parse_record(bytes(view), len(view) if length is None else length)
    except InvalidInputError as exc:
        raise CorruptCacheError(f"{what}: damaged typed-record header: {exc}") from None
    if parsed is None:
        raise InvalidInputError(
            f"{what} is not a typed record (its cache was built from bytes; read "
            f"batch.data or batch.views)"
        )
    header_len, fields = parsed
    return _layout(bytes(view[:header_len]), fields)


def _layout(header: bytes, fields: list[tuple[str, str, list[int], int, int]]) -> Layout:
    """A Layout of the engine's fields, numpy dtypes made once per header."""
    known = _LAYOUTS.get(header)
    if known is not None:
        return known
    out = {n: (np.dtype(d), tuple(s), o, b) for n, d, s, o, b in fields}
    layout = Layout(out, header)
    _remember(layout)
    return layout


#: Layouts parsed before, by their header's bytes: every record of a cache
#: of fixed shapes has one header, so a batch's layout is parsed once per
#: cache, not once per batch (a header's bytes decide its layout).
_LAYOUTS: dict[bytes, Layout] = {}
#: The layout of the last batch read (in a list: one reference, replaced
#: whole): a batch of the same cache is checked against its header first.
_LAST: list[Layout | None] = [None]
_LAYOUTS_KEPT = 256
_LAYOUTS_LOCK = threading.Lock()


def _remember(layout: Layout) -> None:
    with _LAYOUTS_LOCK:
        if len(_LAYOUTS) >= _LAYOUTS_KEPT:
            _LAYOUTS.pop(next(iter(_LAYOUTS)))
        _LAYOUTS[layout.header] = layout


def field_array(buffer: Any, field: tuple[Any, tuple[int, ...], int, int]) -> np.ndarray:
    """The read-only array a layout's `field` (dtype, shape, offset, length)
    places in the record `buffer`, over its bytes (no copy)."""
    dtype, shape, offset, nbytes = field
    return np.frombuffer(buffer, dtype, nbytes // dtype.itemsize, offset).reshape(shape)


class Reader:
    """The typed fields of one loader batch (what ``Batch.tensor`` and
    friends use): `native` is the batch's ``_native.Batch``."""

    __slots__ = ("_layout", "_native", "_views")

    def __init__(self, native: Any):
        self._native: _native.Batch = native
        self._views: list[memoryview] | None = None
        self._layout: Layout | None = None

    def label(self, row: int) -> str:
        """Row `row` of the batch, as errors name it."""
        return f"cache {self._native.cache_id()[row]} sample {self._native.sample_id()[row]}"

    def views(self) -> list[memoryview]:
        if self._views is None:
            self._views = self._native.views()
        return self._views

    def layout(self, row: int = 0) -> Layout:
        if row == 0 and self._layout is not None:
            return self._layout
        if row >= len(self._native):
            raise InvalidInputError("an empty batch has no fields")
        last = _LAST[0]
        native = self._native
        if row == 0 and last is not None and native.first_unlike(last.header, last.end, 1) is None:
            # row 0 has the last batch's header, and so its layout: no
            # header read or parsed (a gather checks every row's)
            self._layout = last
            return last
        try:
            parsed = self._native.payload_layout(row)
        except InvalidInputError as exc:
            raise CorruptCacheError(
                f"{self.label(row)}: damaged typed-record header: {exc}"
            ) from None
        if parsed is None:
            raise InvalidInputError(
                f"{self.label(row)} is not a typed record (its cache was built from bytes; "
                f"read batch.data or batch.views)"
            )
        layout = _layout(*parsed)
        if row == 0:
            self._layout = _LAST[0] = layout
        return layout

    def field(self, name: str, row: int = 0) -> tuple[Any, tuple[int, ...], int, int]:
        layout = self.layout(row)
        try:
            return layout.fields[name]
        except KeyError:
            raise InvalidInputError(
                f"{self.label(row)} has no field {name!r} (its fields: {list(layout.fields)})"
            ) from None

    def alike(self) -> bool:
        """Whether every row has row 0's header (and so its shapes)."""
        layout = self.layout()
        return self._native.first_unlike(layout.header, layout.end) is None

    def arrays(self, name: str) -> list[np.ndarray]:
        """One read-only array per row, over its payload (no copy)."""
        out = []
        for row, view in enumerate(self.views()):
            out.append(field_array(view, self.field(name, row)))
        return out

    def tensor(self, name: str, *, copy: bool = False, out: Any = None) -> np.ndarray:
        """The field of every row as one array (rows first): a read-only
        view of the shard when the rows lie one after another in it and
        neither `copy` nor `out` is given, else one copy into `out` (a
        C-contiguous writable array of the batch's shape and dtype, reused
        from batch to batch) or a new array."""
        dtype, shape, offset, nbytes = self.field(name)
        rows = len(self._native)
        if out is not None:
            if (
                not isinstance(out, np.ndarray)
                or out.dtype != dtype
                or out.shape != (rows, *shape)
                or not out.flags.c_contiguous
                or not out.flags.writeable
            ):
                raise InvalidInputError(
                    f"out= for field {name!r} must be a writable C-contiguous numpy array "
                    f"of shape {(rows, *shape)} and dtype {dtype}; got {_described(out)}"
                )
        elif not copy and self.alike():
            run = self._native.run()
            if run is not None:
                shard, first, stride = run
                strides = (stride, *_c_strides(shape, dtype.itemsize))
                return np.ndarray(
                    (rows, *shape), dtype, buffer=shard, offset=first + offset, strides=strides
                )
        target = np.empty((rows, *shape), dtype=dtype) if out is None else out
        if self._gather(offset, nbytes, target.ctypes.data, target.nbytes, fresh=out is None):
            return target
        if out is None:
            return self._stack(name)
        out[...] = self._stack(name)
        return out

    def torch(self, name: str, *, pin_memory: bool = False, out: Any = None) -> Any:
        """The field as one writable torch tensor (rows first), copied once
        into `out` (a contiguous CPU tensor of the batch's shape and dtype,
        reused from batch to batch: a pinned staging buffer, say) or into
        memory torch allocates (page-locked with `pin_memory`)."""
        import torch

        dtype, shape, offset, nbytes = self.field(name)
        rows = len(self._native)
        kind = _torch_dtype(dtype, name)
        size = (rows, *shape)
        if out is not None:
            if (
                not isinstance(out, torch.Tensor)
                or out.dtype != kind
                or out.shape != size
                or not out.is_contiguous()
                or not out.is_cpu
            ):
                raise InvalidInputError(
                    f"out= for field {name!r} must be a contiguous CPU torch tensor of "
                    f"shape {size} and dtype {kind}; got {_described(out)}"
                )
        elif pin_memory and not torch.cuda.is_available():
            # as torch's DataLoader does: the same code runs on a machine without one
            warnings.warn(
                "pin_memory=True but torch sees no CUDA device: the tensor is not pinned",
                stacklevel=3,
            )
            pin_memory = False
        if out is not None:
            target = out
        elif pin_memory:
            target = torch.empty(size, dtype=kind, pin_memory=True)
        else:
            target = torch.empty(size, dtype=kind)
        if self._gather(offset, nbytes, target.data_ptr(), rows * nbytes, fresh=out is None):
            return target
        stacked = torch.from_numpy(self._stack(name))
        if out is not None:
            return out.copy_(stacked)
        return stacked.pin_memory() if pin_memory else stacked

    def _gather(
        self, offset: int, nbytes: int, address: int, capacity: int, *, fresh: bool
    ) -> bool:
        """Copy the field of every row to `address`, if every row is alike
        (`fresh`: memory just allocated here, so surely writable)."""
        if capacity == 0:  # nothing to copy; alike or not decides the shape
            return self.alike()
        header = self.layout().header
        return self._native.gather_into(header, offset, nbytes, address, capacity, fresh) is None

    def _stack(self, name: str) -> np.ndarray:
        arrays = self.arrays(name)
        dtypes = {a.dtype for a in arrays}
        if len(dtypes) > 1:  # rows of two caches that name a field alike
            raise InvalidInputError(
                f"field {name!r} has {len(dtypes)} dtypes in this batch "
                f"({', '.join(sorted(map(str, dtypes)))}); read it row by row with "
                f"batch.arrays({name!r})"
            )
        shapes = {a.shape for a in arrays}
        if len(shapes) > 1:
            raise InvalidInputError(
                f"field {name!r} has {len(shapes)} shapes in this batch "
                f"({', '.join(map(str, sorted(shapes)[:4]))}...); read it row by row with "
                f"batch.arrays({name!r})"
            )
        return np.stack(arrays)


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return tuple(reversed(strides))


def _described(value: Any) -> str:
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return type(value).__name__
    return f"{type(value).__name__} of shape {tuple(shape)} and dtype {dtype}"


@functools.cache
def _torch_dtypes() -> dict[Any, Any]:
    import torch

    kinds = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32"]
    kinds += ["float64", "complex64", "complex128", "uint16", "uint32", "uint64"]
    out = {}
    for kind in kinds:
        try:
            out[np.dtype(kind).newbyteorder("<")] = torch.from_numpy(np.empty(0, kind)).dtype
        except TypeError:  # an older torch without unsigned 16-64
            pass
    return out


def _torch_dtype(dtype: Any, name: str) -> Any:
    try:
        return _torch_dtypes()[dtype]
    except KeyError:
        raise InvalidInputError(f"field {name!r}: torch has no dtype {dtype}") from None
